"""Zero-shot scoring, aggregation and resumable results."""

import json
import math

import pytest
import torch

from euclip_cli.errors import UsageError
from euclip_cli.protocol.aggregate import aggregate
from euclip_cli.protocol.tasks import TASKS, averaged, list_tasks, select
from euclip_cli.evaluate.zeroshot import classification_metrics, retrieval_metrics
from euclip_cli.geometry import get_geometry, list_geometries
from tests.wdsfixtures import with_metadata

CURV = torch.tensor(1.0)


def stub_embeddings(g, n_classes=6, per_class=20, dim=16, noise=0.6, seed=0):
    """Each class is a fixed direction; images are that direction plus noise, embedded by the geometry."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(n_classes, dim, generator=gen) * 2
    targets = torch.arange(n_classes).repeat_interleave(per_class)
    images = centres[targets] + noise * torch.randn(len(targets), dim, generator=gen)
    templates = centres[:, None] + 0.3 * torch.randn(n_classes, 3, dim, generator=gen)
    scale = torch.tensor(-0.5 * math.log(dim)) if g.learned_scales else None
    img = g.embed(images, scale)
    txt = g.embed(templates.reshape(-1, dim), scale).reshape(n_classes, 3, dim)
    return img, txt, targets


@pytest.mark.parametrize("name", list_geometries())
def test_classification_metrics_match_an_independent_computation(name):
    g = get_geometry(name, blocks=4)
    img, txt, targets = stub_embeddings(g)
    protos = g.prototypes(txt)
    hits = {}
    metrics = classification_metrics(g, img, protos, targets, CURV, hits=hits)
    scores = g.similarity(img, protos, CURV)
    # Independent: full argsort per image, rank of the true class.
    ranks = [(scores[i].argsort(descending=True) == targets[i]).nonzero().item() for i in range(len(targets))]
    acc1 = sum(r == 0 for r in ranks) / len(ranks)
    acc5 = sum(r < 5 for r in ranks) / len(ranks)
    preds = scores.argmax(1)
    recall = sum(((preds == c) & (targets == c)).sum().item() / (targets == c).sum().item() for c in range(6)) / 6
    assert metrics["acc1"] == pytest.approx(acc1)
    assert metrics["acc5"] == pytest.approx(acc5)
    assert metrics["mean_per_class_recall"] == pytest.approx(recall)
    assert metrics["acc1"] > 0.5  # the stub is separable: the geometry's rule must find it
    assert hits["acc1"].tolist() == [r == 0 for r in ranks]


def test_acc5_is_null_under_five_classes():
    g = get_geometry("clip")
    img, txt, targets = stub_embeddings(g, n_classes=4)
    assert classification_metrics(g, img, g.prototypes(txt), targets)["acc5"] is None


def test_clip_logits_follow_clip_benchmarks_cosine_rule():
    g = get_geometry("clip")
    raw_img, raw_txt = torch.randn(10, 16), torch.randn(4, 5, 16)
    img = g.embed(raw_img)
    protos = g.prototypes(g.embed(raw_txt.reshape(-1, 16)).reshape(4, 5, 16))
    # clip-benchmark's zero_shot_classifier: normalize each template, mean, normalize; logits = img @ W.
    w = torch.nn.functional.normalize(torch.nn.functional.normalize(raw_txt, dim=-1).mean(1), dim=-1)
    torch.testing.assert_close(g.similarity(img, protos), torch.nn.functional.normalize(raw_img, dim=-1) @ w.T)


@pytest.mark.parametrize("name", list_geometries())
def test_retrieval_metrics_match_an_independent_computation(name):
    g = get_geometry(name, blocks=4)
    img, txt, _ = stub_embeddings(g, n_classes=8, per_class=1, noise=0.8, seed=3)
    captions = txt.reshape(-1, txt.shape[-1])  # 3 captions per image
    owner = torch.arange(8).repeat_interleave(3)
    hits = {}
    m = retrieval_metrics(g, img, captions, owner, CURV, hits=hits)
    s = g.similarity(captions, img, CURV)
    for k in (1, 5):
        t2i = sum(owner[i].item() in s[i].topk(k).indices.tolist() for i in range(len(owner))) / len(owner)
        i2t = sum(bool(set(s[:, j].topk(k).indices.tolist()) & set((owner == j).nonzero().flatten().tolist()))
                  for j in range(8)) / 8
        assert m[f"image_retrieval_recall@{k}"] == pytest.approx(t2i)
        assert m[f"text_retrieval_recall@{k}"] == pytest.approx(i2t)
    assert m["mean_recall@1"] == pytest.approx((m["image_retrieval_recall@1"] + m["text_retrieval_recall@1"]) / 2)
    assert hits["image_retrieval_recall@1"].tolist() == [s[i].argmax().item() == owner[i].item() for i in range(24)]
    assert hits["text_retrieval_recall@1"].tolist() == [owner[s[:, j].argmax()].item() == j for j in range(8)]


def test_registry_has_datacomps_forty_tasks_and_the_worlds():
    datacomp = list_tasks("datacomp")
    assert len(datacomp) == 40 and sum(t.main_metric is not None for t in datacomp) == 38
    groups = {g: sum(t.group == g for t in datacomp) for g in ("main", "shifts", "attributes", "retrieval")}
    assert groups == {"main": 1, "shifts": 6, "attributes": 13, "retrieval": 3}
    world = list_tasks("world")
    # Ten tasks in DataComp's four groups, and the hard negatives outside them and outside the average.
    assert {t.group for t in world if t.key != "world/hard-negatives"} == {"main", "shifts", "attributes", "retrieval"}
    assert len(world) == 11 and [t.key for t in averaged("world")] == [t.key for t in world][:10]
    assert TASKS["world/hard-negatives"].group is None and TASKS["world/hard-negatives"].main_metric == "acc"
    assert [t.key for t in select("world:shifts")] == ["world/shapes-outline", "world/shapes-palette", "world/shapes-clutter"]
    with pytest.raises(UsageError, match="unknown task"):
        select("imagenet2k")


def test_aggregation_of_a_forty_line_results_file():
    lines, expected = [], {"main": [], "shifts": [], "attributes": [], "retrieval": [], "all": []}
    for i, task in enumerate(list_tasks("datacomp")):
        value = None if task.main_metric is None else (i + 1) / 100
        lines.append({"key": task.key, "dataset": task.name, "metrics": {"main_metric": value}})
        if value is not None:
            expected["all"].append(value)
            if task.group:
                expected[task.group].append(value)
    agg = aggregate(lines, "datacomp")
    for group in ("main", "shifts", "attributes", "retrieval"):
        assert agg[group] == pytest.approx(sum(expected[group]) / len(expected[group]))
    assert agg["average"] == pytest.approx(sum(expected["all"]) / 38)
    assert agg["tasks_done"] == agg["tasks_total"] == 38  # FairFace and UTKFace dropped
    assert aggregate(lines[:-5], "datacomp")["average"] is None  # incomplete: no misleading mean


def test_datacomp_data_folders_follow_download_evalsets():
    from pathlib import Path

    root = Path("data/eval")
    assert TASKS["vtab/caltech101"].data_dir(root, Path("w")) == root / "wds_vtab-caltech101_test"
    assert TASKS["fairness/dollar_street"].data_dir(root, Path("w")) == root / "wds_dollar_street_test"
    assert TASKS["world/count"].data_dir(root, Path("w")) == Path("w/eval/count")


def by_hand_worst(values, groups):
    means = {}
    for g in set(groups):
        members = [v for v, gg in zip(values, groups) if gg == g]
        means[g] = sum(members) / len(members)
    return min(means.values())


def test_wilds_and_fairness_metrics_match_an_independent_computation():
    from euclip_cli.evaluate.zeroshot import wilds_metrics

    gen = torch.Generator().manual_seed(0)
    n = 200
    targets = torch.randint(0, 7, (n,), generator=gen)
    topk = torch.stack([torch.randperm(7, generator=gen)[:5] for _ in range(n)])
    topk[:80, 0] = targets[:80]  # some right answers
    metadata = torch.randint(0, 4, (n, 3), generator=gen)
    pred, t, m = topk[:, 0].tolist(), targets.tolist(), metadata.tolist()
    hit = [float(p == y) for p, y in zip(pred, t)]
    hit5 = [float(y in row) for row, y in zip(topk.tolist(), t)]

    f1s = []
    for c in sorted(set(t)):  # macro-F1 over the labels present in the targets only
        tp = sum(p == c and y == c for p, y in zip(pred, t))
        fp = sum(p == c and y != c for p, y in zip(pred, t))
        fn = sum(p != c and y == c for p, y in zip(pred, t))
        f1s.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    assert wilds_metrics("wilds/iwildcam", topk, targets, metadata)["F1-macro_all"] == pytest.approx(sum(f1s) / len(f1s))
    fmow = wilds_metrics("wilds/fmow", topk, targets, metadata)
    assert fmow["acc_worst_region"] == pytest.approx(by_hand_worst(hit, [r[0] for r in m]))
    assert fmow["acc_worst_year"] == pytest.approx(by_hand_worst(hit, [r[1] for r in m]))
    assert wilds_metrics("wilds/camelyon17", topk, targets, metadata)["acc_wg"] == pytest.approx(
        by_hand_worst(hit, [r[1] for r in m]))
    assert wilds_metrics("fairness/dollar_street", topk, targets, metadata)["acc_top5_wg"] == pytest.approx(
        by_hand_worst(hit5, [r[0] for r in m]))
    assert wilds_metrics("fairness/geode", topk, targets, metadata)["acc_wg"] == pytest.approx(
        by_hand_worst(hit, [r[0] for r in m]))


def test_a_wilds_task_reads_its_metadata_in_image_order(world, tmp_path):
    from euclip_cli import config as C
    from euclip_cli.evaluate.runner import evaluate_task, read_metadata
    from euclip_cli.model import EuclipModel

    source = world / "eval" / "shapes"
    fmow = tmp_path / "wds_wilds-fmow_test"
    with_metadata(source, fmow, lambda label: [label % 3, label % 2, label])
    labels, metadata = read_metadata(fmow)
    assert metadata.shape == (len(labels), 3) and torch.equal(metadata[:, 2], labels)
    assert torch.equal(metadata[:, 0], labels % 3)

    cfg = C.load_config("tiny-clip")
    torch.manual_seed(0)
    model = EuclipModel(cfg).eval()
    metrics = evaluate_task(model, cfg, TASKS["wilds/fmow"], fmow, torch.device("cpu"), 64)
    assert metrics["acc_avg"] == pytest.approx(metrics["acc1"])
    # The worst group's accuracy never exceeds the overall mean, which weighs every group's.
    assert metrics["acc_worst_region"] <= metrics["acc1"] + 1e-9 and metrics["acc_worst_year"] <= metrics["acc1"] + 1e-9


def test_an_openclip_checkpoint_is_evaluated_as_a_clip_run(world, tmp_path):
    import json as _json

    import open_clip
    from typer.testing import CliRunner

    from euclip_cli import config as C
    from euclip_cli.cli.main import app
    from euclip_cli.evaluate.runner import evaluate_task
    from euclip_cli.model import EuclipModel
    from euclip_cli.towers.archs import ARCHS

    # A stand-in for a published checkpoint: an open_clip model config and a weights file.
    (tmp_path / "euclip-test-vit.json").write_text(_json.dumps(ARCHS["tiny-vit"].open_clip_config()))
    open_clip.add_model_config(tmp_path / "euclip-test-vit.json")
    torch.manual_seed(3)
    clip = open_clip.create_model("euclip-test-vit")
    torch.save(clip.state_dict(), tmp_path / "weights.pt")

    runs = tmp_path / "runs"
    result = CliRunner().invoke(app, ["eval", "--openclip", f"euclip-test-vit:{tmp_path / 'weights.pt'}",
                                      "--tasks", "world/shapes", "--world", str(world), "--runs-dir", str(runs)])
    assert result.exit_code == 0, result.output
    line = _json.loads((runs / "openclip-euclip-test-vit-weights" / "eval.jsonl").read_text().splitlines()[0])

    cfg = C.load_config(None, ["model.arch=tiny-vit"])
    direct = evaluate_task(EuclipModel(cfg, clip=clip).eval(), cfg, TASKS["world/shapes"], world / "eval" / "shapes",
                           torch.device("cpu"), 64)
    assert line["metrics"]["acc1"] == pytest.approx(direct["acc1"])
    assert line["metrics"]["mean_per_class_recall"] == pytest.approx(direct["mean_per_class_recall"])

    missing = CliRunner().invoke(app, ["eval", "--openclip", "no-such-arch:x", "--runs-dir", str(runs)])
    assert missing.exit_code == 2 and "no-such-arch" in missing.output and "Traceback" not in missing.output


@pytest.mark.parametrize("name", list_geometries())
def test_winogavil_jaccard_matches_an_independent_computation(name):
    from euclip_cli.evaluate.zeroshot import winogavil_metrics

    g = get_geometry(name, blocks=4)
    img, txt, _ = stub_embeddings(g, n_classes=12, per_class=1, noise=0.5, seed=5)
    cues = txt[:, 0]
    gen = torch.Generator().manual_seed(1)
    sizes = [5, 6, 10, 12, 12, 10]
    candidates, truths, expected = [], [], {}
    for i, n in enumerate(sizes):
        chosen = torch.randperm(12, generator=gen)[:n]
        truth = set(torch.randperm(n, generator=gen)[:2 + i % 3].tolist())
        candidates.append(img[chosen])
        truths.append(truth)
        s = g.similarity(cues[i][None], img[chosen], CURV)[0].tolist()
        ranked = sorted(range(n), key=lambda j: -s[j])[:len(truth)]  # top-|truth| by hand
        expected.setdefault(n, []).append(len(set(ranked) & truth) / len(set(ranked) | truth))
    m = winogavil_metrics(g, cues[:len(sizes)], candidates, truths, CURV)
    mean = lambda xs: sum(xs) / len(xs)
    assert m["jaccard_score_10-12"] == pytest.approx(mean(expected[10] + expected[12]))
    assert m["jaccard_score_5-6"] == pytest.approx(mean(expected[5] + expected[6]))
    assert m["avg_jaccard_score"] == pytest.approx(mean([v for vs in expected.values() for v in vs]))


def test_an_interrupted_evaluation_resumes_without_duplicating_or_losing_a_line(world, tmp_path, monkeypatch):
    from euclip_cli import config as C
    from euclip_cli.evaluate import runner as R
    from euclip_cli.train import loop

    cfg = C.load_config("tiny-clip", [f"data.train_dir={world / 'train'}", "optim.samples=32", "data.batch_size=16",
                                      "train.precision=fp32", "train.tensorboard=false", "data.shuffle_buffer=50"])
    loop.run(cfg, tmp_path / "run")
    tasks = select("world:shifts") + select("world:attributes")
    real, calls = R.evaluate_task, {"n": 0}

    def dies_on_the_third(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # Ctrl-C, or a preempted job, mid-evaluation
        return real(*args, **kwargs)

    monkeypatch.setattr(R, "evaluate_task", dies_on_the_third)
    with pytest.raises(KeyboardInterrupt):
        R.evaluate_run(tmp_path / "run", torch.device("cpu"), tasks, world=world)
    out = tmp_path / "run" / "eval.jsonl"
    with out.open("a") as f:
        f.write('{"key": "world/count", "metr')  # a line cut short by a crash mid-write
    monkeypatch.setattr(R, "evaluate_task", real)
    R.evaluate_run(tmp_path / "run", torch.device("cpu"), tasks, world=world)
    keys = [json.loads(line)["key"] for line in out.read_text().splitlines() if line.endswith("}")]
    assert sorted(keys) == sorted(t.key for t in tasks)  # each task exactly once


def test_again_scores_the_tasks_once_more_from_the_cached_features(world, tmp_path, monkeypatch):
    """Lines of an older euclip lack the per-example outcomes; ``--again`` writes new ones without embedding
    the images again."""
    from typer.testing import CliRunner

    from euclip_cli import config as C
    from euclip_cli.cli.main import app
    from euclip_cli.evaluate import runner as R
    from euclip_cli.protocol.hits import unpack_hits
    from euclip_cli.train import loop

    loop.run(C.load_config("tiny-clip", [f"data.train_dir={world / 'train'}", "optim.samples=32", "data.batch_size=16",
                                         "train.precision=fp32", "train.tensorboard=false", "data.shuffle_buffer=50"]),
             tmp_path / "run")
    cli = CliRunner()
    args = ["eval", str(tmp_path / "run"), "--tasks", "world/shapes,world/retrieval", "--world", str(world)]
    assert cli.invoke(app, args).exit_code == 0
    out = tmp_path / "run" / "eval.jsonl"
    first = [json.loads(line) for line in out.read_text().splitlines()]
    assert cli.invoke(app, args).exit_code == 0 and len(out.read_text().splitlines()) == 2  # nothing to do
    embedded = []
    monkeypatch.setattr(R, "embed_images", lambda *a, **k: embedded.append(1) or pytest.fail("embedded again"))
    result = cli.invoke(app, [*args, "--again"])
    assert result.exit_code == 0, result.output
    again = [json.loads(line) for line in out.read_text().splitlines()][2:]
    assert [line["key"] for line in again] == ["world/shapes", "world/retrieval"] and not embedded
    assert [line["metrics"] for line in again] == [line["metrics"] for line in first]
    shapes = again[0]
    assert sum(unpack_hits(shapes["hits"]["acc1"])) / shapes["hits"]["acc1"]["n"] == pytest.approx(shapes["metrics"]["acc1"])


def test_another_world_is_scored_again_and_its_image_features_are_its_own(world, tmp_path, monkeypatch):
    """``eval RUN --world OTHER``: a world of other settings shares task names, not images; its scores are
    not the first world's, and neither are its cached features."""
    import shutil

    from euclip_cli.worlddir import WorldDir
    from euclip_cli.evaluate import runner as R
    from tests.test_export import make_run

    run = make_run(tmp_path / "runs", "tiny-clip")
    other = tmp_path / "other"
    shutil.copytree(world, other)
    manifest = json.loads((other / "manifest.json").read_text())
    (other / "manifest.json").write_text(json.dumps(manifest | {"object_scale": 0.5}))  # another world's identity
    tasks = select("world/shapes")
    seen = []
    R.evaluate_run(run.path, torch.device("cpu"), tasks, world=world)
    R.evaluate_run(run.path, torch.device("cpu"), tasks, world=other, on_task=lambda task, line: seen.append(line))
    assert seen[0] is not None  # scored, not "already evaluated"
    lines = run.eval_lines()
    assert [line["world"] for line in lines] == [WorldDir(world).identity(), WorldDir(other).identity()]
    assert len(set(line["world"] for line in lines)) == 2
    cached = sorted(p.name for p in run.features_dir.rglob("world__shapes*.pt"))
    assert cached == sorted(f"world__shapes@{WorldDir(w).identity()}.pt" for w in (world, other))
    monkeypatch.setattr(R, "embed_images", lambda *a, **k: pytest.fail("embedded again"))
    again = []
    R.evaluate_run(run.path, torch.device("cpu"), tasks, world=world, on_task=lambda task, line: again.append(line))
    assert again == [None]  # the first world's line stands, from its own features


def test_a_damaged_feature_cache_file_is_computed_again_and_replaced(tmp_path):
    from euclip_cli.encode import FeatureCache

    cache, calls = FeatureCache(tmp_path, files="0123456789abcdef"), []

    def compute():
        calls.append(1)
        return torch.arange(6.0).reshape(2, 3), [0, 1]

    cache.get("world/shapes", compute)
    (tmp_path / "world__shapes@0123456789abcdef.pt").write_bytes(b"PK\x03\x04 cut short")
    image_emb, labels = cache.get("world/shapes", compute)
    assert len(calls) == 2 and labels == [0, 1] and torch.equal(image_emb, torch.arange(6.0).reshape(2, 3))
    cache.get("world/shapes", compute)
    assert len(calls) == 2  # replaced whole: read from the cache again
    world_cache = FeatureCache(tmp_path, world=None)
    world_cache.get("world/shapes", compute, per_world=True)
    assert len(calls) == 3  # a world of unknown identity is never cached, nor read from the cache
    FeatureCache(tmp_path).get("world/shapes", compute)
    assert len(calls) == 4  # nor are files of unknown identity


def test_another_copy_of_an_evaluation_set_is_scored_again_and_its_image_features_are_its_own(world, tmp_path,
                                                                                               monkeypatch):
    """``eval RUN --eval-root OTHER`` where OTHER holds another copy of a task's set (a subset, another release):
    its lines and cached image features were once keyed by the task alone, so the first copy's score was reported
    for it with exit 0. A set is now named by its files (``encode.files_identity``)."""
    import shutil

    from euclip_cli.encode import files_identity
    from euclip_cli.evaluate import runner as R
    from tests.test_export import make_run
    from tests.wdsfixtures import first_samples

    run = make_run(tmp_path / "runs", "tiny-clip")
    task = TASKS["cars"]
    whole, subset = tmp_path / "whole", tmp_path / "subset"
    shutil.copytree(world / "eval" / "shapes", task.data_dir(whole, world))
    first_samples(world / "eval" / "shapes", task.data_dir(subset, world), 24)
    seen = []
    R.evaluate_run(run.path, torch.device("cpu"), [task], eval_root=whole, world=world)
    R.evaluate_run(run.path, torch.device("cpu"), [task], eval_root=subset, world=world,
                   on_task=lambda task, line: seen.append(line))
    assert seen[0] is not None  # scored, not "already evaluated"
    ids = [files_identity(task.data_dir(root, world)) for root in (whole, subset)]
    lines = run.eval_lines()
    assert [line["set"] for line in lines] == ids and ids[0] != ids[1] and None not in ids
    assert sorted(p.name for p in run.features_dir.rglob("cars*.pt")) == sorted(f"cars@{i}.pt" for i in ids)
    monkeypatch.setattr(R, "embed_images", lambda *a, **k: pytest.fail("embedded again"))
    again = []
    R.evaluate_run(run.path, torch.device("cpu"), [task], eval_root=whole, world=world,
                   on_task=lambda task, line: again.append(line))
    assert again == [None]  # the whole set's line stands, from its own features


def test_retrieval_breaks_ties_as_clip_benchmarks_own_evaluation_does():
    """Duplicate captions (the world's "a red circle" belongs to many images) embed identically, so an image's
    top texts tie. clip-benchmark leaves the tie to torch.topk, which on the CPU does not always take the lowest
    index; euclip keeps that rule, so its CLIP-geometry retrieval equals clip-benchmark's zeroshot_retrieval
    evaluation, run end to end here on the same tied features (a stand-in model and loader)."""
    from clip_benchmark.metrics import zeroshot_retrieval

    g = get_geometry("clip")
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(40, 8, generator=generator)
    # Four distinct texts shared among 40 images, two captions each: every query ties with others.
    vocabulary = torch.randn(4, 8, generator=generator)
    captions = [[f"t{(i + j) % 4}" for j in range(2)] for i in range(40)]

    class Model:
        def encode_image(self, index):
            return images[index]

        def encode_text(self, tokens):
            return vocabulary[tokens]

    loader = torch.utils.data.DataLoader(list(zip(range(40), captions)), batch_size=16,
                                         collate_fn=lambda batch: (torch.tensor([b[0] for b in batch]),
                                                                   [b[1] for b in batch]))
    theirs = zeroshot_retrieval.evaluate(Model(), loader, lambda texts: torch.tensor([int(t[1:]) for t in texts]),
                                         "cpu", amp=False, recall_k_list=[1, 5])
    texts = torch.stack([vocabulary[int(t[1:])] for caps in captions for t in caps])
    owner = torch.arange(40).repeat_interleave(2)
    scores = g.similarity(g.embed(texts), g.embed(images))
    top = scores.T.max(dim=1, keepdim=True).values
    assert bool(((scores.T == top).sum(1) > 1).all())  # every image's best text is tied
    mine = retrieval_metrics(g, g.embed(images), g.embed(texts), owner)
    for k in (1, 5):
        assert mine[f"image_retrieval_recall@{k}"] == pytest.approx(theirs[f"image_retrieval_recall@{k}"])
        assert mine[f"text_retrieval_recall@{k}"] == pytest.approx(theirs[f"text_retrieval_recall@{k}"])


def test_tasks_scored_only_at_an_older_checkpoint_are_left_out_of_the_newest_ones_and_said(world, tmp_path):
    """A run whose tasks were scored at different checkpoints (an `eval --tasks` before training went on, and
    another after): its summary, its report row and its averages are one model's, the newest scored, and the
    tasks left out are named, where the newest line of each task had been mixed into one row with exit 0."""
    from typer.testing import CliRunner

    from euclip_cli.cli.main import app
    from euclip_cli.evaluate import runner as R
    from euclip_cli.worlddir import WorldDir
    from tests.test_export import make_run

    run = make_run(tmp_path / "runs", "tiny-clip")  # its checkpoint is step 7
    run.append_eval({"key": "world/shapes", "dataset": "world/shapes", "checkpoint": "checkpoints/step_3.pt",
                     "step": 3, "protocol": R.PROTOCOL, "world": WorldDir(world).identity(),
                     "metrics": {"acc1": 0.987, "main_metric": 0.987}})
    outcome = R.evaluate_run(run.path, torch.device("cpu"), select("world/colour"), world=world)
    assert [line["key"] for line in outcome.results] == ["world/colour"] and outcome.earlier_only == {"world/shapes": 3}
    assert outcome.suite_lines()[-1] == ("left out: world/shapes, scored only at an earlier checkpoint (step 3); "
                                         "--tasks world/shapes scores them at this one")
    report = CliRunner().invoke(app, ["report", "--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "tables"),
                                      "--studies-dir", str(tmp_path / "no-studies")])
    assert report.exit_code == 0, report.output
    assert "tiny-clip also has tasks scored only at an earlier one, left out" in " ".join(report.output.split())
    rows = [[c.strip() for c in l.strip("|").split("|")] for l in (tmp_path / "tables" / "embedded.md").read_text()
            .splitlines() if l.startswith("|")]
    assert dict(zip(rows[0], rows[2]))["Shapes"] == "missing"  # not step 3's 98.7 beside step 7's colour
