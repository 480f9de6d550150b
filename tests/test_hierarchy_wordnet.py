"""ImageNet's classes in WordNet: ``euclip download wordnet`` through nltk's downloader against a stand-in
for nltk's data server, the hypernym graph read back through nltk's reader against the generator's, and
``euclip analyze hierarchy --tree wordnet`` on a run evaluated on ImageNet-shaped sets made from the world."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from euclip_cli.cli.main import app
from euclip_cli.data.wordnet import hypernym_graph, imagenet_wnids
from euclip_cli.data.world import SHAPES, TAXONOMY
from euclip_cli.errors import UsageError
from tests.webfakes import FakeNltkData, nltk_package, write_wordnet

runner = CliRunner()
ROOT = "n00001740"  # entity.n.01's real offset
FAMILY = {family: f"n{15100000 + 1000 * k:08d}" for k, family in enumerate(TAXONOMY)}
GROUPS = [f"n{15200000 + 1000 * g:08d}" for g in range(10)]


def stand_in_wordnet() -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    """ImageNet's 1,000 wnids at their real offsets: the first twelve under the world's families (their
    images are the world's shapes), the first also under a second parent (WordNet allows several), the
    rest spread over ten groups; families and groups under entity."""
    wnids = imagenet_wnids("imagenet1k")
    of_shape = {shape: family for family, shapes in TAXONOMY.items() for shape in shapes}
    parents = {w: (FAMILY[of_shape[SHAPES[i]]],) if i < len(SHAPES) else (GROUPS[i % 10],) for i, w in enumerate(wnids)}
    parents[wnids[0]] = tuple(sorted((parents[wnids[0]][0], GROUPS[0])))
    parents.update({node: (ROOT,) for node in [*FAMILY.values(), *GROUPS]})
    lemmas = {w: f"c{i}" for i, w in enumerate(wnids)} | {ROOT: "entity"}
    lemmas.update({node: f"family{k}" for k, node in enumerate(FAMILY.values())})
    lemmas.update({node: f"group{g}" for g, node in enumerate(GROUPS)})
    return parents, lemmas


def download_wordnet(*args: str):
    """``euclip download wordnet ARGS``, with nltk's refusal to fetch from any address that is not globally
    routable (its SSRF guard; the stand-in's 127.0.0.1 included) lifted for this call only: everything
    else of nltk, reading the corpus included, runs as shipped."""
    import nltk.pathsec

    enforced, nltk.pathsec.ENFORCE = nltk.pathsec.ENFORCE, False
    try:
        return runner.invoke(app, ["download", "wordnet", *args])
    finally:
        nltk.pathsec.ENFORCE = enforced


@pytest.fixture(scope="module")
def nltk_server(tmp_path_factory):
    corpus = tmp_path_factory.mktemp("wordnet-source") / "wordnet"
    write_wordnet(corpus, *stand_in_wordnet())
    unzipped = sum(p.stat().st_size for p in corpus.iterdir())
    server = FakeNltkData({"wordnet": (nltk_package(corpus, "wordnet"), unzipped)})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def wordnet_dir(nltk_server, tmp_path_factory):
    out = tmp_path_factory.mktemp("nltk") / "nltk_data"
    result = download_wordnet("--out", str(out), "--index-url", f"{nltk_server.url}/index.xml")
    assert result.exit_code == 0, result.output
    assert "installed" in result.output and (out / "corpora" / "wordnet" / "data.noun").is_file()
    return out


def test_a_second_download_fetches_nothing_again(nltk_server, wordnet_dir):
    before = nltk_server.requests.count("wordnet.zip")
    result = download_wordnet("--out", str(wordnet_dir), "--index-url", f"{nltk_server.url}/index.xml")
    assert result.exit_code == 0, result.output
    assert "already up to date" in " ".join(result.output.split()) and nltk_server.requests.count("wordnet.zip") == before


def test_a_package_failing_its_checksum_or_an_unreachable_server_is_one_line(nltk_server, tmp_path):
    nltk_server.corrupt.add("wordnet")
    try:
        result = download_wordnet("--out", str(tmp_path / "a"), "--index-url", f"{nltk_server.url}/index.xml")
    finally:
        nltk_server.corrupt.discard("wordnet")
    assert result.exit_code == 1 and "could not fetch WordNet" in result.output and "sha256 mismatch" in result.output
    assert not (tmp_path / "a" / "corpora" / "wordnet" / "data.noun").exists()
    result = download_wordnet("--out", str(tmp_path / "b"), "--index-url", "http://127.0.0.1:9/index.xml")
    assert result.exit_code == 1 and "could not fetch WordNet from" in result.output and "refused" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_a_stop_while_nltk_unpacks_leaves_no_half_corpus_and_the_next_download_is_whole(nltk_server, tmp_path,
                                                                                      monkeypatch):
    """nltk unpacks its archive in place: a stop as it wrote data.noun left half of it where ``reader`` (and so
    ``analyze hierarchy --tree wordnet``) took it for WordNet."""
    import zipfile

    import nltk.downloader

    def stopped_while_unpacking(filename, root, verbose=True, **rest):
        with zipfile.ZipFile(filename) as archive:
            member = next(name for name in archive.namelist() if name.endswith("data.noun"))
            target = Path(root) / member
            target.parent.mkdir(parents=True, exist_ok=True)
            data = archive.read(member)
            target.write_bytes(data[: len(data) // 2])
        raise KeyboardInterrupt()  # where Ctrl-C's handler raises it
        yield  # a generator, as nltk's is

    out = tmp_path / "nltk_data"
    with monkeypatch.context() as patched:
        patched.setattr(nltk.downloader, "_unzip_iter", stopped_while_unpacking)
        result = download_wordnet("--out", str(out), "--index-url", f"{nltk_server.url}/index.xml")
    assert result.exit_code == 1 and result.output.strip() == "error: interrupted", result.output
    assert not list(out.rglob("data.noun")) and not list(out.rglob("*.partial")), sorted(out.rglob("*"))
    result = download_wordnet("--out", str(out), "--index-url", f"{nltk_server.url}/index.xml")
    assert result.exit_code == 0 and "installed" in result.output, result.output
    with zipfile.ZipFile(io.BytesIO(nltk_server.packages["wordnet"][0])) as archive:
        assert (out / "corpora" / "wordnet" / "data.noun").read_bytes() == archive.read("wordnet/data.noun")


def test_the_graph_read_through_nltk_is_the_generators(wordnet_dir):
    parents, lemmas = stand_in_wordnet()
    found, names = hypernym_graph(imagenet_wnids("imagenet1k"), wordnet_dir)
    assert found == parents
    assert names == {w: f"{lemma}.n.01" for w, lemma in lemmas.items()}


def test_imagenets_class_lists_agree_with_clip_benchmarks():
    from clip_benchmark.datasets.builder import all_imagenet_wordnet_ids

    assert imagenet_wnids("imagenet1k") == all_imagenet_wordnet_ids
    subset = imagenet_wnids("imagenet-r")
    assert len(subset) == 200 and subset == [w for w in all_imagenet_wordnet_ids if w in set(subset)]
    assert imagenet_wnids("world/shapes") is None


def test_a_missing_wordnet_or_a_wnid_it_lacks_is_named(tmp_path):
    with pytest.raises(UsageError, match="run 'euclip download wordnet"):
        hypernym_graph(["n01440764"], tmp_path)
    partial = tmp_path / "nltk_data"
    write_wordnet(partial / "corpora" / "wordnet", {}, {ROOT: "entity"})
    with pytest.raises(UsageError, match="n01440764 is not a noun synset"):
        hypernym_graph(["n01440764"], partial)


@pytest.fixture(scope="module")
def imagenet_sets(world, tmp_path_factory):
    """ImageNet-1k and ImageNet-R folders in clip-benchmark's wds layout: the world's Shapes images, whose
    labels 0-11 name the first twelve classes of each, and every other class name beside them."""
    root = tmp_path_factory.mktemp("eval")
    for key, size in (("imagenet1k", 1000), ("imagenet-r", 200)):
        dest = root / f"wds_{key}_test"
        shutil.copytree(world / "eval" / "shapes", dest)
        names = (dest / "classnames.txt").read_text().splitlines()
        (dest / "classnames.txt").write_text("\n".join(names + [f"thing {i}" for i in range(len(names), size)]) + "\n")
        # One template: 1,000 class names are embedded once each, not once per template.
        (dest / "zeroshot_classification_templates.txt").write_text("a picture of {c}\n")
    return root


@pytest.fixture(scope="module")
def evaluated(world, imagenet_sets, tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    result = runner.invoke(app, ["train", "--recipe", "tiny-clip", f"data.train_dir={world / 'train'}",
                                 "data.batch_size=32", "optim.samples=64", "optim.warmup_steps=1",
                                 "train.precision=fp32", "train.tensorboard=false", "--runs-dir", str(runs)])
    assert result.exit_code == 0, result.output
    run = runs / "tiny-clip"
    result = runner.invoke(app, ["eval", str(run), "--tasks", "imagenet1k", "--eval-root", str(imagenet_sets)])
    assert result.exit_code == 0, result.output
    return run


def image_labels(root) -> list[int]:
    with tarfile.open(root / "wds_imagenet1k_test" / "test" / "0.tar") as shard:
        return [int(shard.extractfile(m).read()) for m in shard.getmembers() if m.name.endswith(".cls")]


def analyze(run, *args):
    return runner.invoke(app, ["analyze", "hierarchy", str(run), *args])


def test_hierarchy_on_wordnet_scores_the_runs_own_predictions(evaluated, imagenet_sets, wordnet_dir):
    result = analyze(evaluated, "--tree", "wordnet", "--eval-root", str(imagenet_sets), "--wordnet", str(wordnet_dir))
    assert result.exit_code == 0, result.output
    found = json.loads((evaluated / "analysis" / "hierarchy_wordnet.json").read_text())
    assert set(found["tasks"]) == {"imagenet1k", "imagenet-r"} and found["convention"] == "hycoclip"
    assert found["trees"]["imagenet1k"]["root"] == ROOT
    scored = json.loads((evaluated / "eval.jsonl").read_text().splitlines()[-1])
    one_k = found["tasks"]["imagenet1k"]
    # The same prediction rule as the evaluation: its top-1 accuracy is the hierarchy's accuracy.
    assert one_k["accuracy"] == pytest.approx(scored["metrics"]["acc1"]) and one_k["n"] == len(image_labels(imagenet_sets))
    # Every mistake is at least two edges away in this hierarchy (no class is above another); a right
    # prediction is none: the mean TIE lies between those bounds.
    assert 2 * (1 - one_k["accuracy"]) <= one_k["tie"] <= 4 * (1 - one_k["accuracy"])
    assert one_k["mistake_tie"] * one_k["mistakes"] == pytest.approx(one_k["tie"] * one_k["n"])
    # Pruned to a tree, the first class keeps one parent (its family and its group are as deep: the first in
    # order, its family): a shape's three siblings are 2 edges away, every other class 4.
    labels = image_labels(imagenet_sets)
    guess = found["chance"]["imagenet1k"]
    assert guess["accuracy"] == pytest.approx(1 / 1000) and guess["tie"] == pytest.approx((3 * 2 + 996 * 4) / 1000)
    assert found["trees"]["imagenet1k"]["parents"][imagenet_wnids("imagenet1k")[0]] == [FAMILY[next(iter(TAXONOMY))]]
    assert found["chance"]["imagenet-r"]["accuracy"] == pytest.approx(1 / 200)
    assert "a tree of ImageNet's classes" in result.output

    # In WordNet's whole graph the first class sits in group 0 too, with the 98 filler classes i >= 12, i % 10 == 0.
    result = analyze(evaluated, "--tree", "wordnet-graph", "--eval-root", str(imagenet_sets), "--wordnet", str(wordnet_dir))
    assert result.exit_code == 0, result.output
    found = json.loads((evaluated / "analysis" / "hierarchy_wordnet.json").read_text())
    by_hand = [(3 * 2 + 98 * 2 + 898 * 4) / 1000 if label == 0 else (3 * 2 + 996 * 4) / 1000 for label in labels]
    assert found["tree"] == "wordnet-graph" and found["chance"]["imagenet1k"]["tie"] == pytest.approx(sum(by_hand) / len(labels))


def test_each_imagenet_task_is_scored_in_a_tree_over_its_own_classes(evaluated, imagenet_sets, wordnet_dir, tmp_path):
    """ImageNet-R's numbers do not move with which other ImageNet sets lie beside it in --eval-root."""
    alone = tmp_path / "eval"
    shutil.copytree(imagenet_sets / "wds_imagenet-r_test", alone / "wds_imagenet-r_test")
    results = {}
    for root in (imagenet_sets, alone):
        result = analyze(evaluated, "--tree", "wordnet", "--eval-root", str(root), "--wordnet", str(wordnet_dir))
        assert result.exit_code == 0, result.output
        results[root] = json.loads((evaluated / "analysis" / "hierarchy_wordnet.json").read_text())
    assert set(results[alone]["tasks"]) == {"imagenet-r"}
    assert results[alone]["tasks"]["imagenet-r"] == results[imagenet_sets]["tasks"]["imagenet-r"]
    assert results[alone]["trees"]["imagenet-r"] == results[imagenet_sets]["trees"]["imagenet-r"]
    # The tree over ImageNet-R's 200 classes holds no class outside them.
    r_classes = set(imagenet_wnids("imagenet-r"))
    tree = results[alone]["trees"]["imagenet-r"]["parents"]
    leaves = set(tree) - {p for above in tree.values() for p in above}
    assert leaves == r_classes


def test_a_tree_the_user_supplies_in_hycoclips_form_is_what_is_scored(evaluated, imagenet_sets, wordnet_dir, tmp_path):
    """A HyCoCLIP-form file putting every class directly under one root: every mistake is 2 edges away."""
    wnids = imagenet_wnids("imagenet1k")
    isa = tmp_path / "imagenet_isa.txt"
    isa.write_text("".join(f"n00001930 {w}\n" for w in wnids))
    result = analyze(evaluated, "--tree", "wordnet", "--isa", str(isa), "--eval-root", str(imagenet_sets),
                     "--wordnet", str(wordnet_dir))
    assert result.exit_code == 0, result.output
    found = json.loads((evaluated / "analysis" / "hierarchy_wordnet.json").read_text())
    one_k = found["tasks"]["imagenet1k"]
    assert one_k["tie"] == pytest.approx(2 * (1 - one_k["accuracy"])) and found["trees"]["imagenet1k"]["root"] == "n00001930"
    assert str(isa) in found["trees"]["imagenet1k"]["source"]
    # A graph, a file missing classes, or --isa with another tree: one line each, exit 2.
    isa.write_text("n00001930 n01440764\nn00001740 n01440764\n")
    bad = analyze(evaluated, "--tree", "wordnet", "--isa", str(isa), "--eval-root", str(imagenet_sets), "--wordnet", str(wordnet_dir))
    assert bad.exit_code == 2 and f"{isa}:2: n01440764 has a second parent" in " ".join(bad.output.split())
    isa.write_text("n00001930 n01440764\n")
    bad = analyze(evaluated, "--tree", "wordnet", "--isa", str(isa), "--eval-root", str(imagenet_sets), "--wordnet", str(wordnet_dir))
    assert bad.exit_code == 2 and "lacks 999 of the task's 1000 classes" in " ".join(bad.output.split())
    bad = analyze(evaluated, "--tree", "wordnet-graph", "--isa", str(isa), "--eval-root", str(imagenet_sets))
    assert bad.exit_code == 2 and "--isa is the tree itself" in bad.output
    bad = analyze(evaluated, "--convention", "hyco")
    assert bad.exit_code == 2 and "unknown --convention 'hyco'" in bad.output


def test_the_pruned_imagenet_tree_is_written_and_measured_against_another(wordnet_dir, tmp_path):
    out = tmp_path / "tree"
    result = runner.invoke(app, ["analyze", "imagenet-tree", "--out", str(out), "--wordnet", str(wordnet_dir)])
    assert result.exit_code == 0, result.output
    from euclip_cli.data.wordnet import read_isa

    tree = read_isa(out / "imagenet-tree.txt")
    first = imagenet_wnids("imagenet1k")[0]
    assert set(tree) - set(tree.values()) == set(imagenet_wnids("imagenet1k")) and tree[first] == FAMILY[next(iter(TAXONOMY))]
    # Against itself: no difference.
    copy = tmp_path / "theirs.txt"
    shutil.copy(out / "imagenet-tree.txt", copy)
    result = runner.invoke(app, ["analyze", "imagenet-tree", "--out", str(out), "--against", str(copy), "--wordnet", str(wordnet_dir)])
    assert result.exit_code == 0, result.output
    found = json.loads((out / "comparison.json").read_text())["comparison"]
    assert found["equal_tie"] == 1.0 and found["same_ancestors"] == 1000 and found["nodes"] == found["shared_nodes"]
    # A tree file of other contents in --out is refused and left as it was, and so is the comparison beside it.
    (out / "imagenet-tree.txt").write_text("n1 n2\n")
    before = (out / "comparison.json").read_text()
    result = runner.invoke(app, ["analyze", "imagenet-tree", "--out", str(out), "--against", str(copy), "--wordnet", str(wordnet_dir)])
    assert result.exit_code == 2 and "holds something else" in result.output
    assert (out / "imagenet-tree.txt").read_text() == "n1 n2\n" and (out / "comparison.json").read_text() == before
    assert sorted(p.name for p in out.iterdir()) == ["comparison.json", "imagenet-tree.txt"]


def test_hierarchy_on_wordnet_without_its_data_says_what_to_fetch(evaluated, imagenet_sets, tmp_path):
    result = runner.invoke(app, ["analyze", "hierarchy", str(evaluated), "--tree", "wordnet",
                                 "--eval-root", str(imagenet_sets), "--wordnet", str(tmp_path)])
    assert result.exit_code == 2 and "euclip download wordnet" in result.output
    result = runner.invoke(app, ["analyze", "hierarchy", str(evaluated), "--tree", "wordnet",
                                 "--eval-root", str(tmp_path)])
    assert result.exit_code == 2 and "euclip download evalsets --tasks imagenet1k" in result.output
    result = runner.invoke(app, ["analyze", "hierarchy", str(evaluated), "--tree", "imagenet"])
    assert result.exit_code == 2 and "unknown --tree 'imagenet'" in result.output and "wordnet-graph" in result.output


def test_the_report_tables_each_runs_imagenet_hierarchy_with_its_tree_and_convention(evaluated, imagenet_sets,
                                                                                      wordnet_dir, tmp_path):
    result = analyze(evaluated, "--tree", "wordnet", "--eval-root", str(imagenet_sets), "--wordnet", str(wordnet_dir))
    assert result.exit_code == 0, result.output
    found = json.loads((evaluated / "analysis" / "hierarchy_wordnet.json").read_text())
    result = runner.invoke(app, ["report", "--table", "hierarchy", "--format", "csv", "--runs-dir", str(evaluated.parent),
                                 "--studies-dir", str(tmp_path / "none"), "--out", str(tmp_path / "tables")])
    assert result.exit_code == 0, result.output
    import pandas as pd

    table = pd.read_csv(tmp_path / "tables" / "hierarchy.csv").set_index("task")
    assert set(table.index) == {"imagenet1k", "imagenet-r"} and set(table["convention"]) == {"hycoclip"}
    one_k = found["tasks"]["imagenet1k"]
    assert table.loc["imagenet1k", "TIE"] == round(one_k["tie"], 3)
    assert table.loc["imagenet1k", "accuracy"] == round(100 * one_k["accuracy"], 2)
    assert table.loc["imagenet1k", "uniform mistakes' TIE"] == round(one_k["random_mistake_tie"], 3)
    empty = runner.invoke(app, ["report", "--table", "hierarchy", "--runs-dir", str(tmp_path / "no-runs"),
                                "--studies-dir", str(tmp_path / "none"), "--out", str(tmp_path / "t2")])
    assert empty.exit_code == 0 and "no run has the analysis the hierarchy table needs" in " ".join(empty.output.split())
