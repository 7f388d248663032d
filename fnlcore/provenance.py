"""What made an artifact: the code's version and a digest of the settings.

A checkpoint records both (:class:`Provenance`), so a rerun with changed code or settings
restarts from scratch instead of resuming from state the current code would not have
produced. The code's identity is the package version plus a digest of every ``.py`` file
of the installed package (so it works from a git checkout and from a pip-installed copy
alike); ``git describe`` is added for the reader where the package sits in a git checkout.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parent


@cache
def source_digest() -> str:
    """sha256 (first 12 hex) over the relative path and bytes of every .py file of the package."""
    h = hashlib.sha256()
    for f in sorted(PACKAGE_DIR.rglob("*.py")):
        if "__pycache__" in f.parts:
            continue
        h.update(f.relative_to(PACKAGE_DIR).as_posix().encode() + b"\0")
        h.update(f.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:12]


@cache
def git_describe() -> str | None:
    """``git describe --always --dirty`` of the checkout holding the package; None outside one."""
    if not (PACKAGE_DIR.parent / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(PACKAGE_DIR.parent), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def code_version() -> str:
    """``<fnlcore version>+src.<digest>``: equal exactly when the package's source is."""
    from . import __version__

    return f"{__version__}+src.{source_digest()}"


def settings_digest(settings: Any) -> str:
    """sha256 (first 12 hex) of a canonical JSON form of ``settings`` (dataclasses, specs, mappings, lists)."""
    text = json.dumps(_plain(settings), sort_keys=True, separators=(",", ":"), default=_stable_str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def file_digest(path: str | Path) -> str:
    """sha256 (first 12 hex) of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:12]


def plugin_digest(cls: type) -> str | None:
    """The digest of the file defining ``cls`` when it lives outside the package (a user's
    plug-in, which :func:`source_digest` does not cover); None for the package's own classes."""
    try:
        path = Path(inspect.getsourcefile(cls) or "").resolve()
    except TypeError:  # built-in
        return None
    if not path.is_file() or path.is_relative_to(PACKAGE_DIR):
        return None
    return file_digest(path)


@dataclasses.dataclass(frozen=True)
class Provenance:
    """The code and settings that made an artifact; ``git`` is informative only (not compared)."""

    code: str
    settings: str
    git: str | None = None

    @classmethod
    def of(cls, settings: Any) -> Provenance:
        return cls(code_version(), settings_digest(settings), git_describe())

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> Provenance | None:
        if not isinstance(d, dict) or "code" not in d or "settings" not in d:
            return None
        return cls(str(d["code"]), str(d["settings"]), d.get("git"))

    def same_as(self, other: Provenance | None) -> bool:
        return other is not None and (self.code, self.settings) == (other.code, other.settings)

    def describe(self) -> str:
        git = f", git {self.git}" if self.git else ""
        return f"code {self.code}{git}, settings {self.settings}"


def _plain(v: Any) -> Any:
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        name = getattr(v, "name", None)
        fields = {f.name: _plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        return {"__type__": type(v).__name__, **({"name": name} if isinstance(name, str) else {}), **fields}
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, (set, frozenset)):  # iteration order varies between processes
        return sorted((_plain(x) for x in v), key=lambda x: json.dumps(x, sort_keys=True, default=_stable_str))
    if hasattr(v, "item") and callable(v.item):  # numpy scalars
        return v.item()
    return v


def _stable_str(o: Any) -> str:
    """Other values by their text, unless it holds a memory address (different in every process)."""
    text = str(o)
    return f"<{type(o).__name__}>" if " at 0x" in text else text
