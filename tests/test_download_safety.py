"""Download and extraction safety: proof of completeness, no https downgrade, full disks, bounded extraction.

Everything runs offline: a small local server (below) produces the responses the shared helper
(tests/support/httpserver.py) does not: bodies without Content-Length, chunked bodies, redirects.
"""

from __future__ import annotations

import email.message
import errno
import hashlib
import importlib
import io
import os
import pkgutil
import shutil
import tarfile
import threading
import urllib.error
import urllib.request
import zipfile
from collections import namedtuple
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest

import fnlcore.datasets as datasets_pkg
from fnlcore.datasets import download, mnist, rawfiles
from fnlcore.datasets.download import RemoteFile, fetch
from fnlcore.errors import DataError, StorageError
from tests.support.httpserver import file_server, serve_directory  # noqa: F401  (fixture)

PAYLOAD = bytes(range(256)) * 40 + b"tail"  # 10,244 bytes


# ---- a server that misbehaves in the ways the shared helper does not ------------------------


class _Odd(BaseHTTPRequestHandler):
    """Routes: /close/<n> (no length, closed), /chunked, /chunked-cut, /resume (206 without length),
    /redirect -> /close-length (a 302 to an http URL on the same server), /close-length (normal)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - keep test output quiet
        pass

    def do_GET(self) -> None:
        self.server.paths.append(self.path)  # type: ignore[attr-defined]
        body = PAYLOAD
        self.close_connection = True
        if self.path.startswith("/close/"):  # body ended only by closing: cut or whole, the client cannot tell
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body[: int(self.path.rsplit("/", 1)[1])])
        elif self.path.startswith("/chunked"):
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(body), 4000):
                piece = body[i : i + 4000]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            if self.path == "/chunked":
                self.wfile.write(b"0\r\n\r\n")  # the last chunk; /chunked-cut stops without it
        elif self.path == "/resume":
            start = int(self.headers["Range"].split("=")[1].rstrip("-"))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body[start:])
        elif self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "/close-length")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/close-length":
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
        self.wfile.flush()


@pytest.fixture
def odd() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Odd)
    server.paths = []  # type: ignore[attr-defined]
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def served(file_server):  # noqa: F811
    (file_server.root / "data.bin").write_bytes(PAYLOAD)
    return file_server


def _unchecked(url: str) -> RemoteFile:
    """A file like ISIC's ground truth: no published size, no checksum."""
    return RemoteFile("data.bin", (url,))


# ---- 1. nothing accepted as complete without a length or a checksum -------------------------


@pytest.mark.parametrize("sent", [3000, len(PAYLOAD)])
def test_close_delimited_body_of_an_unchecked_file_is_refused(odd, tmp_path, sent):
    # Cut (3000 bytes) or whole, a body that ends by the connection closing proves nothing.
    url = f"{odd}/close/{sent}"
    with pytest.raises(DataError) as info:
        fetch(_unchecked(url), tmp_path)
    msg = str(info.value)
    assert "data.bin" in msg and url in msg and "no Content-Length" in msg
    assert "mirror" in msg and f"place it at {tmp_path / 'data.bin'}" in msg  # the fix
    assert not (tmp_path / "data.bin").exists()


def test_close_delimited_body_is_fine_when_a_checksum_checks_it(odd, tmp_path):
    remote = RemoteFile("data.bin", (f"{odd}/close/{len(PAYLOAD)}",), md5=hashlib.md5(PAYLOAD).hexdigest())
    assert fetch(remote, tmp_path).read_bytes() == PAYLOAD


def test_chunked_body_that_ends_with_its_last_chunk_is_complete(odd, tmp_path):
    assert fetch(_unchecked(f"{odd}/chunked"), tmp_path).read_bytes() == PAYLOAD


def test_chunked_body_cut_before_its_last_chunk_is_refused(odd, tmp_path):
    with pytest.raises(DataError, match="interrupted"):
        fetch(_unchecked(f"{odd}/chunked-cut"), tmp_path)
    assert not (tmp_path / "data.bin").exists()


def test_content_length_proves_an_unchecked_file_complete(served, tmp_path):
    assert fetch(_unchecked(served.url_for("data.bin")), tmp_path).read_bytes() == PAYLOAD


def test_unchecked_file_from_a_local_folder_mirror_is_accepted(tmp_path):
    # NIH's Data_Entry CSV has no URL and no checksum: it comes from a mirror, often a folder (file://).
    folder = tmp_path / "by_hand"
    folder.mkdir()
    (folder / "data.bin").write_bytes(PAYLOAD)
    assert fetch(RemoteFile("data.bin", ()), tmp_path / "dl", mirrors=[str(folder)]).read_bytes() == PAYLOAD


def test_resume_without_length_completes_by_the_content_range_total(odd, tmp_path):
    (tmp_path / "data.bin.part").write_bytes(PAYLOAD[:3000])
    assert fetch(_unchecked(f"{odd}/resume"), tmp_path).read_bytes() == PAYLOAD


def test_unchecked_part_longer_than_the_server_file_is_not_accepted(served, tmp_path):
    # The server answers 416 "bytes */10244": the 10,248-byte .part is not the file.
    (tmp_path / "data.bin.part").write_bytes(PAYLOAD + b"junk")
    with pytest.raises(DataError, match="longer than the file on the server"):
        fetch(_unchecked(served.url_for("data.bin")), tmp_path)
    assert not (tmp_path / "data.bin").exists() and not (tmp_path / "data.bin.part").exists()
    assert fetch(_unchecked(served.url_for("data.bin")), tmp_path).read_bytes() == PAYLOAD


def test_unchecked_complete_part_is_accepted_by_the_416_total(served, tmp_path):
    (tmp_path / "data.bin.part").write_bytes(PAYLOAD)
    assert fetch(_unchecked(served.url_for("data.bin")), tmp_path).read_bytes() == PAYLOAD
    assert served.requests[0].range == f"bytes={len(PAYLOAD)}-"


# ---- 2. https wherever served; no downgrade on a redirect ---------------------------------


@pytest.mark.parametrize(
    ("src", "dst", "ok"),
    [
        ("https://a.org/f", "http://a.org/f", False),
        ("HTTPS://a.org/f", "http://mirror.org/f", False),
        ("https://a.org/f", "ftp://a.org/f", False),
        ("https://a.org/f", "https://b.org/f", True),
        ("http://a.org/f", "http://b.org/f", True),
        ("http://a.org/f", "https://a.org/f", True),
    ],
)
def test_redirect_rule(src, dst, ok):
    assert download.redirect_allowed(src, dst) is ok


def test_the_openers_redirect_handler_refuses_an_https_downgrade():
    for url in ("https://example.org/f", "http://127.0.0.1:1/f"):  # remote and loopback openers alike
        handlers = [h for h in download._opener_for(url).handlers if isinstance(h, urllib.request.HTTPRedirectHandler)]
        assert len(handlers) == 1
    handler = handlers[0]
    headers = email.message.Message()
    req = urllib.request.Request("https://example.org/f")
    with pytest.raises(urllib.error.HTTPError, match="refused") as info:
        handler.redirect_request(req, io.BytesIO(), 302, "Found", headers, "http://example.org/f")
    assert "http://example.org/f" in str(info.value.reason)
    follow = handler.redirect_request(req, io.BytesIO(), 302, "Found", headers, "https://cdn.example.org/f")
    assert follow.full_url == "https://cdn.example.org/f"


def test_http_to_http_redirect_is_still_followed(odd, tmp_path):
    remote = RemoteFile("data.bin", (f"{odd}/redirect",), md5=hashlib.md5(PAYLOAD).hexdigest())
    assert fetch(remote, tmp_path).read_bytes() == PAYLOAD


def _all_remote_files() -> list[tuple[str, RemoteFile]]:
    found = []

    def walk(obj, where, depth=0):
        if isinstance(obj, RemoteFile):
            found.append((where, obj))
        elif depth < 3 and isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{where}[{k!r}]", depth + 1)
        elif depth < 3 and isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(v, f"{where}[{i}]", depth + 1)
        elif isinstance(getattr(obj, "remote", None), RemoteFile):
            walk(obj.remote, f"{where}.remote", depth + 1)

    for info in pkgutil.iter_modules(datasets_pkg.__path__):
        module = importlib.import_module(f"fnlcore.datasets.{info.name}")
        for name, value in vars(module).items():
            walk(value, f"{info.name}.{name}")
    return found


def test_every_official_url_is_https():
    remotes = _all_remote_files()
    assert {"mnist", "fmnist"} <= set(mnist.REMOTES) and len(remotes) > 20
    plain = [(where, u) for where, r in remotes for u in r.urls if not u.startswith("https://")]
    assert plain == []


# ---- 3. a full disk named as such ---------------------------------------------------------

Usage = namedtuple("Usage", "total used free")


def _zip(path: Path, members: dict[str, bytes], method: int = zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", method) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _tgz(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


MEMBERS = {f"imgs/{i}.png": bytes([i]) * 30_000 for i in range(4)}
NEEDED = sum(len(v) for v in MEMBERS.values())  # 120,000


def _failing_open(code: int, after: int = 10_000):
    """An ``open`` whose files for writing fail with OSError(code) once a write would pass ``after`` bytes."""

    class FailingFile(io.FileIO):
        def write(self, b):  # noqa: ANN001
            if self.tell() + len(b) > after:
                raise OSError(code, os.strerror(code))
            return super().write(b)

    def fake_open(path, mode="r", *args, **kwargs):
        if "w" in mode or "a" in mode:
            return FailingFile(path, mode.replace("b", ""))
        return open(path, mode, *args, **kwargs)

    return fake_open


def _leftovers(raw: Path) -> list[str]:
    return sorted(p.name for p in raw.iterdir() if p.name.endswith((".extracting", ".corrupt")) or p.name == "imgs")


@pytest.mark.parametrize("make", [_zip, _tgz])
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_disk_filling_during_extraction_is_a_storage_error_and_keeps_the_archive(tmp_path, monkeypatch, make, code):
    raw = tmp_path / "raw"
    raw.mkdir()
    arc = make(raw / "a.arc", MEMBERS)
    monkeypatch.setattr(rawfiles, "open", _failing_open(code), raising=False)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10**9, 10**9 - 123_456_789, 123_456_789))
    with pytest.raises(StorageError) as info:
        rawfiles.extract_archive(arc, raw, "imgs")
    msg = str(info.value)
    assert str(raw) in msg and f"{NEEDED:,} bytes" in msg and "123,456,789 bytes" in msg
    assert "corrupt" not in msg.replace("not corrupt", "") and "kept" in msg
    assert arc.exists() and _leftovers(raw) == []  # archive in place, no half-extracted output
    assert rawfiles.read_extraction_marker(raw, "a.arc") is None


@pytest.mark.parametrize("make", [_zip, _tgz])
def test_too_little_free_space_is_refused_before_writing(tmp_path, monkeypatch, make):
    raw = tmp_path / "raw"
    raw.mkdir()
    arc = make(raw / "a.arc", MEMBERS)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10**9, 10**9 - (NEEDED - 1), NEEDED - 1))
    with pytest.raises(StorageError) as info:
        rawfiles.extract_archive(arc, raw, "imgs")
    msg = str(info.value)
    assert str(raw) in msg and f"{NEEDED:,} bytes" in msg and f"{NEEDED - 1:,} bytes" in msg
    assert arc.exists() and _leftovers(raw) == []
    monkeypatch.undo()
    assert rawfiles.extract_archive(arc, raw, "imgs")["members"] == 4  # once there is room, it works


def test_other_write_errors_are_not_called_a_corrupt_archive(tmp_path, monkeypatch):
    raw = tmp_path / "raw"
    raw.mkdir()
    arc = _zip(raw / "a.zip", MEMBERS)
    monkeypatch.setattr(rawfiles, "open", _failing_open(errno.EROFS), raising=False)
    with pytest.raises(DataError, match="cannot write") as info:
        rawfiles.extract_archive(arc, raw, "imgs")
    assert not isinstance(info.value, StorageError) and "corrupt" not in str(info.value)
    assert arc.exists() and _leftovers(raw) == []


def test_disk_filling_during_a_download_stops_at_once_and_keeps_the_part(tmp_path, monkeypatch):
    roots = [tmp_path / "m1", tmp_path / "m2"]
    with serve_directory(roots[0]) as m1, serve_directory(roots[1]) as m2:
        for r in roots:
            (r / "data.bin").write_bytes(PAYLOAD * 10)
        monkeypatch.setattr(download, "open", _failing_open(errno.ENOSPC, after=40_000), raising=False)
        monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10**9, 10**9 - 777, 777))
        remote = RemoteFile("data.bin", (), md5=hashlib.md5(PAYLOAD * 10).hexdigest(), size=len(PAYLOAD) * 10)
        with pytest.raises(StorageError) as info:
            fetch(remote, tmp_path / "dl", mirrors=[m1, m2])
        assert m2.requests == []  # another URL would fill the same disk
    msg = str(info.value)
    assert str(tmp_path / "dl") in msg and f"{len(PAYLOAD) * 10:,} bytes" in msg and "777 bytes" in msg
    assert (tmp_path / "dl" / "data.bin.part").exists() and not (tmp_path / "dl" / "data.bin").exists()


# ---- 4. extraction bounded in total size ---------------------------------------------------

BOMB = 40_000_000  # 40 MB of zeros: deflates to about 40 KB


def _bomb(path: Path, kind: str) -> Path:
    if kind == "zip":
        return _zip(path, {"imgs/zeros.png": bytes(BOMB)}, zipfile.ZIP_DEFLATED)
    return _tgz(path, {"imgs/zeros.png": bytes(BOMB)})


@pytest.mark.parametrize("kind", ["zip", "tgz"])
def test_a_decompression_bomb_is_refused_before_anything_is_written(tmp_path, kind):
    raw = tmp_path / "raw"
    raw.mkdir()
    arc = _bomb(raw / "bomb.arc", kind)
    assert arc.stat().st_size < 100_000
    with pytest.raises(DataError, match="refused to extract") as info:
        rawfiles.extract_archive(arc, raw, "imgs")
    msg = str(info.value)
    assert str(arc) in msg and "decompression bomb" in msg and "left in place" in msg
    assert arc.exists() and _leftovers(raw) == [] and rawfiles.read_extraction_marker(raw, "bomb.arc") is None


@pytest.mark.parametrize("kind", ["zip", "tgz"])
def test_a_member_yielding_more_than_it_declares_is_refused_while_writing(tmp_path, monkeypatch, kind):
    raw = tmp_path / "raw"
    raw.mkdir()
    arc = (_zip if kind == "zip" else _tgz)(raw / "liar.arc", {"imgs/a.png": b"a" * 100, "imgs/b.png": b"b" * 100})
    # Python's readers stop at the declared size, so stand in for a reader that does not.
    if kind == "zip":
        monkeypatch.setattr(zipfile.ZipFile, "open", lambda self, info, *a, **k: io.BytesIO(b"x" * 5000))
    else:
        monkeypatch.setattr(tarfile.TarFile, "extractfile", lambda self, member: io.BytesIO(b"x" * 5000))
    with pytest.raises(DataError, match="more than the 100 bytes it declares"):
        rawfiles.extract_archive(arc, raw, "imgs")
    assert arc.exists() and _leftovers(raw) == []


def test_the_limit_can_be_given_per_archive(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    arc = _zip(raw / "a.zip", MEMBERS)
    with pytest.raises(DataError, match=f"limit of {NEEDED - 1:,} bytes"):
        rawfiles.extract_archive(arc, raw, "imgs", max_bytes=NEEDED - 1)
    assert rawfiles.extract_archive(arc, raw, "imgs", max_bytes=NEEDED)["members"] == 4


def test_incompressible_images_are_far_under_the_default_limit():
    # The real archives (NIH images_*.tar.gz about 2 GB each, ISIC's 9 GB zip) hold PNG/JPEG
    # files that expand by ~1.1x at most; the bound leaves ten times that.
    for size in (1_900_000_000, 9_100_000_000):
        assert rawfiles.extraction_limit(size) >= 9 * int(1.1 * size)
    assert rawfiles.extraction_limit(40_000) < BOMB  # the 40 KB -> 40 MB zip


