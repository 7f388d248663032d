"""What made an artifact: the code's version and a digest of the settings.

A checkpoint records both (:class:`Provenance`), so a rerun with changed code or settings
restarts from scratch instead of resuming from state the current code would not have
produced. The code's identity is the package version plus a digest of every ``.py`` file
of the installed package (so it works from a git checkout and from a pip-installed copy
alike); ``git describe`` is added for the reader where the package sits in a git checkout.

The workflow's artifacts carry the same two things:

* :func:`fnlcore.app.identity.settings_identity`, a digest of a job's settings with every
  default filled in, is a Snakemake param of each rule whose output depends on settings (rules/*.smk). Snakemake
  records a job's params and reruns it when they change; it records only plain values (a
  spec object is dropped unseen), and the path holds only the non-default settings, so
  without it a changed default in the code reran nothing.
* A finished run records its code version in its metrics file (:func:`made_by`,
  :func:`recorded_made_by`); ``fnl status`` and the table footers name runs of other code
  (:func:`other_code_runs`): a code change alone reruns nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import subprocess
from functools import cache
from pathlib import Path
from typing import Any, Iterable, Mapping
from . import __version__

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


# -- the code version a finished run records -----------------------------------------------

# The key of a metrics file's parquet schema metadata that holds :func:`made_by` as JSON.
MADE_BY_KEY = b"fnl.made_by"


def made_by() -> dict[str, str | None]:
    """What a finished run records of the code that made it: ``code`` (compared) and ``git`` (for the reader)."""
    return {"code": code_version(), "git": git_describe()}


def recorded_made_by(metrics_path: str | Path) -> dict | None:
    """:func:`made_by` as a run's metrics file records it; None where it records none (a run made
    before runs recorded it) or cannot be read."""
    import pyarrow.parquet as pq  # lazy: pyarrow only where parquet is read or written

    try:
        meta = pq.read_schema(str(metrics_path)).metadata or {}
        d = json.loads(meta[MADE_BY_KEY])
    except Exception:  # absent, unreadable or not parquet: no record
        return None
    return d if isinstance(d, dict) and "code" in d else None


def describe_made_by(d: Mapping[str, Any] | None) -> str:
    """``fnlcore 0.1.0+src.abc (git v1-2-gdef)``, or what an absent record means."""
    if d is None:
        return "an unknown code version (made before runs recorded theirs)"
    git = f" (git {d['git']})" if d.get("git") else ""
    return f"fnlcore {d['code']}{git}"


def other_code_runs(metrics_files: Iterable[str | Path]) -> dict[str, dict | None]:
    """The existing metrics files of ``metrics_files`` whose run was not made by this code version:
    path -> its record (None: it records none). Missing files are left out (not made yet)."""
    here = code_version()
    out: dict[str, dict | None] = {}
    for path in metrics_files:
        if not Path(path).exists():
            continue
        d = recorded_made_by(path)
        if d is None or d.get("code") != here:
            out[str(path)] = d
    return out


def other_code_text(runs: Mapping[str, dict | None], labels: Mapping[str, str] | None = None, total: int | None = None,
                    limit: int = 8, this: str = "this one") -> str:
    """One paragraph naming the runs of :func:`other_code_runs`, grouped by the code that made them
    (at most ``limit`` names each); ``labels`` names a path for the reader (default: its run folder);
    ``this`` names the code they differ from."""
    if not runs:
        return ""
    groups: dict[str, list[str]] = {}
    for path, d in runs.items():
        name = (labels or {}).get(path) or str(Path(path).parent)
        groups.setdefault(describe_made_by(d), []).append(name)
    n = len(runs)
    of = f"{n} of {total}" if total is not None else str(n)
    parts = []
    for who, names in groups.items():
        more = f" and {len(names) - limit} more" if len(names) > limit else ""
        parts.append(f"by {who}: {', '.join(names[:limit])}{more}")
    noun = "runs" if (total if total is not None else n) != 1 else "run"  # "1 of 2 runs was", "1 run was"
    return (f"{of} {noun} {'were' if n != 1 else 'was'} made by another code version than {this} "
            f"({describe_made_by(made_by())}); {'; '.join(parts)}. A changed setting or default reruns a run, "
            "a code change alone does not: delete a run's folder to make it again with this code.")


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
