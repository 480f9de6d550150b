"""Adding a geometry takes its math, its registry entry and a recipe: a toy geometry registered here,
and nothing else changed, trains, evaluates and reports through the CLI."""

import json

import pytest
from typer.testing import CliRunner

from euclip_cli.cli.main import app
from euclip_cli.geometry import facts as F
from euclip_cli.geometry import registry, sphere
from tests.plugins import installed_plugin

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


PLUGIN = '''"""A toy geometry in a package of its own: twice the cosine of unit vectors."""
from euclip_cli.geometry import facts as F
from euclip_cli.geometry import registry, sphere


@registry.register
class HalvedCosine(registry.Geometry):
    facts = F.GeometryFacts("toy-halved-cosine", ("half-cos",), root="mean")

    def embed(self, features, log_scale=None):
        return sphere.normalize(features)

    def project(self, z):
        return sphere.normalize(z)

    def similarity(self, x, y, curv=None):
        return 0.5 * sphere.cosine(x, y)

    def distance_to_root(self, z, root, curv=None):
        return sphere.arc_distance(z, sphere.normalize(root)[None]).squeeze(-1)
'''


@pytest.mark.slow
def test_a_geometry_from_a_package_of_its_own_works_in_fresh_euclip_processes(world, tmp_path):
    """As docs/geometries.md tells a user: a module that registers the class, named under the
    ``euclip.geometries`` entry point of its distribution; nothing in euclip changes."""
    import subprocess
    import sys

    env = installed_plugin(tmp_path / "site", "toy_halved", PLUGIN, "euclip.geometries")
    recipe = tmp_path / "tiny-halved.toml"
    recipe.write_text(f'extends = "tiny-clip"\n[geometry]\nname = "toy-halved-cosine"\n[data]\n'
                      f'train_dir = "{world / "train"}"\nbatch_size = 32\nshuffle_buffer = 100\n'
                      f'[optim]\nsamples = 64\nwarmup_steps = 1\n[train]\nprecision = "fp32"\ntensorboard = false\n')
    runs = tmp_path / "runs"

    def euclip(*args):
        done = subprocess.run([sys.executable, "-m", "euclip_cli", *args], env=env, capture_output=True, text=True,
                              cwd=tmp_path, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    assert "ok" in euclip("recipes", "validate", str(recipe)).lower()
    euclip("train", "--recipe", str(recipe), "--name", "halved", "--runs-dir", str(runs))
    euclip("eval", str(runs / "halved"), "--tasks", "world/shapes", "--world", str(world))
    euclip("report", "--table", "embedded", "--runs-dir", str(runs), "--out", str(tmp_path / "t"))
    assert "toy-halved-cosine" in (tmp_path / "t" / "embedded.md").read_text()
    # Without the package the same recipe is refused, naming the geometries there are.
    done = subprocess.run([sys.executable, "-m", "euclip_cli", "recipes", "validate", str(recipe)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 2 and "toy-halved-cosine" in done.stdout + done.stderr
