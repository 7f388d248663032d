"""A tiny local HTTP file server for downloader tests (127.0.0.1 only).

``serve_directory(root)`` serves the files under ``root`` from a
``ThreadingHTTPServer`` in a daemon thread and yields a :class:`ServedDirectory`:
a ``str`` holding the base URL (``"http://127.0.0.1:PORT"``) that also carries
the request log and the knobs that simulate misbehaving servers. The knobs are
plain attributes, so a test may change them between two downloads (e.g. cut a
transfer first, then serve the whole file to test the resume)::

    with serve_directory(tmp_path) as url:
        url.truncate["a.bin"] = 10        # announce the full length, send 10 bytes
        ...
        url.truncate.clear()
        ...
        assert url.requests[-1].range == "bytes=10-"

Supported: ``HEAD`` and ``GET``; ``Range: bytes=N-`` and ``bytes=N-M`` answered
with ``206`` and ``Content-Range`` (``416`` when ``N`` is past the end);
``ignore_range=True`` answers every GET with ``200`` and the whole file;
``truncate={name: n}`` closes the connection after ``n`` body bytes of every
response for ``name`` while announcing the full ``Content-Length``;
``fail={name: status}`` answers that path with an HTTP error status.

The pytest fixture :func:`file_server` serves a fresh temporary directory
(``file_server.root``); import it into a test module to use it.
"""

from __future__ import annotations

import contextlib
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator
from urllib.parse import unquote, urlsplit

import pytest

__all__ = ["RecordedRequest", "ServedDirectory", "serve_directory", "file_server"]

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server received: method, decoded path (no query) and Range header."""

    method: str
    path: str
    range: str | None

    @property
    def name(self) -> str:
        """The path relative to the served root (no leading slash)."""
        return self.path.lstrip("/")


class ServedDirectory(str):
    """The base URL (a ``str``) plus the server's request log and behaviour knobs."""

    root: Path
    requests: list[RecordedRequest]
    ignore_range: bool
    truncate: dict[str, int]
    fail: dict[str, int]

    def __new__(cls, url: str, root: Path, *, ignore_range: bool, truncate: dict[str, int] | None):
        self = super().__new__(cls, url)
        self.root = root
        self.requests = []
        self.ignore_range = ignore_range
        self.truncate = dict(truncate or {})
        self.fail = {}
        return self

    @property
    def url(self) -> str:
        return str(self)

    def url_for(self, name: str) -> str:
        """Full URL of a served file."""
        return f"{self}/{name}"

    def requests_for(self, name: str, method: str | None = None) -> list[RecordedRequest]:
        """Requests made for ``name`` (optionally only those with ``method``)."""
        return [r for r in self.requests if r.name == name and (method is None or r.method == method)]


def _make_handler(state: ServedDirectory, lock: threading.Lock) -> type[BaseHTTPRequestHandler]:
    root = state.root.resolve()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - keep test output quiet
            pass

        def do_HEAD(self) -> None:
            self._serve(send_body=False)

        def do_GET(self) -> None:
            self._serve(send_body=True)

        def _serve(self, send_body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            range_header = self.headers.get("Range")
            with lock:
                state.requests.append(RecordedRequest(self.command, path, range_header))
            name = path.lstrip("/")
            if name in state.fail:
                self._empty(state.fail[name])
                return
            target = (root / name).resolve()
            if root not in target.parents or not target.is_file():
                self._empty(404)
                return
            data = target.read_bytes()
            total = len(data)
            start, end, status = 0, total, 200
            m = _RANGE.match(range_header.strip()) if range_header else None
            if range_header and not state.ignore_range:
                if m is None:
                    self._empty(400)
                    return
                start = int(m.group(1))
                end = min(int(m.group(2)) + 1, total) if m.group(2) else total
                if start >= total or end <= start:
                    self._empty(416, extra={"Content-Range": f"bytes */{total}"})
                    return
                status = 206
            body = data[start:end]
            self.send_response(status)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Accept-Ranges", "none" if state.ignore_range else "bytes")
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{total}")
            cut = state.truncate.get(name)
            if cut is not None and cut < len(body):
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            if not send_body:
                return
            if cut is not None and cut < len(body):
                body = body[:cut]
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(body)
                self.wfile.flush()

        def _empty(self, status: int, extra: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", "0")
            self.end_headers()

    return Handler


@contextlib.contextmanager
def serve_directory(
    root: Path, *, ignore_range: bool = False, truncate: dict[str, int] | None = None
) -> Iterator[ServedDirectory]:
    """Serve ``root`` on 127.0.0.1 (a free port) for the duration of the ``with`` block.

    Yields the base URL as a :class:`ServedDirectory` (a ``str``) whose
    ``requests`` list records every request and whose ``ignore_range``,
    ``truncate`` and ``fail`` attributes may be changed while it runs.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()
    # Port is unknown until bind, so build the state with a placeholder and fix the URL after.
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    host, port = server.server_address[:2]
    state = ServedDirectory(f"http://{host}:{port}", root, ignore_range=ignore_range, truncate=truncate)
    server.RequestHandlerClass = _make_handler(state, lock)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def file_server(tmp_path: Path) -> Iterator[ServedDirectory]:
    """A server over a fresh directory ``file_server.root`` (put files there before fetching)."""
    with serve_directory(tmp_path / "served") as url:
        yield url
