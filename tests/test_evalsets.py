"""``euclip download evalsets`` against a Hugging Face-shaped server on 127.0.0.1: fetch, verify, resume."""

import hashlib
import io
import json
import tarfile
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from euclip_cli.cli.main import app
from euclip_cli.data.fetch import FetchError, parse_pointer
from euclip_cli.evaluate.evalsets import download_task, repo_for
from euclip_cli.protocol.tasks import TASKS

runner = CliRunner()


class FakeHub:
    """Serves ``{repo}/resolve/main/{path}`` (bytes, with ranges) and ``{repo}/raw/main/{tar}`` (LFS pointers)."""

    def __init__(self, files: dict[str, bytes]):
        self.files, self.requests, self.cut_next = files, [], set()
        self.pointer_source: dict[str, bytes] = {}  # a pointer describing other bytes than those served
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                parts = self.path.lstrip("/").split("/")
                if parts[0] == "api":  # the Hub API's file listing of a dataset repo
                    repo = "/".join(parts[2:4])
                    siblings = [{"rfilename": k[len(repo) + 1:]} for k in hub.files if k.startswith(repo + "/")]
                    body = json.dumps({"siblings": siblings}).encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                repo, kind, rel = "/".join(parts[:2]), parts[2], "/".join(parts[4:])
                data = hub.files.get(f"{repo}/{rel}")
                hub.requests.append((kind, rel, self.headers.get("Range")))
                if data is None:
                    self.send_error(404)
                    return
                if kind == "raw" and rel.endswith((".tar", ".zip")):  # large files live in LFS
                    data = hub.pointer_source.get(f"{repo}/{rel}", data)
                    data = (f"version https://git-lfs.github.com/spec/v1\noid sha256:{hashlib.sha256(data).hexdigest()}\n"
                            f"size {len(data)}\n").encode()
                start = int(self.headers["Range"].split("=")[1].rstrip("-")) if self.headers.get("Range") else 0
                self.send_response(206 if start else 200)
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                if rel in hub.cut_next and kind == "resolve":
                    hub.cut_next.discard(rel)
                    self.wfile.write(data[start:start + (len(data) - start) // 2])  # then drop the connection
                    self.close_connection = True
                    return
                self.wfile.write(data[start:])

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def tar_requests(self):
        return [r for r in self.requests if r[0] == "resolve" and r[1].endswith(".tar")]


@pytest.fixture()
def hub(world):
    """ImageNet's repo, filled with the embedded world's shapes task (same layout)."""
    source = world / "eval" / "shapes"
    repo = repo_for(TASKS["imagenet1k"])
    served = [p for p in source.rglob("*") if p.is_file() and p.name != "scenes.json"]  # scenes.json: world-only
    files = {f"{repo}/{p.relative_to(source)}": p.read_bytes() for p in served}
    big = bytes(range(256)) * 4096  # a second, 1 MiB shard so a cut transfer leaves a real partial file
    files[f"{repo}/test/1.tar"] = big
    files[f"{repo}/test/nshards.txt"] = b"2\n"
    fake = FakeHub(files)
    yield fake, source
    fake.server.shutdown()


def test_repo_names_follow_datacomp():
    assert repo_for(TASKS["vtab/caltech101"]) == "djghosh/wds_vtab-caltech101_test"
    assert repo_for(TASKS["fairness/dollar_street"]) == "djghosh/wds_dollar_street_test"
    assert repo_for(TASKS["wilds/iwildcam"]) == "djghosh/wds_wilds-iwildcam_test"
    assert repo_for(TASKS["misc/winogavil"]) == "nlphuji/winogavil"
    assert parse_pointer("just text") is None


def test_fetches_verifies_and_then_does_nothing(hub, tmp_path):
    fake, source = hub
    result = runner.invoke(app, ["download", "evalsets", "--tasks", "imagenet1k", "--root", str(tmp_path),
                                 "--base-url", fake.url])
    assert result.exit_code == 0, result.output
    folder = tmp_path / "wds_imagenet1k_test"
    for path in source.rglob("*"):
        if path.is_file() and path.name not in ("nshards.txt", "scenes.json"):
            assert (folder / path.relative_to(source)).read_bytes() == path.read_bytes()
    assert (folder / "test" / "nshards.txt").read_text() == "2\n"
    assert not list(folder.rglob("*.part"))
    before = len(fake.tar_requests())
    again = runner.invoke(app, ["download", "evalsets", "--tasks", "imagenet1k", "--root", str(tmp_path),
                                "--base-url", fake.url])
    assert again.exit_code == 0 and "0 fetched" in again.output
    assert len(fake.tar_requests()) == before  # nothing downloaded twice


def test_an_interrupted_transfer_resumes_with_a_range_request(hub, tmp_path):
    fake, _ = hub
    fake.cut_next.add("test/1.tar")
    task = TASKS["imagenet1k"]
    folder = tmp_path / "wds_imagenet1k_test"
    with pytest.raises(FetchError, match="run the same command again"):
        download_task(task, folder, fake.url)
    partial = (folder / "test" / "1.tar.part").stat().st_size
    assert 0 < partial < len(fake.files["djghosh/wds_imagenet1k_test/test/1.tar"])
    assert not (folder / "test" / "nshards.txt").exists()  # the marker says "complete"; it is not yet
    result = download_task(task, folder, fake.url)
    assert result["fetched"] == 1 and result["present"] >= 1  # 0.tar was kept, only 1.tar continued
    assert ("resolve", "test/1.tar", f"bytes={partial}-") in fake.requests
    assert (folder / "test" / "1.tar").read_bytes() == fake.files["djghosh/wds_imagenet1k_test/test/1.tar"]


def test_a_corrupt_download_is_refused_and_nothing_is_kept(hub, tmp_path):
    fake, _ = hub
    key = "djghosh/wds_imagenet1k_test/test/1.tar"
    fake.pointer_source[key] = fake.files[key]  # the pointer keeps describing the good bytes ...
    corrupt = bytearray(fake.files[key])
    corrupt[1000] ^= 0xFF
    fake.files[key] = bytes(corrupt)  # ... while the server sends one flipped byte
    folder = tmp_path / "wds_imagenet1k_test"
    with pytest.raises(FetchError, match="checksum"):
        download_task(TASKS["imagenet1k"], folder, fake.url)
    assert not (folder / "test" / "1.tar").exists() and not (folder / "test" / "1.tar.part").exists()


def test_an_unreachable_host_is_one_clear_error(tmp_path):
    result = runner.invoke(app, ["download", "evalsets", "--tasks", "imagenet1k", "--root", str(tmp_path),
                                 "--base-url", "http://127.0.0.1:9"])
    assert result.exit_code == 1 and "could not reach" in result.output and "Traceback" not in result.output


def download_from(files: dict[str, bytes], tasks: str, root):
    """``euclip download evalsets --tasks TASKS --root ROOT`` from a Hub stand-in serving ``files``."""
    fake = FakeHub(files)
    try:
        return runner.invoke(app, ["download", "evalsets", "--tasks", tasks, "--root", str(root), "--base-url", fake.url])
    finally:
        fake.server.shutdown()


def test_winogavil_is_fetched_converted_and_scored(world, tmp_path):
    import torch

    from euclip_cli import config as C
    from euclip_cli.evaluate.runner import evaluate_task
    from euclip_cli.model import EuclipModel

    with tarfile.open(world / "eval" / "shapes" / "test" / "0.tar") as tar:
        jpgs = [tar.extractfile(m).read() for m in tar.getmembers() if m.name.endswith(".jpg")][:12]
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        for i, data in enumerate(jpgs):
            z.writestr(f"winogavil_images/img{i}.jpg", data)
    rows = [(0, "Apple", [f"img{i}" for i in range(5)], ["img1", "img3"]),
            (1, "moon", [f"img{i}" for i in range(10)], ["img2", "img4", "img9"]),
            (2, "sea", [f"img{i}" for i in range(12)], ["img0", "img11"])]
    csv = "ID,cue,candidates,associations\n" + "".join(
        f'{i},{cue},"{json.dumps(c).replace(chr(34), chr(34) * 2)}","{json.dumps(a).replace(chr(34), chr(34) * 2)}"\n'
        for i, cue, c, a in rows)
    result = download_from({"nlphuji/winogavil/winogavil_dataset.csv": csv.encode(),
                            "nlphuji/winogavil/winogavil_images.zip": archive.getvalue()}, "misc/winogavil", tmp_path)
    assert result.exit_code == 0, result.output
    folder = tmp_path / "winogavil"
    instances = [json.loads(line) for line in (folder / "instances.jsonl").read_text().splitlines()]
    assert [i["cue"] for i in instances] == ["Apple", "moon", "sea"] and instances[1]["associations"] == rows[1][3]
    assert len(list((folder / "images").glob("*.jpg"))) == 12

    cfg = C.load_config("tiny-meru")
    torch.manual_seed(0)
    metrics = evaluate_task(EuclipModel(cfg).eval(), cfg, TASKS["misc/winogavil"], folder, torch.device("cpu"), 8)
    assert set(metrics) >= {"avg_jaccard_score", "jaccard_score_5", "jaccard_score_10", "jaccard_score_12",
                            "jaccard_score_5-6", "jaccard_score_10-12"}
    assert metrics["jaccard_score_10-12"] == pytest.approx((metrics["jaccard_score_10"] + metrics["jaccard_score_12"]) / 2)
    assert all(0 <= v <= 1 for v in metrics.values() if v is not None)


def nlphuji_repo(jpgs: list[bytes], captions: list[list[str]], folder: str) -> dict[str, bytes]:
    """A retrieval repo as nlphuji publishes it: Karpathy's per-image rows (``raw`` a JSON list of
    captions) in a csv, and the images in a zip under one folder (plus one the csv does not name)."""
    import pandas as pd

    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        for i, data in enumerate(jpgs):
            z.writestr(f"{folder}/{1000 + i}.jpg", data)
    names = [f"{1000 + i}.jpg" for i in range(len(captions))]
    table = pd.DataFrame({"sentids": [json.dumps([5 * i + k for k in range(len(c))]) for i, c in enumerate(captions)],
                          "imgid": range(len(captions)), "tokens": [json.dumps([x.split() for x in c]) for c in captions],
                          "raw": [json.dumps(c) for c in captions], "split": "test", "filename": names})
    return {"test.csv": table.to_csv(index=False).encode(), f"{folder}.zip": archive.getvalue()}


def test_datacomps_retrieval_sets_are_converted_with_every_image_and_caption(world, tmp_path, monkeypatch):
    """Flickr30k from nlphuji's repo (DataComp's source) into the wds retrieval layout the evaluator reads."""
    import torch
    from clip_benchmark.datasets.builder import build_dataset

    from euclip_cli import config as C
    from euclip_cli.evaluate import evalsets
    from euclip_cli.evaluate.runner import evaluate_task
    from euclip_cli.model import EuclipModel

    with tarfile.open(world / "eval" / "shapes" / "test" / "0.tar") as tar:
        jpgs = [tar.extractfile(m).read() for m in tar.getmembers() if m.name.endswith(".jpg")][:8]
    captions = [[f"a photo number {i} view {k}" for k in range(5)] for i in range(7)]
    captions[2].append("a sixth caption, as some COCO images have")
    captions[4][1] = "a caption broken\nover two lines"
    repo = "nlphuji/flickr_1k_test_image_text_retrieval"
    files = nlphuji_repo(jpgs, captions, "images_flickr_1k_test")
    fake = FakeHub({f"{repo}/test_1k_flickr.csv": files["test.csv"],
                    f"{repo}/images_flickr_1k_test.zip": files["images_flickr_1k_test.zip"]})
    monkeypatch.setattr(evalsets, "RETRIEVAL_PER_SHARD", 3)
    key = "retrieval/flickr_1k_test_image_text_retrieval"
    command = ["download", "evalsets", "--tasks", key, "--root", str(tmp_path), "--base-url", fake.url]
    try:
        result = runner.invoke(app, command)
        assert result.exit_code == 0, result.output
        assert "3 shard(s), 7 images and 36 captions" in " ".join(result.output.split())
        served = len(fake.requests)
        again = runner.invoke(app, command)
        assert again.exit_code == 0 and "0 fetched" in again.output and len(fake.requests) == served
    finally:
        fake.server.shutdown()
    folder = TASKS[key].data_dir(tmp_path, world)
    ds = build_dataset("wds/" + key, root=str(folder), transform=lambda image: image.size, split="test",
                       task="zeroshot_retrieval")
    samples = list(ds)
    assert [texts for _, texts in samples] == [[" ".join(c.split()) for c in row] for row in captions]
    with tarfile.open(folder / "test" / "0.tar") as tar:
        first = [tar.extractfile(m).read() for m in tar.getmembers() if m.name.endswith(".jpg")]
    assert first == jpgs[:3]  # the zip's bytes, in the csv's order

    cfg = C.load_config("tiny-clip")
    torch.manual_seed(0)
    metrics = evaluate_task(EuclipModel(cfg).eval(), cfg, TASKS[key], folder, torch.device("cpu"), 4)
    assert 0 <= metrics["mean_recall@1"] <= 1 and metrics["image_retrieval_recall@10"] == 1.0  # 7 images: top-10 holds all


def test_a_retrieval_folder_from_another_source_is_named_not_mixed(tmp_path):
    key = "retrieval/mscoco_2014_5k_test_image_text_retrieval"
    folder = TASKS[key].data_dir(tmp_path, tmp_path)
    (folder / "test").mkdir(parents=True)
    (folder / "test" / "nshards.txt").write_text("1\n")  # an earlier euclip's clip-benchmark mirror
    result = runner.invoke(app, ["download", "evalsets", "--tasks", key, "--root", str(tmp_path),
                                 "--base-url", "http://127.0.0.1:9"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "not DataComp's nlphuji/mscoco_2014_5k_test_image_text_retrieval" in " ".join(result.output.split())
    assert sorted(p.name for p in folder.rglob("*")) == ["nshards.txt", "test"]


def test_a_csv_naming_an_image_the_zip_lacks_is_one_line(world, tmp_path):
    files = nlphuji_repo([b"\xff\xd8 not read"], [["one"], ["two"]], "images")
    repo = "nlphuji/flickr_1k_test_image_text_retrieval"
    fake = FakeHub({f"{repo}/test_1k_flickr.csv": files["test.csv"], f"{repo}/images.zip": files["images.zip"]})
    try:
        result = runner.invoke(app, ["download", "evalsets", "--tasks", "retrieval/flickr_1k_test_image_text_retrieval",
                                     "--root", str(tmp_path), "--base-url", fake.url])
    finally:
        fake.server.shutdown()
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "names 1001.jpg, which its image zip does not hold" in " ".join(result.output.split())
