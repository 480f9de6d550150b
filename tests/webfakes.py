"""Offline stand-ins for the web: a Hugging Face Hub, an image host with planted failures, DataComp metadata."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

COMMIT = "c0ffee" * 6 + "abcd"  # a 40-hex commit id
FAILURE_KINDS = ("missing", "slow", "corrupt", "html")


class _Server:
    def start(self, handler) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class FakeHub(_Server):
    """What huggingface_hub asks of the Hub (repo info, the file tree, resolve), answered the way
    the real Hub answers, not more kindly:

    - large files (``LFS_SUFFIXES``) live in LFS: ``resolve`` answers 302 to a CDN on another host
      (``localhost`` here, the Hub being ``127.0.0.1``) with ``X-Linked-Etag`` (the sha256) and
      ``X-Linked-Size``, while its own ``ETag`` is the pointer's git blob id; the CDN serves the
      bytes, with ranges, under yet another ETag (``cut_next`` drops a transfer halfway);
    - those files are Xet-backed (``xet``): the 302 also carries ``X-Xet-Hash`` and a ``xet-auth``
      link, and the tree gives ``xetHash``; the token route the link names is recorded and refused,
      as a stand-in cannot speak Xet's protocol;
    - the recursive tree comes in pages of ``page_size`` entries, folders included, each page
      naming the next in a ``Link: <...>; rel="next"`` header.
    """

    LFS_SUFFIXES = (".parquet", ".npz", ".bin", ".pt", ".safetensors")

    def __init__(self, repos: dict[str, dict[str, bytes]], page_size: int = 2, xet: bool = True,
                 models: dict[str, dict[str, bytes]] | None = None, tokens: tuple[str, ...] = ()):
        self.repos, self.requests, self.page_size, self.xet = repos, [], page_size, xet
        self.cut_next: set[str] = set()  # CDN paths whose next transfer stops halfway
        # Model repositories, writable with one of ``tokens``: created private or public, read (private ones
        # with a token only), committed to through the LFS batch API and the commit endpoint.
        self.models = dict(models or {})
        self.private: set[str] = set()
        self.tokens = set(tokens)
        self.staged: dict[str, bytes] = {}  # LFS objects uploaded to the CDN, by sha256
        self.refuse_commit = False  # the next commits fail with a 500, as a Hub outage would
        self.authorized: list[tuple[str, str]] = []  # (Host, path) of every request that carried a token
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def reply(self, code: int, body: bytes = b"", headers: dict | None = None, head: bool = False):
                self.send_response(code)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def serve(self, head: bool):
                url = urlparse(self.path)
                parts = url.path.strip("/").split("/")
                hub.requests.append((self.command, "/".join(parts), self.headers.get("Host", "")))
                if self.headers.get("Authorization"):
                    hub.authorized.append((self.headers.get("Host", ""), "/".join(parts)))
                if parts[:2] == ["api", "models"] or (len(parts) > 3 and "/".join(parts[:2]) in hub.models
                                                      and parts[2] == "resolve"):
                    return self.model_read(parts, parse_qs(url.query), head)
                if parts[:2] == ["api", "datasets"]:
                    repo = "/".join(parts[2:4])
                    files = hub.repos.get(repo)
                    if files is None:
                        return self.reply(404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})
                    if len(parts) == 4 or parts[4] == "revision":
                        body = {"id": repo, "sha": COMMIT, "siblings": [{"rfilename": name} for name in files]}
                        return self.reply(200, json.dumps(body).encode(), {"Content-Type": "application/json"})
                    if parts[4] == "tree":
                        return self.tree(repo, files, parse_qs(url.query))
                    return self.reply(403, b'{"error": "no Xet here"}')  # xet-read-token and anything else
                if parts[0] == "datasets" and len(parts) > 5 and parts[3] == "resolve":
                    repo, name = "/".join(parts[1:3]), "/".join(parts[5:])
                    data = hub.repos.get(repo, {}).get(name)
                    if data is None:
                        return self.reply(404, b"", {"X-Error-Code": "EntryNotFound"})
                    if not hub.is_lfs(name):
                        return self.content(data, {"X-Repo-Commit": COMMIT, "ETag": f'"{git_blob_id(data)}"'}, head)
                    sha = hashlib.sha256(data).hexdigest()
                    headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{git_blob_id(lfs_pointer(data))}"',
                               "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data)),
                               "Location": f"http://localhost:{hub.server.server_port}/cdn/{repo}/{name}"}
                    if hub.xet:
                        headers["X-Xet-Hash"] = hashlib.sha256(b"xet" + data).hexdigest()
                        headers["Link"] = (f'<{hub.url}/api/datasets/{repo}/xet-read-token/{COMMIT}>; rel="xet-auth"')
                    return self.reply(302, b"", headers, head)
                if parts[0] == "cdn":
                    repo = "/".join(parts[1:3])
                    data = {**hub.repos, **hub.models}.get(repo, {}).get("/".join(parts[3:]))
                    if data is None:
                        return self.reply(404, head=head)
                    if not head and "/".join(parts[1:]) in hub.cut_next:
                        hub.cut_next.discard("/".join(parts[1:]))
                        self.send_response(200)
                        self.send_header("Content-Length", str(len(data)))
                        self.end_headers()
                        self.wfile.write(data[:len(data) // 2])  # then drop the connection
                        self.close_connection = True
                        return
                    return self.content(data, {"ETag": f'"{hashlib.md5(data).hexdigest()}-1"'}, head)
                if parts[0] == "assets" and "/".join(parts[1:]) in hub.repos.get("assets", {}):
                    return self.reply(200, hub.repos["assets"]["/".join(parts[1:])], head=head)
                self.reply(404, head=head)

            def content(self, data: bytes, headers: dict, head: bool):
                headers = {**headers, "Accept-Ranges": "bytes"}
                start = int(self.headers["Range"].split("=")[1].split("-")[0]) if self.headers.get("Range") else 0
                if start:
                    headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                return self.reply(206 if start else 200, data[start:], headers, head)

            def tree(self, repo: str, files: dict[str, bytes], query: dict):
                entries = hub.tree_entries(files)
                start = int(query.get("cursor", ["0"])[0])
                page = entries[start:start + hub.page_size]
                headers = {"Content-Type": "application/json"}
                if start + hub.page_size < len(entries):
                    rest = "&".join(f"{k}={v[0]}" for k, v in query.items() if k != "cursor")
                    headers["Link"] = (f'<{hub.url}{urlparse(self.path).path}?{rest}&cursor={start + hub.page_size}>; '
                                       f'rel="next"')
                return self.reply(200, json.dumps(page).encode(), headers)

            def readable(self, repo: str) -> bool:
                """A model repository this request may see: public, or private with a valid token."""
                return repo in hub.models and (repo not in hub.private or self.token() in hub.tokens)

            def token(self) -> str:
                return self.headers.get("Authorization", "").removeprefix("Bearer ")

            def model_read(self, parts: list[str], query: dict, head: bool):
                if parts[0] == "api":
                    repo = "/".join(parts[2:4])
                    if not self.readable(repo):
                        return self.reply(401 if repo in hub.models else 404,
                                          b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})
                    files = hub.models[repo]
                    if len(parts) == 4 or parts[4] == "revision":
                        body = {"id": repo, "sha": COMMIT, "private": repo in hub.private,
                                "siblings": [{"rfilename": name} for name in files]}
                        return self.reply(200, json.dumps(body).encode(), {"Content-Type": "application/json"})
                    if parts[4] == "tree":
                        return self.tree(repo, files, query)
                    return self.reply(403, b'{"error": "no Xet here"}')
                repo, name = "/".join(parts[:2]), "/".join(parts[4:])
                if not self.readable(repo):
                    return self.reply(401, b"", {"X-Error-Code": "RepoNotFound"}, head)
                data = hub.models[repo].get(name)
                if data is None:
                    return self.reply(404, b"", {"X-Error-Code": "EntryNotFound"}, head)
                if not hub.is_lfs(name):
                    return self.content(data, {"X-Repo-Commit": COMMIT, "ETag": f'"{git_blob_id(data)}"'}, head)
                headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{git_blob_id(lfs_pointer(data))}"',
                           "X-Linked-Etag": f'"{hashlib.sha256(data).hexdigest()}"', "X-Linked-Size": str(len(data)),
                           "Location": f"http://localhost:{hub.server.server_port}/cdn/{repo}/{name}"}
                return self.reply(302, b"", headers, head)

            def body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def write(self, method: str):
                """The write side of the Hub: create and delete a repository, preupload, LFS batch, upload
                (on the CDN's host), verify, commit."""
                url = urlparse(self.path)
                parts = url.path.strip("/").split("/")
                hub.requests.append((method, "/".join(parts), self.headers.get("Host", "")))
                data = self.body()
                if self.headers.get("Authorization"):
                    hub.authorized.append((self.headers.get("Host", ""), "/".join(parts)))
                if parts[:2] == ["upload", "lfs"] and method == "PUT":  # the CDN: no token needed, none expected
                    hub.staged[parts[2]] = data
                    return self.reply(200)
                if self.token() not in hub.tokens:
                    return self.reply(401, b'{"error": "Invalid credentials in Authorization header"}')
                payload = json.loads(data) if data and "ndjson" not in self.headers.get("Content-Type", "") else {}
                if parts == ["api", "validate-yaml"]:
                    return self.reply(200, b"{}", {"Content-Type": "application/json"})
                if parts[:2] == ["api", "repos"]:
                    repo = f"{payload.get('organization')}/{payload['name']}"
                    if parts[2] == "create":
                        if repo in hub.models:
                            return self.reply(409, b'{"error": "You already created this model repo"}')
                        hub.models[repo] = {}
                        if payload.get("visibility", "private" if payload.get("private") else "public") == "private":
                            hub.private.add(repo)
                        return self.reply(200, json.dumps({"url": f"{hub.url}/{repo}"}).encode(),
                                          {"Content-Type": "application/json"})
                    if parts[2] == "delete" and repo in hub.models:
                        del hub.models[repo]
                        hub.private.discard(repo)
                        return self.reply(200)
                    return self.reply(404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})
                if parts[:2] == ["api", "models"] and "/".join(parts[2:4]) in hub.models:
                    repo = "/".join(parts[2:4])
                    if parts[4] == "preupload":
                        files = [{"path": f["path"], "uploadMode": "lfs" if hub.is_lfs(f["path"]) else "regular",
                                  "shouldIgnore": False} for f in payload["files"]]
                        return self.reply(200, json.dumps({"files": files}).encode(), {"Content-Type": "application/json"})
                    if parts[4] == "commit":
                        if hub.refuse_commit:
                            return self.reply(500, b'{"error": "Internal Error"}')
                        files = dict(hub.models[repo])
                        for line in data.decode().splitlines():
                            entry = json.loads(line)
                            if entry["key"] == "file":
                                files[entry["value"]["path"]] = base64.b64decode(entry["value"]["content"])
                            elif entry["key"] == "lfsFile":
                                files[entry["value"]["path"]] = hub.staged[entry["value"]["oid"]]
                        hub.models[repo] = files
                        return self.reply(200, json.dumps({"commitUrl": f"{hub.url}/{repo}/commit/{COMMIT}",
                                                           "commitOid": COMMIT}).encode(),
                                          {"Content-Type": "application/json"})
                if len(parts) == 6 and parts[2:] == ["info", "lfs", "objects", "batch"] and \
                        "/".join(parts[:2]).removesuffix(".git") in hub.models:
                    cdn = f"http://localhost:{hub.server.server_port}/upload/lfs"
                    objects = [{"oid": o["oid"], "size": o["size"], "authenticated": True,
                                "actions": {"upload": {"href": f"{cdn}/{o['oid']}"},
                                            "verify": {"href": f"{hub.url}/verify/{o['oid']}"}}}
                               for o in payload["objects"]]
                    return self.reply(200, json.dumps({"transfer": "basic", "objects": objects}).encode(),
                                      {"Content-Type": "application/vnd.git-lfs+json"})
                if parts[0] == "verify" and len(hub.staged.get(parts[1], b"")) == payload.get("size"):
                    return self.reply(200, b"{}")
                return self.reply(404, b'{"error": "not found"}')

            def do_POST(self):
                self.write("POST")

            def do_PUT(self):
                self.write("PUT")

            def do_DELETE(self):
                self.write("DELETE")

            def do_GET(self):
                self.serve(head=False)

            def do_HEAD(self):
                self.serve(head=True)

        self.start(Handler)

    def is_lfs(self, name: str) -> bool:
        return name.endswith(self.LFS_SUFFIXES)

    def tree_entries(self, files: dict[str, bytes]) -> list[dict]:
        """The recursive listing as the Hub gives it: folders, then files, each with git and LFS ids."""
        folders = sorted({"/".join(name.split("/")[:i]) for name in files for i in range(1, name.count("/") + 1)})
        entries = [{"type": "directory", "oid": hashlib.sha1(f.encode()).hexdigest(), "path": f} for f in folders]
        for name, data in sorted(files.items()):
            entry = {"type": "file", "path": name, "size": len(data), "oid": git_blob_id(data)}
            if self.is_lfs(name):
                entry["oid"] = git_blob_id(lfs_pointer(data))
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                                "pointerSize": len(lfs_pointer(data))}
                if self.xet:
                    entry["xetHash"] = hashlib.sha256(b"xet" + data).hexdigest()
            entries.append(entry)
        return entries

    def xet_requests(self) -> list:
        return [r for r in self.requests if "xet-read-token" in r[1]]


def lfs_pointer(data: bytes) -> bytes:
    return (f"version https://git-lfs.github.com/spec/v1\noid sha256:{hashlib.sha256(data).hexdigest()}\n"
            f"size {len(data)}\n").encode()


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class ImageHost(_Server):
    """``/ok/N.jpg`` images; planted failures: ``/missing`` (404), ``/slow`` (answers after ``slow_s``),
    ``/corrupt`` (JPEG header, garbage body), ``/html`` (a web page)."""

    def __init__(self, slow_s: float = 4.0, delay_s: float = 0.0):
        self.slow_s, self.delay_s, self.requests = slow_s, delay_s, []
        host = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                kind, name = self.path.strip("/").split("/", 1)
                host.requests.append(self.path)
                try:
                    if host.delay_s:
                        time.sleep(host.delay_s)
                    if kind == "missing":
                        self.send_error(404, "File not found")
                        return
                    if kind == "slow":
                        time.sleep(host.slow_s)
                    if kind == "html":
                        body, kind_header = b"<html><body>not an image</body></html>", "text/html"
                    elif kind == "corrupt":
                        body, kind_header = b"\xff\xd8\xff\xe0" + bytes(random.Random(name).randbytes(2000)), "image/jpeg"
                    else:
                        body, kind_header = image_bytes(int(name.split(".")[0])), "image/jpeg"
                    self.send_response(200)
                    self.send_header("Content-Type", kind_header)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up on a slow answer
                    pass

        self.start(Handler)


def image_bytes(i: int) -> bytes:
    rng = random.Random(i)
    image = Image.new("RGB", (40 + i % 30, 32 + i % 20), tuple(rng.randrange(256) for _ in range(3)))
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG")
    return buffer.getvalue()


def uid_of(i: int) -> str:
    return hashlib.md5(f"sample {i}".encode()).hexdigest()


def datacomp_metadata(host_url: str, files: int, rows: int, failures: dict[int, str], seed: int = 0,
                      dim: int = 16, captions=None, clusters=None) -> dict[str, bytes]:
    """Parquet (DataComp's columns) and npz files of a synthetic pool, as the Hub serves them.

    Scores are multiples of 0.01, so many rows tie; ``failures`` maps a global row to a failure
    kind (missing, slow, corrupt, html); ``clusters[i]`` picks the centroid row i's L/14 image
    embedding sits next to (see ``centroids``).
    """
    # A misspelt kind would be served as a good image and silently change the planted rate.
    assert set(failures.values()) <= set(FAILURE_KINDS), f"unknown failure kinds in {failures}"
    rng = np.random.default_rng(seed)
    out = {}
    for f in range(files):
        index = np.arange(f * rows, (f + 1) * rows)
        kinds = [failures.get(int(i), "ok") for i in index]
        table = pa.table({
            "uid": [uid_of(int(i)) for i in index],
            "url": [f"{host_url}/{k}/{i}.jpg" for k, i in zip(kinds, index)],
            "text": [captions[i] if captions is not None else f"a photo of thing {i}" for i in index],
            "original_width": rng.integers(100, 900, rows), "original_height": rng.integers(100, 900, rows),
            "clip_b32_similarity_score": rng.integers(10, 40, rows) / 100,
            "clip_l14_similarity_score": rng.integers(10, 40, rows) / 100,
            "face_bboxes": [[[0.1, 0.1, 0.3, 0.3]] if i % 7 == 0 else [] for i in index],
        })
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        name = f"{f:04d}{'ab' * 14}"  # DataComp's metadata files are named by a hash
        out[f"{name}.parquet"] = buffer.getvalue()
        cent = centroids(dim)
        picked = np.asarray(clusters)[index] if clusters is not None else np.zeros(rows, dtype=int)
        l14 = (cent[picked] + 0.05 * rng.standard_normal((rows, dim))).astype(np.float16)
        buffer = io.BytesIO()
        np.savez(buffer, l14_img=l14, l14_txt=l14, b32_img=l14, b32_txt=l14)
        out[f"{name}.npz"] = buffer.getvalue()
    return out


def centroids(dim: int = 16, k: int = 8) -> np.ndarray:
    """(k, dim) well-separated unit vectors (scaled basis vectors), so nearest-centroid answers are exact."""
    return np.eye(k, dim, dtype=np.float32)


def write_wordnet(folder, parents: dict[str, tuple[str, ...]], lemmas: dict[str, str]) -> None:
    """A WordNet in Princeton's database format (what nltk's reader reads), holding only the noun synsets
    named: each ``n<offset>`` line written at its own byte offset of ``data.noun`` (the offset is the
    synset's id, as in the real file; the gaps are header lines, which start with two spaces), its
    hypernyms as ``@`` pointers; ``index.noun`` lists each lemma's synset. The other parts of speech are
    empty files."""
    folder.mkdir(parents=True, exist_ok=True)
    # One lexicographer file for every synset: nltk checks the numbering, not which file a synset is from.
    (folder / "lexnames").write_text("00\tadj.all\t3\n01\tadj.pert\t3\n02\tadv.all\t4\n03\tnoun.Tops\t1\n")
    data = bytearray()
    for wnid in sorted(lemmas, key=lambda w: int(w[1:])):
        offset = int(wnid[1:])
        gap = offset - len(data)
        if gap < 3:
            raise ValueError(f"{wnid} leaves no room for the line before it")  # the test's own table
        data += b"  " + b" " * (gap - 3) + b"\n"
        up = parents.get(wnid, ())
        pointers = "".join(f" @ {int(p[1:]):08d} n 0000" for p in up)
        data += f"{offset:08d} 03 n 01 {lemmas[wnid]} 0 {len(up):03d}{pointers} | a stand-in synset  \n".encode()
    (folder / "data.noun").write_bytes(bytes(data))
    index = sorted(f"{lemmas[w]} n 1 1 @ 1 0 {int(w[1:]):08d}  " for w in lemmas)
    (folder / "index.noun").write_text("\n".join(index) + "\n")
    for name in ("data.adj", "data.adv", "data.verb", "index.adj", "index.adv", "index.verb", "adj.exc", "adv.exc",
                 "noun.exc", "verb.exc", "index.sense", "cntlist.rev"):
        (folder / name).write_text("")


def nltk_package(folder, package: str) -> bytes:
    """``folder``'s files zipped as nltk's server holds a package: one top-level folder named by its id."""
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(folder.iterdir()):
            z.write(path, f"{package}/{path.name}")
    return buffer.getvalue()


class FakeNltkData(_Server):
    """nltk's data server: ``/index.xml`` listing each package (id, url, sizes, md5 and sha256), and the
    packages' zip files; ``corrupt`` names packages served with their last byte changed (the index keeps
    the true checksum)."""

    def __init__(self, packages: dict[str, tuple[bytes, int]]):
        self.packages, self.corrupt, self.requests = packages, set(), []
        data = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                name = self.path.strip("/")
                data.requests.append(name)
                if name == "index.xml":
                    body = data.index().encode()
                elif name.endswith(".zip") and name[:-4] in data.packages:
                    body = data.packages[name[:-4]][0]
                    if name[:-4] in data.corrupt:
                        body = body[:-1] + bytes([body[-1] ^ 1])
                else:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.start(Handler)

    def index(self) -> str:
        rows = [f'<package id="{pid}" name="{pid}" subdir="corpora" unzip="0" url="{self.url}/{pid}.zip" '
                f'size="{len(body)}" unzipped_size="{unzipped}" checksum="{hashlib.md5(body).hexdigest()}" '
                f'sha256_checksum="{hashlib.sha256(body).hexdigest()}" />'
                for pid, (body, unzipped) in self.packages.items()]
        return f"<?xml version='1.0'?>\n<nltk_data><packages>{''.join(rows)}</packages><collections /></nltk_data>\n"


class StaticHost(_Server):
    """Files by path (``/name``), each request's path and Authorization header recorded; ``redirects`` maps a
    path to a URL answered with 302 (a host handing a download to its CDN)."""

    def __init__(self, files: dict[str, bytes], redirects: dict[str, str] | None = None):
        self.files, self.redirects, self.requests = files, redirects or {}, []
        host = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                name = self.path.lstrip("/")
                host.requests.append((name, self.headers.get("Authorization")))
                if name in host.redirects:
                    self.send_response(302)
                    self.send_header("Location", host.redirects[name])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = host.files.get(name)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

        self.start(Handler)
