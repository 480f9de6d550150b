"""DataComp's whole task list on small local stand-ins of every kind: FairFace and UTKFace scored,
a failing task recorded without stopping the others, and DataComp's own results file written."""

import json
import math
import shutil
import tarfile

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from euclip_cli.cli.main import app
from euclip_cli.protocol.tasks import list_tasks
from euclip_cli.evaluate.zeroshot import fairface_metrics
from tests.wdsfixtures import with_metadata

runner = CliRunner()
TINY = ["data.batch_size=32", "optim.samples=64", "optim.warmup_steps=2", "train.precision=fp32",
        "train.tensorboard=false", "data.shuffle_buffer=200"]

# FairFace's objectives as DataComp's class-name file has them ("objective:classname"); 20 toxic
# classes so that both the non-human (14-17) and the crime-related (18+) ranges exist.
RACES = ["black", "white", "indian", "east asian", "southeast asian", "middle eastern", "latino"]
FAIRFACE_CLASSES = ([f"race:{r}" for r in RACES] + ["gender:man", "gender:woman"]
                    + [f"age:{a}" for a in ("child", "adult", "old")] + [f"toxic:thing {i}" for i in range(20)])
FAIRFACE_TEMPLATES = [f"{o}:a photo of a {{c}}." for o in ("race", "gender", "age", "toxic")]


def winogavil_from(shapes, dest):
    """WinoGAViL's converted layout: instances of 10-12 candidate images, the true ones a class's."""
    dest.mkdir(parents=True)
    (dest / "images").mkdir()
    labels = {}
    with tarfile.open(shapes / "test" / "0.tar") as src:
        for member in src.getmembers():
            key, ext = member.name.rsplit(".", 1)
            if ext in ("jpg", "png", "webp"):
                (dest / "images" / f"{key}.jpg").write_bytes(src.extractfile(member).read())
            elif ext == "cls":
                labels[key] = int(src.extractfile(member).read().decode())
    classes = (shapes / "classnames.txt").read_text().splitlines()
    keys = sorted(labels)
    lines = []
    for i in range(6):
        candidates = keys[i * 12: i * 12 + (10 if i % 2 else 12)]
        label = labels[candidates[0]]
        truth = [k for k in candidates if labels[k] == label]
        lines.append(json.dumps({"id": i, "cue": classes[label].split()[-1], "candidates": candidates,
                                 "associations": truth}))
    (dest / "instances.jsonl").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def evalsets(world, tmp_path_factory):
    """One local folder per DataComp task, made from the world's tasks in each task kind's format."""
    root = tmp_path_factory.mktemp("evalsets")
    shapes, retrieval = world / "eval" / "shapes", world / "eval" / "retrieval"
    for task in list_tasks("datacomp"):
        dest = task.data_dir(root, world)
        if task.kind == "retrieval":
            shutil.copytree(retrieval, dest)
        elif task.kind == "winogavil":
            winogavil_from(shapes, dest)
        elif task.key in ("fairness/fairface", "fairness/utkface"):
            with_metadata(shapes, dest, lambda label: [label % 3, label % 2, label % 7, int(label % 7 != 1)])
            (dest / "classnames.txt").write_text("\n".join(FAIRFACE_CLASSES) + "\n")
            (dest / "zeroshot_classification_templates.txt").write_text("\n".join(FAIRFACE_TEMPLATES) + "\n")
        elif task.kind in ("wilds", "fairness"):
            with_metadata(shapes, dest, lambda label: [label % 3, label % 2, label])
        else:
            shutil.copytree(shapes, dest)
    return root


@pytest.fixture(scope="module")
def trained(world, tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    result = runner.invoke(app, ["train", "--recipe", "tiny-clip", f"data.train_dir={world / 'train'}", *TINY,
                                 "--runs-dir", str(runs)])
    assert result.exit_code == 0, result.output
    return runs / "tiny-clip"


def datacomp_aggregate(path):
    """DataComp's ``aggregate_scores.py`` as its code and README describe it: read the jsonl with
    pandas, spread the metrics into columns, drop rows without a main metric, require exactly 38,
    and average by display name."""
    groups = {"ImageNet dist. shifts": {"ImageNet Sketch", "ImageNet v2", "ImageNet-A", "ImageNet-O", "ImageNet-R",
                                        "ObjectNet"},
              "VTAB": {"Caltech-101", "CIFAR-100", "CLEVR Counts", "CLEVR Distance", "Describable Textures", "EuroSAT",
                       "KITTI Vehicle Distance", "Oxford Flowers-102", "Oxford-IIIT Pet", "PatchCamelyon", "RESISC45",
                       "SVHN", "SUN397"},
              "Retrieval": {"Flickr", "MSCOCO", "WinoGAViL"}}
    df = pd.read_json(path, lines=True)
    df = pd.concat([df.drop(["metrics"], axis=1), df["metrics"].apply(pd.Series)], axis=1)
    df = df.dropna(subset=["main_metric"])
    assert len(df) == 38, f"Results file has unexpected size, {len(df)}"
    results = dict(zip(df.dataset, df.main_metric))
    out = {"ImageNet": results["ImageNet 1k"]}
    for group, names in groups.items():
        out[group] = float(np.mean([results[n] for n in names]))
    out["Average"] = float(np.mean(list(results.values())))
    return out


@pytest.mark.slow
def test_the_whole_datacomp_list_completes_and_datacomps_aggregator_reads_the_results(trained, evalsets, world):
    result = runner.invoke(app, ["eval", str(trained), "--tasks", "datacomp", "--eval-root", str(evalsets),
                                 "--world", str(world)])
    assert result.exit_code == 0, result.output
    assert "datacomp (38/38 tasks)" in result.output and "average" in result.output
    assert "fairness/fairface: scored (no main metric)" in result.output

    lines = [json.loads(line) for line in (trained / "eval_results.jsonl").read_text().splitlines()]
    assert len(lines) == 40 and all(set(line) == {"key", "dataset", "metrics"} for line in lines)
    fairface = next(line for line in lines if line["key"] == "fairness/fairface")
    assert fairface["metrics"]["main_metric"] is None
    assert {"acc_race_avg", "acc_gender_x_wg", "toxicity_crime_avg", "toxicity_nonhuman_wg"} <= set(fairface["metrics"])

    ours = {line["key"]: line for line in (json.loads(l) for l in (trained / "eval.jsonl").read_text().splitlines())}
    theirs = datacomp_aggregate(trained / "eval_results.jsonl")
    assert theirs["ImageNet"] == pytest.approx(ours["imagenet1k"]["metrics"]["acc1"])
    scored = [line["metrics"]["main_metric"] for line in ours.values() if line["metrics"]["main_metric"] is not None]
    assert theirs["Average"] == pytest.approx(sum(scored) / 38)


@pytest.mark.slow
def test_a_failing_task_is_recorded_and_the_others_still_run(trained, evalsets, world, tmp_path):
    root = tmp_path / "evalsets"
    shutil.copytree(evalsets, root)
    shutil.rmtree(root / "wds_imagenet-o_test")
    run = tmp_path / "run"
    shutil.copytree(trained, run, ignore=shutil.ignore_patterns("eval*.jsonl"))
    args = ["eval", str(run), "--tasks", "datacomp", "--eval-root", str(root), "--world", str(world)]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "no evaluation data for imagenet-o" in result.output and "1 task(s) failed" in result.output
    assert "euclip download evalsets --tasks imagenet-o" in result.output and "Traceback" not in result.output
    assert "shifts missing" in result.output  # the group with the failed task shows as missing, not a partial mean
    assert len((run / "eval_results.jsonl").read_text().splitlines()) == 39

    shutil.copytree(evalsets / "wds_imagenet-o_test", root / "wds_imagenet-o_test")
    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output
    assert again.output.count("already evaluated") == 39  # only the failed task runs again
    assert len((run / "eval_results.jsonl").read_text().splitlines()) == 40


def group_rates(values, columns):
    """By hand: the mean of ``values`` for each distinct row of ``columns``."""
    out = {}
    for v, key in zip(values, map(tuple, columns)):
        out.setdefault(key, []).append(v)
    return {k: sum(v) / len(v) for k, v in out.items()}


def test_fairface_metrics_match_a_hand_computation():
    gen = torch.Generator().manual_seed(0)
    n = 300
    metadata = torch.stack([torch.randint(0, 9, (n,), generator=gen), torch.randint(0, 2, (n,), generator=gen),
                            torch.randint(0, 7, (n,), generator=gen)], dim=1)
    metadata = torch.cat([metadata, (metadata[:, 2:3] != 1).long()], dim=1)  # race_binary: 0 for race 1
    predicted = {"race": torch.randint(0, 7, (n,), generator=gen), "gender": torch.randint(0, 2, (n,), generator=gen),
                 "age": torch.randint(0, 9, (n,), generator=gen), "toxic": torch.randint(0, 20, (n,), generator=gen)}
    m = fairface_metrics(predicted, metadata)
    age, gender, race, binary = (metadata[:, i].tolist() for i in range(4))
    pr, pg, pa, pt = (predicted[k].tolist() for k in ("race", "gender", "age", "toxic"))

    race_ok = [float((p != 1) == b) for p, b in zip(pr, binary)]
    assert m["acc_race_avg"] == pytest.approx(sum(race_ok) / n)
    by_binary = group_rates(race_ok, [[b] for b in binary])
    assert m["acc_race_race_binary:0"] == pytest.approx(by_binary[(0,)])
    assert m["acc_race_wg"] == pytest.approx(min(by_binary.values()))
    assert m["count_race_binary:1"] == sum(binary)

    gender_ok = [float(p == g) for p, g in zip(pg, gender)]
    cross = group_rates(gender_ok, list(zip(gender, race)))
    assert m["acc_gender_x_wg"] == pytest.approx(min(cross.values()))
    assert m["acc_gender_x_gender:1_race:3"] == pytest.approx(cross[(1, 3)])
    assert m["acc_age_avg"] == pytest.approx(sum(p == a for p, a in zip(pa, age)) / n)

    crime = group_rates([float(t >= 18) for t in pt], [[r] for r in race])
    nonhuman = group_rates([float(14 <= t < 18) for t in pt], [[r] for r in race])
    assert m["toxicity_crime_race:4"] == pytest.approx(crime[(4,)])
    assert m["toxicity_crime_wg"] == pytest.approx(min(crime.values()))
    assert m["toxicity_nonhuman_avg"] == pytest.approx(sum(14 <= t < 18 for t in pt) / n)
    assert m["toxicity_nonhuman_wg"] == pytest.approx(min(nonhuman.values()))
    assert all(math.isfinite(v) for v in m.values())
