"""``euclip download evalsets`` against a Hugging Face-shaped server on 127.0.0.1: fetch, verify, resume."""

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from euclip_cli.cli import app
from euclip_cli.evaluate.evalsets import DownloadError, download_task, parse_pointer, repo_for
from euclip_cli.evaluate.tasks import TASKS

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
                repo, kind, rel = "/".join(parts[:2]), parts[2], "/".join(parts[4:])
                data = hub.files.get(f"{repo}/{rel}")
                hub.requests.append((kind, rel, self.headers.get("Range")))
                if data is None:
                    self.send_error(404)
                    return
                if kind == "raw" and rel.endswith(".tar"):
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
    with pytest.raises(DownloadError, match="WinoGAViL"):
        repo_for(TASKS["misc/winogavil"])
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
    with pytest.raises(DownloadError, match="run the same command again"):
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
    with pytest.raises(DownloadError, match="checksum"):
        download_task(TASKS["imagenet1k"], folder, fake.url)
    assert not (folder / "test" / "1.tar").exists() and not (folder / "test" / "1.tar.part").exists()


def test_an_unreachable_host_is_one_clear_error(tmp_path):
    result = runner.invoke(app, ["download", "evalsets", "--tasks", "imagenet1k", "--root", str(tmp_path),
                                 "--base-url", "http://127.0.0.1:9"])
    assert result.exit_code == 1 and "could not reach" in result.output and "Traceback" not in result.output
