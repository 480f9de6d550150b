"""Fetching files over HTTP(S) with resume and checksums: the one place euclip's downloads share.

Files are addressed by plain URLs (Hugging Face's ``resolve/main`` and ``raw/main`` ones, or an
asset host's), so every downloader is tested offline against a server on 127.0.0.1. A transfer
goes into ``NAME.part``, continues with an HTTP range request after an interruption, is checked
against its Git LFS pointer (size and sha256) when there is one, and only then renamed into place.

Written with urllib rather than ``huggingface_hub``: these are single files at known URLs that
any HTTP server can serve; the Hub's own API (metadata trees) goes through ``huggingface_hub``
in ``euclip_cli.download.webshards``.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from euclip_cli.errors import Failure, UsageError

CHUNK = 1 << 20
TIMEOUT_S = 60


class FetchError(Failure):
    """A file could not be fetched or failed its check; nothing verified was deleted, and rerunning continues."""


@dataclass
class LfsPointer:
    sha256: str
    size: int


def parse_pointer(text: str) -> Optional[LfsPointer]:
    """The oid and size of a Git LFS pointer file, or None when ``text`` is not one."""
    fields = dict(line.split(" ", 1) for line in text.splitlines() if " " in line)
    if not fields.get("version", "").startswith("https://git-lfs") or "oid" not in fields:
        return None
    return LfsPointer(fields["oid"].split(":", 1)[1].strip(), int(fields["size"]))


def hub_hosts() -> set[str]:
    """The hosts that may see the user's Hugging Face token: the Hub's, and the endpoint the user set
    (``HF_ENDPOINT``, a mirror); never another host this module fetches from (Dropbox, a CDN, an asset host)."""
    from urllib.parse import urlparse

    hosts = {"huggingface.co", "hf.co"}
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "")).hostname
    return hosts | ({endpoint} if endpoint else set())


def open_url(url: str, start: int = 0):
    from urllib.parse import urlparse

    check_hub_environment()  # the token may go into a header, and the endpoint decides where
    headers = {"Range": f"bytes={start}-"} if start else {}
    request = urllib.request.Request(url, headers=headers)
    if os.environ.get("HF_TOKEN") and urlparse(url).hostname in hub_hosts():
        # Gated repos (WinoGAViL) need the user's token; unredirected, so the CDN a download is redirected
        # to never receives it.
        request.add_unredirected_header("Authorization", f"Bearer {os.environ['HF_TOKEN']}")
    try:
        return urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as err:
        if err.code in (401, 403):
            raise FetchError(f"{url}: HTTP {err.code}: the repository is gated; accept its terms on Hugging Face "
                                f"and set HF_TOKEN") from None
        raise FetchError(f"{url}: HTTP {err.code} {err.reason}") from None
    except (urllib.error.URLError, OSError) as err:
        raise FetchError(f"could not reach {url} ({getattr(err, 'reason', err)}); check the network "
                            f"connection or --base-url") from None


def fetch_text(url: str) -> str:
    with open_url(url) as response:
        return response.read().decode("utf-8")


def fetch_pointer(url: str) -> Optional[LfsPointer]:
    """The LFS pointer served at a ``raw/main`` URL; None when the file is stored in git itself."""
    with open_url(url) as response:
        head = response.read(1024)  # a pointer is ~130 bytes; a plain file is not read in full
    try:
        return parse_pointer(head.decode("utf-8"))
    except UnicodeDecodeError:
        return None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_file(url: str, dest: Path, expected: Optional[LfsPointer],
               on_bytes: Callable[[int], None] = lambda n: None) -> None:
    """Download ``url`` to ``dest`` through ``dest.part``, continuing a partial file; verify; rename."""
    part = dest.with_name(dest.name + ".part")
    start = part.stat().st_size if part.exists() else 0
    if expected and start > expected.size:
        part.unlink()
        start = 0
    if not expected or start < expected.size:
        try:
            with open_url(url, start) as response:
                mode = "ab" if start and response.status == 206 else "wb"  # 200: the server ignored the range
                if mode == "wb":
                    start = 0
                on_bytes(start)
                with part.open(mode) as f:
                    for block in iter(lambda: response.read(CHUNK), b""):
                        f.write(block)
                        on_bytes(len(block))
        except (OSError, http.client.HTTPException) as err:  # a connection cut mid-file: the .part file stays for the next run
            raise FetchError(f"{url}: transfer interrupted ({err}); run the same command again to continue") from None
    if expected:
        size = part.stat().st_size
        if size < expected.size:  # the server closed early without an error: keep what came
            raise FetchError(f"{url}: transfer interrupted at {size} of {expected.size} bytes; "
                                f"run the same command again to continue")
        if size != expected.size or sha256_of(part) != expected.sha256:
            part.unlink()
            raise FetchError(f"{url}: downloaded file fails its checksum (size {size}, expected {expected.size}); "
                                f"run the same command again")
    os.replace(part, dest)


def is_complete(dest: Path, expected: Optional[LfsPointer], verified_before: bool) -> bool:
    """A final file was checksummed when it was renamed into place; once the task's marker exists,
    its size alone is re-checked (hashing gigabytes on every run would dominate a no-op)."""
    if not dest.exists():
        return False
    if expected is None:
        return True
    if dest.stat().st_size != expected.size:
        return False
    return verified_before or sha256_of(dest) == expected.sha256


def fetch_lfs(repo: str, rel: str, dest: Path, verified_before: bool,
              on_progress: Callable[[str, int, Optional[int]], None]) -> bool:
    """``repo``'s file ``rel`` into ``dest`` unless already there and intact; True when it was fetched."""
    pointer = fetch_pointer(f"{repo}/raw/main/{rel}")
    if is_complete(dest, pointer, verified_before):
        return False
    on_progress(rel, 0, pointer.size if pointer else None)
    fetch_file(f"{repo}/resolve/main/{rel}", dest, pointer, lambda n: on_progress(rel, n, None))
    return True


def configure_hub_client() -> None:
    """Settings for huggingface_hub's shared HTTP client, applied before each use of the Hub.

    - A read timeout of ``TIMEOUT_S`` on every call: huggingface_hub's client has none for its API
      calls (repo info, the file tree), so a Hub that accepts the connection and never answers
      would hold the command forever. Its downloads keep their own timeouts and retries.
    - Plain HTTP for Xet-backed files (the Hub's ``resolve`` redirect), unless the user chose
      otherwise with ``HF_HUB_DISABLE_XET``: with ``hf_xet`` installed, huggingface_hub would
      use Xet's own protocol, which no offline stand-in serves, so that path could never be tested
      here. HTTP is the path the tests exercise (LFS redirects with ``X-Linked-Etag`` and
      ``X-Linked-Size``, range resumes); ``HF_HUB_DISABLE_XET=0`` restores Xet, untested by euclip.
    """
    from huggingface_hub import constants, get_session

    check_hub_environment()
    if os.environ.get("HF_HUB_DISABLE_XET") is None:
        constants.HF_HUB_DISABLE_XET = True
    session = get_session()
    # huggingface_hub passes ``timeout=None`` per request, overriding any client default; a request
    # hook (httpx's public event hooks) bounds what it left unbounded just before each request is sent.
    if _bounded_timeouts not in session.event_hooks["request"]:
        session.event_hooks = {**session.event_hooks, "request": [*session.event_hooks["request"], _bounded_timeouts]}


def check_hub_environment() -> None:
    """The Hugging Face variables euclip's Hub calls read, checked before any is used: a token holding a space,
    a line break (pasted with its newline) or a character that is not ASCII would be sent as a malformed
    header, an endpoint that is not an http(s) URL fails deep inside the client. Each is a usage error
    naming the variable (the endpoint: ``check_hub_endpoint``)."""
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        token = os.environ.get(name)
        # A token is printable ASCII: anything else cannot go into an HTTP header.
        if token is not None and (not token.strip() or not all(c.isascii() and c.isprintable() and not c.isspace()
                                                                for c in token)):
            what = ("nothing" if not token.strip()
                    else "a space, a line break, a control character or a character that is not ASCII")
            raise UsageError(f"environment variable {name} holds {what}: set it to the token alone (hf_...), or "
                             f"unset it")
    check_hub_endpoint()


def check_hub_endpoint() -> None:
    """HF_ENDPOINT, an http(s) URL where set: huggingface_hub parses it as it is imported (open_clip imports it
    with every model), so a malformed one fails there, whatever the command; a usage error naming it."""
    from urllib.parse import urlparse

    endpoint = os.environ.get("HF_ENDPOINT")
    if endpoint is not None:
        try:
            url = urlparse(endpoint.strip())
            host = url.hostname
        except ValueError:  # urllib refuses some malformed URLs outright ('http://[bad': an unclosed IPv6 host)
            host = None
        if host is None or url.scheme not in ("http", "https") or endpoint != endpoint.strip():
            raise UsageError(f"environment variable HF_ENDPOINT={endpoint!r} is not an http(s) URL such as "
                             f"https://huggingface.co: set it to the Hub's URL, or unset it")


def check_reachable(variable: str, address: str, default_port: int, seconds: float = 10.0) -> None:
    """Connect to ``address`` (``[scheme://]host[:port]``, the value of environment variable ``variable``) within
    ``seconds``, or raise a Failure naming the variable: a client that waits for an absent cluster would hang."""
    import socket
    from urllib.parse import urlparse

    try:
        url = urlparse(address if "://" in address else f"tcp://{address}")
        host, port = url.hostname, url.port or default_port
    except ValueError:  # a port that is not a number, an unclosed IPv6 bracket ('[')
        host = port = None
    not_an_address = f"environment variable {variable}={address!r} is not an address (host:port): fix it or unset it"
    if not host:
        raise UsageError(not_an_address)
    try:
        with socket.create_connection((host, port), timeout=seconds):
            pass
    except UnicodeError:  # a host name IDNA cannot encode: a control character, an empty or over-long label
        raise UsageError(not_an_address) from None
    except OSError as err:
        raise Failure(f"environment variable {variable}={address!r}: nothing answers at {host}:{port} "
                      f"({err.strerror or type(err).__name__}); start the cluster there, or unset {variable}") from None


# Ray's head node port (``ray start --head``), when RAY_ADDRESS names a host alone.
RAY_PORT = 6379


def check_ray_address() -> None:
    """RAY_ADDRESS, where set to a cluster's address, must answer: Ray would wait for it for minutes. Its
    keywords ("auto", "local") are Ray's to resolve."""
    address = os.environ.get("RAY_ADDRESS", "").strip()
    if address and address not in ("auto", "local"):
        check_reachable("RAY_ADDRESS", address, RAY_PORT)


def _bounded_timeouts(request) -> None:
    """Give every phase of an httpx request without a timeout ``TIMEOUT_S``."""
    timeout = request.extensions.get("timeout") or {}
    request.extensions["timeout"] = {phase: TIMEOUT_S if timeout.get(phase) is None else timeout[phase]
                                     for phase in ("connect", "read", "write", "pool")}
