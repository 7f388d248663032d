"""Checksummed, resumable downloads of published dataset files.

``fetch`` places one file in a raw-data folder. It never leaves a file under its
final name unless that file matches its published size and checksum: bytes are
written to ``<name>.part``, verified, then renamed atomically. A broken transfer
keeps the ``.part`` so the next call resumes it with an HTTP ``Range`` request.

Sources are tried in order: the configured mirrors (``mirror/<filename>``;
a mirror may also be a local folder or a ``file://`` URL), then the official
URLs. Only the standard library is used (``urllib``), so it works on cluster
nodes without extra packages.

What counts as complete: a file with a published size or checksum is checked
against it. A file with neither (ISIC 2019's files, NIH's ``Data_Entry`` CSV)
is accepted only when the transfer itself proves it ended: the body matched the
server's ``Content-Length``, or a chunked body ended with its final empty chunk
(``http.client`` raises ``IncompleteRead`` otherwise), or a resumed body reached
the total its ``Content-Range`` gives. A body delimited only by the server
closing the connection cannot be told from a cut one, so it is refused.

A redirect from ``https`` to anything else is refused (a man in the middle
could otherwise downgrade the transfer); ``http`` to ``http`` or ``https`` is
followed. A full disk (ENOSPC/EDQUOT) while writing stops at once with a
:class:`~fnlcore.errors.StorageError` naming the folder, the bytes needed and
free; the ``.part`` is kept for a resume.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import os
import re
import shutil
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Sequence
from urllib.parse import urlsplit

from ..errors import ChecksumError, ConfigError, DataError, StorageError

__all__ = ["RemoteFile", "fetch", "verify_file", "file_digests", "candidate_urls", "remote_with"]

_CHUNK = 1 << 20
_USER_AGENT = "fnlcore-downloader/0.1 (+FNL-Repro)"
_HEX = re.compile(r"^[0-9a-f]+$")
_CONTENT_RANGE = re.compile(r"^bytes\s+(\d+)-(\d+)/(\d+|\*)$")
_UNSATISFIED_RANGE = re.compile(r"^bytes\s+\*/(\d+)$")
#: errno values of a full disk or an exhausted quota (EDQUOT is missing on some platforms).
DISK_FULL_ERRNOS = frozenset(e for e in (errno.ENOSPC, getattr(errno, "EDQUOT", None)) if e is not None)


def format_bytes(n: int) -> str:
    """``"12,345,678 bytes (11.8 MiB)"``: exact for the record, rounded for the reader."""
    size, unit = float(n), "bytes"
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{n:,} bytes" if unit == "bytes" else f"{n:,} bytes ({size:.1f} {unit})"


def is_disk_full(exc: BaseException) -> bool:
    """True for the OSError of a full disk or an exhausted quota."""
    return isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS


@dataclass(frozen=True)
class RemoteFile:
    """A published file: its name on disk, where it lives, and what it must hash to.

    ``filename`` is also the last path component appended to a mirror base URL.
    ``urls`` are the official locations, tried after the configured mirrors.
    Give at least one of ``md5``/``sha256`` where the publisher states one.
    """

    filename: str
    urls: tuple[str, ...]
    md5: str | None = None
    sha256: str | None = None
    size: int | None = None

    def __post_init__(self) -> None:
        if not self.filename or "/" in self.filename or "\\" in self.filename or self.filename in {".", ".."}:
            raise ConfigError(f"RemoteFile.filename must be a plain file name, got {self.filename!r}")
        object.__setattr__(self, "urls", tuple(self.urls))
        for algo, length in (("md5", 32), ("sha256", 64)):
            value = getattr(self, algo)
            if value is not None:
                value = value.lower()
                if len(value) != length or not _HEX.match(value):
                    raise ConfigError(
                        f"RemoteFile({self.filename!r}).{algo} must be {length} hex digits, got {value!r}"
                    )
                object.__setattr__(self, algo, value)
        if self.size is not None and self.size < 0:
            raise ConfigError(f"RemoteFile({self.filename!r}).size must be >= 0, got {self.size}")

    def checkable(self) -> bool:
        """Whether a download can be checked against a published size or checksum."""
        return self.size is not None or bool(self.md5 or self.sha256)

    def checksum_label(self) -> str:
        """``"md5:<hex>"`` or ``"sha256:<hex>"`` (what meta.json records); ``""`` when none is known."""
        if self.sha256:
            return f"sha256:{self.sha256}"
        if self.md5:
            return f"md5:{self.md5}"
        return ""


def file_digests(path: str | os.PathLike, algorithms: Sequence[str] = ("md5",)) -> dict[str, str]:
    """Hex digests of a file, all computed in one read pass."""
    hashers = {a: hashlib.new(a) for a in algorithms}
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            for h in hashers.values():
                h.update(chunk)
    return {a: h.hexdigest() for a, h in hashers.items()}


def verify_file(
    path: str | os.PathLike,
    md5: str | None = None,
    sha256: str | None = None,
    size: int | None = None,
) -> dict[str, str]:
    """Check a file against its published size and checksums; return the digests computed.

    Raises ``DataError`` if the file is missing and ``ChecksumError`` (a
    ``DataError``) if its size or a digest differs; the message gives both values.
    With no size and no digest given, only existence is checked.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: file not found")
    if size is not None and (actual_size := p.stat().st_size) != size:
        raise ChecksumError(
            f"{p}: size is {actual_size} bytes, expected {size} bytes; "
            "the file is incomplete or a different version. Delete it and download it again."
        )
    wanted = {a: v.lower() for a, v in (("md5", md5), ("sha256", sha256)) if v}
    if not wanted:
        return {}
    actual = file_digests(p, tuple(wanted))
    for algo, expected in wanted.items():
        if actual[algo] != expected:
            raise ChecksumError(
                f"{p}: {algo} is {actual[algo]}, expected {expected}; "
                "the file is corrupted or a different version. Delete it and download it again."
            )
    return actual


def candidate_urls(remote: RemoteFile, mirrors: Sequence[str] = ()) -> list[str]:
    """The URLs ``fetch`` tries, in order: each mirror + '/' + filename, then the official URLs."""
    urls = [_mirror_url(m, remote.filename) for m in mirrors]
    urls.extend(remote.urls)
    seen: set[str] = set()
    return [u for u in urls if not (u in seen or seen.add(u))]


def fetch(
    remote: RemoteFile,
    dest_dir: str | os.PathLike,
    mirrors: Sequence[str] = (),
    timeout: float = 60.0,
    progress: bool = False,
) -> Path:
    """Make ``dest_dir/remote.filename`` exist and match its published checksum; return its path.

    A file already there that verifies is used as is (no network). Otherwise
    each URL of :func:`candidate_urls` is tried in turn, downloading to
    ``<filename>.part`` (resumed with ``Range: bytes=N-`` when a ``.part``
    exists; restarted from zero when the server ignores ``Range``), then the
    size and checksum are verified and the file is renamed into place.

    Errors: a checksum mismatch deletes the ``.part`` and, once no other URL
    gives a good copy, raises ``ChecksumError``; a truncated transfer keeps the
    ``.part`` for a later resume, and so does a transfer whose end cannot be
    proven (no Content-Length, not chunked) for a file with no published size
    or checksum; if no URL yields a verified file, ``DataError`` lists every
    URL with its error and says how to configure a mirror or where to place
    the file by hand. A full disk raises ``StorageError`` at once (every other
    URL would fill the same disk).
    """
    if isinstance(mirrors, str):
        raise ConfigError(f"mirrors must be a list of base URLs, got the string {mirrors!r}")
    dest_dir = Path(dest_dir)
    dest = dest_dir / remote.filename
    part = dest_dir / (remote.filename + ".part")
    stale_note = ""
    if dest.exists():
        try:
            verify_file(dest, remote.md5, remote.sha256, remote.size)
            return dest
        except DataError as exc:  # a bad copy: replace it by a download (the rename overwrites it)
            stale_note = f"\nThe existing {dest} did not verify ({exc}); it is replaced once a good copy arrives."
    dest_dir.mkdir(parents=True, exist_ok=True)

    # A complete .part left by a run killed between download and rename needs no network.
    if remote.size is not None and part.exists() and part.stat().st_size == remote.size:
        try:
            verify_file(part, remote.md5, remote.sha256, remote.size)
            os.replace(part, dest)
            return dest
        except ChecksumError:
            part.unlink()
    urls = candidate_urls(remote, mirrors)
    if not urls:
        raise DataError(_give_up_message(remote, dest, [], mirrors) + stale_note)

    failures: list[tuple[str, str]] = []
    checksum_failed = False
    for url in urls:
        try:
            _download(url, part, remote, timeout=timeout, progress=progress)
        except ChecksumError as exc:
            part.unlink(missing_ok=True)
            failures.append((url, str(exc)))
            checksum_failed = True
            continue
        except _TransferError as exc:
            failures.append((url, str(exc)))
            continue
        os.replace(part, dest)
        return dest

    message = _give_up_message(remote, dest, failures, mirrors) + stale_note
    if checksum_failed:
        raise ChecksumError(message)
    raise DataError(message)


class _TransferError(DataError):
    """One URL did not deliver the file (network error, HTTP error, truncated body)."""


def _mirror_url(mirror: str, filename: str) -> str:
    mirror = str(mirror)
    if "://" not in mirror:  # a local folder holding the files
        return Path(mirror).resolve().joinpath(filename).as_uri()
    return mirror.rstrip("/") + "/" + filename


def redirect_allowed(from_url: str, to_url: str) -> bool:
    """Whether a redirect may be followed: never from ``https`` to another scheme (a downgrade)."""
    return urlsplit(from_url).scheme.lower() != "https" or urlsplit(to_url).scheme.lower() == "https"


class _NoDowngradeRedirect(urllib.request.HTTPRedirectHandler):
    """urllib's redirect handling, refusing https -> http (the refusal is an HTTPError naming both URLs)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 - urllib's signature
        if not redirect_allowed(req.full_url, newurl):
            raise urllib.error.HTTPError(
                req.full_url, code, f"{msg}; redirect to {newurl} refused: it would leave https", headers, fp
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _opener_for(url: str) -> urllib.request.OpenerDirector:
    """The default opener with the no-downgrade redirect rule; loopback hosts never go through a proxy."""
    handlers: list[urllib.request.BaseHandler] = [_NoDowngradeRedirect()]
    if urlsplit(url).hostname in {"127.0.0.1", "localhost", "::1"}:
        handlers.append(urllib.request.ProxyHandler({}))
    return urllib.request.build_opener(*handlers)


def _download(url: str, part: Path, remote: RemoteFile, *, timeout: float, progress: bool) -> None:
    """Download ``url`` into ``part`` (resuming it if present), then verify it; raise on any failure."""
    offset = part.stat().st_size if part.exists() else 0
    if remote.size is not None and offset > remote.size:
        part.unlink()
        offset = 0
    request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    try:
        response = _opener_for(url).open(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        content_range = exc.headers.get("Content-Range", "") if exc.headers is not None else ""
        unsatisfied = _UNSATISFIED_RANGE.match(content_range.strip())
        exc.close()
        if exc.code == 416 and offset:
            # Nothing left to send: the .part may already be the whole file; "bytes */N" says how long it is.
            total = int(unsatisfied.group(1)) if unsatisfied else None
            if total is not None and total != offset:
                part.unlink()
                raise _TransferError(
                    f"the partial file {part} ({offset} bytes) is longer than the file on the server "
                    f"({total} bytes); it was deleted and the next try starts afresh"
                ) from None
            if total is None and not remote.checkable():
                reason = _unprovable(url, part, "answered the resume with 416 but no total length")
                raise _TransferError(reason) from None
            _verify_part(url, part, remote)
            return
        raise _TransferError(f"HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise _TransferError(f"{type(exc).__name__}: {reason}") from None

    with response:
        status = getattr(response, "status", None) or 200
        mode = "wb"
        range_total = None
        if offset and status == 206:
            m = _CONTENT_RANGE.match(response.headers.get("Content-Range", "").strip())
            if m is None or int(m.group(1)) != offset:
                raise _TransferError(
                    f"server answered Range bytes={offset}- with Content-Range "
                    f"{response.headers.get('Content-Range')!r}; cannot resume safely"
                )
            mode = "ab"
            range_total = int(m.group(3)) if m.group(3) != "*" else None
        elif offset:
            offset = 0  # server ignored Range and sends the whole file: restart cleanly
        length = response.headers.get("Content-Length")
        expected_body = int(length) if length is not None and length.isdigit() else None
        # http.client raises IncompleteRead when a chunked body stops before its last (empty) chunk,
        # so a chunked body that reads to its end is complete.
        chunked = bool(getattr(response, "chunked", False))
        received = 0
        reporter = _Progress(remote.filename, offset, remote.size, expected_body) if progress else None
        try:
            with open(part, mode) as fh:
                while chunk := response.read(_CHUNK):
                    fh.write(chunk)
                    received += len(chunk)
                    if reporter:
                        reporter.update(received)
        except (OSError, http.client.HTTPException) as exc:  # connection reset, timeout mid-body, full disk
            if is_disk_full(exc):
                # Not a transfer problem: another URL would fail the same way, so stop here.
                needed = remote.size if remote.size is not None else (
                    offset + expected_body if expected_body is not None else None
                )
                raise StorageError(
                    f"the disk holding {part.parent} is full (or over quota) while downloading {remote.filename} "
                    f"from {url}: "
                    + (f"the file needs {format_bytes(needed)}, " if needed is not None else "")
                    + f"{_free(part.parent)} are free; the partial file {part} "
                    f"({format_bytes(offset + received)}) is kept and the next run resumes it. Fix: free space "
                    "there, or move the raw folder to a larger disk and point data.raw_dir "
                    "(or data.datasets.<dataset>.raw_dir) at it"
                ) from None
            raise _TransferError(
                f"transfer interrupted after {offset + received} bytes ({type(exc).__name__}: {exc}); "
                f"the partial file {part} is kept and the next run resumes it"
            ) from None
    if expected_body is not None and received < expected_body:
        raise _TransferError(
            f"truncated transfer: received {received} of {expected_body} bytes announced by the server; "
            f"the partial file {part} ({offset + received} bytes) is kept and the next run resumes it"
        )
    if range_total is not None and offset + received < range_total:
        raise _TransferError(
            f"truncated transfer: have {offset + received} of the {range_total} bytes the server's Content-Range "
            f"gives; the partial file {part} is kept and the next run resumes it"
        )
    ended_provably = expected_body is not None or chunked or range_total is not None
    if not ended_provably and not remote.checkable():
        raise _TransferError(_unprovable(url, part, "sent no Content-Length and no chunked encoding"))
    _verify_part(url, part, remote)


def _unprovable(url: str, part: Path, what: str) -> str:
    """Why a download of a file without published size or checksum cannot be accepted."""
    return (
        f"the server {what}, so a connection closed early cannot be told from the end of the file, and "
        f"{part.name[: -len('.part')]} has no published size or checksum to check it against; it was not "
        f"accepted (the partial file {part} is kept: a later resume that gets a length can finish it)"
    )


def _free(folder: Path) -> str:
    """The free space of ``folder``'s filesystem, for a message."""
    try:
        return format_bytes(shutil.disk_usage(folder).free)
    except OSError:
        return "an unknown number of bytes"


def _verify_part(url: str, part: Path, remote: RemoteFile) -> None:
    """Check a finished ``.part``: too short -> keep it (resumable); wrong digest -> delete it."""
    have = part.stat().st_size if part.exists() else 0
    if remote.size is not None and have < remote.size:
        raise _TransferError(
            f"incomplete: {have} of {remote.size} bytes; the partial file {part} is kept and the next run resumes it"
        )
    if remote.size is not None and have != remote.size:
        part.unlink()
        raise ChecksumError(
            f"{remote.filename} from {url} has {have} bytes, expected {remote.size}; the download was deleted"
        )
    wanted = {a: v for a, v in (("md5", remote.md5), ("sha256", remote.sha256)) if v}
    if not wanted:
        return
    actual = file_digests(part, tuple(wanted))
    for algo, expected in wanted.items():
        if actual[algo] != expected:
            part.unlink()
            raise ChecksumError(
                f"{remote.filename} from {url}: {algo} is {actual[algo]}, expected {expected} (corrupted in "
                "transit, or the server holds a different version); the download was deleted"
            )


def _give_up_message(remote: RemoteFile, dest: Path, failures: list[tuple[str, str]], mirrors: Sequence[str]) -> str:
    lines = [f"Could not obtain {remote.filename}."]
    if failures:
        lines.append("Tried, in order:")
        lines.extend(f"  {url}\n    -> {err}" for url, err in failures)
    else:
        lines.append("No mirror is configured and the file has no official URL.")
    checks = ", ".join(
        f"{a} {v}" for a, v in (("md5", remote.md5), ("sha256", remote.sha256), ("size", remote.size)) if v is not None
    )
    lines.append(
        "Fix: configure a download mirror that serves this file (config key data.datasets.<dataset>.mirrors: "
        f"base URLs or local folders; the file is fetched from <mirror>/{remote.filename})"
        + (f"; configured now: {list(mirrors)}" if mirrors else "")
        + f"; or download it by hand and place it at {dest}"
        + (f" ({checks})." if checks else ".")
    )
    return "\n".join(lines)


class _Progress:
    """Minimal progress line on stderr (only when asked; jobs on clusters log it)."""

    def __init__(self, name: str, offset: int, total: int | None, body: int | None) -> None:
        self.name, self.offset = name, offset
        self.total = total if total is not None else (offset + body if body is not None else None)
        self.next_report = 0
        self.width = shutil.get_terminal_size((80, 20)).columns

    def update(self, received: int) -> None:
        done = self.offset + received
        if done < self.next_report:
            return
        self.next_report = done + 8 * _CHUNK
        if self.total:
            msg = f"{self.name}: {done / 1e6:.1f}/{self.total / 1e6:.1f} MB ({100 * done / self.total:.0f}%)"
        else:
            msg = f"{self.name}: {done / 1e6:.1f} MB"
        print(msg[: self.width], file=sys.stderr, flush=True)


def remote_with(remote: RemoteFile, overrides: Mapping[str, object] | None) -> RemoteFile:
    """A copy of ``remote`` with some fields replaced (tests inject URLs/checksums this way)."""
    if not overrides:
        return remote
    return replace(remote, **overrides)  # type: ignore[arg-type]
