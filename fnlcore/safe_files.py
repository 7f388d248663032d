"""Opening a file in place (a lock, a log, a journal) without following a link: what a shared,
group-writable results folder needs. Atomic writes (:mod:`fnlcore.io`) rename a new file onto the
name instead, which replaces a link rather than following it.

Only the standard library is imported here: the lock module (imported first by a training job)
uses it.
"""

from __future__ import annotations

import errno
import os
import shlex
import stat

from .errors import StorageError


class UnsafeFileError(StorageError):
    """A file the project would write in a results folder is a link or not a regular file."""


_OPEN_FLAGS = {"a": os.O_WRONLY | os.O_APPEND, "a+": os.O_RDWR | os.O_APPEND, "w": os.O_WRONLY,
               "r+": os.O_RDWR, "ab": os.O_WRONLY | os.O_APPEND}


def open_regular(path: str | os.PathLike, mode: str = "a", encoding: str | None = "utf-8"):
    """``open(path, mode)`` for a file the project writes in place (a lock, a log, a journal), that
    never follows a link and never writes anything but a regular file of one name.

    A plain ``open`` follows a symbolic link planted at ``path`` (in a group-writable results
    folder anyone of the group can plant one) and truncates or appends to its target. Here the
    final name is opened with ``O_NOFOLLOW`` (a link is refused), ``O_NONBLOCK`` (a FIFO does not
    hang the open) and without ``O_TRUNC``; the open file must be a regular file with one link
    (a hard link to another file is refused too); only then is ``"w"`` truncated. Modes ``a``,
    ``a+``, ``w``, ``r+`` (text) and ``ab`` (binary). Raises :class:`UnsafeFileError` naming the
    file and the fix; other OSErrors propagate.
    """
    p = os.fspath(path)
    flags = _OPEN_FLAGS[mode] | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(p, flags, 0o666)  # less the umask, as open() does
    except OSError as err:
        if err.errno == errno.ELOOP:  # O_NOFOLLOW on a symbolic link
            raise UnsafeFileError(_unsafe(p, f"is a symbolic link{_target(p)}")) from None
        if err.errno in (errno.ENXIO, errno.EISDIR):  # a FIFO without a reader, a folder
            raise UnsafeFileError(_unsafe(p, "is not a regular file")) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFileError(_unsafe(p, "is not a regular file"))
        if st.st_nlink != 1:
            raise UnsafeFileError(_unsafe(p, f"has {st.st_nlink} hard links (another name shares its contents)"))
        os.set_blocking(fd, True)
        if mode == "w":
            os.ftruncate(fd, 0)
        fh = os.fdopen(fd, {"a": "a", "a+": "a+", "w": "w", "r+": "r+", "ab": "ab"}[mode],
                       encoding=None if "b" in mode else encoding)
    except BaseException:
        os.close(fd)
        raise
    if mode == "a+":
        fh.seek(0)  # "a+" reads from the start; writes still append
    return fh


def _target(path: str) -> str:
    try:
        return f" (to {os.readlink(path)!r})"
    except OSError:
        return ""


def _unsafe(path: str, what: str) -> str:
    return (f"{path} {what}: a file the project writes in a results folder must be a regular file, so that a "
            "link planted in a shared folder cannot redirect the write to another file. Nothing was written. "
            f"If you did not make it, remove it (rm {shlex.quote(path)}) and run the same command again")
