"""Adding a geometry takes its math, its registry entry and a recipe: a toy geometry registered here,
and nothing else changed, trains, evaluates and reports through the CLI."""

import json

import pytest
from typer.testing import CliRunner

from euclip_cli.cli import app
from euclip_cli.geometry import facts as F
from euclip_cli.geometry import registry, sphere

runner = CliRunner()


class DoubledCosine(registry.Geometry):
    """Twice the cosine of unit vectors: CLIP's ordering with another scale, a stand-in for a new geometry."""

    facts = F.GeometryFacts("toy-doubled-cosine", ("twice-cos",), root="mean")

    def embed(self, features, log_scale=None):
        return sphere.normalize(features)

    def project(self, z):
        return sphere.normalize(z)

    def similarity(self, x, y, curv=None):
        return 2 * sphere.cosine(x, y)

    def distance_to_root(self, z, root, curv=None):
        return sphere.arc_distance(z, sphere.normalize(root)[None]).squeeze(-1)


@pytest.fixture
def toy(monkeypatch):
    # Registered on copies of both registries, so the geometry disappears after the test.
    monkeypatch.setattr(F, "_FACTS", dict(F._FACTS))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry.register(DoubledCosine)
    return DoubledCosine.facts.name


@pytest.mark.slow
def test_a_toy_geometry_trains_evaluates_and_reports(toy, world, tmp_path):
    runs = tmp_path / "runs"
    overrides = [f"geometry.name={toy}", "geometry.logit=twice-cos", f"data.train_dir={world / 'train'}",
                 "data.batch_size=32", "optim.samples=64", "optim.warmup_steps=1", "train.precision=fp32",
                 "train.tensorboard=false", "data.shuffle_buffer=100"]
    trained = runner.invoke(app, ["train", "--recipe", "tiny-clip", *overrides, "--name", "toy", "--runs-dir", str(runs)])
    assert trained.exit_code == 0, trained.output
    evaluated = runner.invoke(app, ["eval", str(runs / "toy"), "--tasks", "world/shapes", "--world", str(world)])
    assert evaluated.exit_code == 0, evaluated.output
    line = json.loads((runs / "toy" / "eval.jsonl").read_text())
    assert 0 <= line["metrics"]["acc1"] <= 1
    reported = runner.invoke(app, ["report", "--table", "embedded", "--runs-dir", str(runs), "--out", str(tmp_path / "t")])
    assert reported.exit_code == 0, reported.output
    assert "toy-doubled-cosine" in (tmp_path / "t" / "embedded.md").read_text()


def test_a_toy_geometry_is_validated_like_the_built_in_ones(toy):
    from euclip_cli import config as C
    from euclip_cli.errors import UsageError

    cfg = C.load_config("tiny-clip", [f"geometry.name={toy}"])
    assert C.resolved_logit(cfg) == "twice-cos"
    with pytest.raises(UsageError, match="not a logit of geometry 'toy-doubled-cosine'"):
        C.load_config("tiny-clip", [f"geometry.name={toy}", "geometry.logit=d2"])
    with pytest.raises(UsageError, match="has no entailment loss"):
        C.load_config("tiny-clip", [f"geometry.name={toy}", "loss.entail_weight=0.1"])
