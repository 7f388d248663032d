"""The spec/data regression fixtures, rebuilt from the papers' published files.

The tests read four files of ``spec/data`` (``../shared`` beside the checkout, or
``$FNL_SHARED_DIR``). A clone without that folder rebuilds them from the official files
they come from (fnlcore/datasets/official_files.py: pinned commits, pinned checksums):

* ``fednoro_{train,test}_ICH.csv`` are byte copies of FedNoRo's ``data/{train,test}_ICH.csv``
  (the download's sha256 is pinned);
* ``fedmlp_{ICH,ChestXray14}_client_indices.csv`` are the canonical export
  (``client_index_export``) of FedMLP's ``.npy`` client lists, whose sha256 is pinned as the
  content hash. The shared copies have CRLF line ends, these LF; the content is the same.

Downloads go to ``<dest>/downloads``; each fixture is written to a temporary file and renamed
into place, so an interrupted run leaves no half-written fixture.

Prefill the cache where raw.githubusercontent.com is reachable (or from a mirror: a base URL
or a local folder holding the published files under their upstream names)::

    python -m tests.spec_data [--dest DIR] [--mirror URL_OR_FOLDER]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from fnlcore.datasets import official_files as of
from fnlcore.errors import DataError

try:
    import fcntl
except ImportError:  # not POSIX: no lock (only concurrent pytest-xdist workers need it)
    fcntl = None

REPO_ROOT = Path(__file__).resolve().parents[1]
GITHUB_RAW = "raw.githubusercontent.com"
DOWNLOADS = "downloads"

# fixture name in spec/data -> key of the official file it is made from
FIXTURES: dict[str, str] = {
    "fednoro_train_ICH.csv": "fednoro_ich_train",
    "fednoro_test_ICH.csv": "fednoro_ich_test",
    "fedmlp_ICH_client_indices.csv": "fedmlp_ich_clients",
    "fedmlp_ChestXray14_client_indices.csv": "fedmlp_chestxray14_clients",
}


def shared_dir() -> Path:
    """The shared folder: ``$FNL_SHARED_DIR``, else ``../shared`` beside the checkout."""
    return Path(os.environ.get("FNL_SHARED_DIR", REPO_ROOT.parent / "shared")).resolve()


def cache_dir() -> Path:
    """Where rebuilt fixtures live: ``$FNL_TEST_CACHE``, else the user cache (XDG) + fnl-repro/spec-data."""
    if os.environ.get("FNL_TEST_CACHE"):
        return Path(os.environ["FNL_TEST_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fnl-repro" / "spec-data"


def missing(dest: str | os.PathLike) -> list[str]:
    """The fixture names not yet in ``dest``."""
    return [name for name in FIXTURES if not (Path(dest) / name).is_file()]


def offline_reason(shared: Path, cache: Path) -> str:
    """The one-line skip reason when the fixtures are neither shared nor downloadable."""
    return (
        f"spec-data fixtures {', '.join(FIXTURES)} not in {shared} and not downloadable ({GITHUB_RAW} "
        f"unreachable): set FNL_SHARED_DIR to a folder holding spec/data, or run `python -m tests.spec_data` "
        f"where {GITHUB_RAW} is reachable (fills {cache})"
    )


def fixture_bytes(key: str, path: Path) -> bytes:
    """The fixture made from the official file at ``path`` (already checked by fetch_official)."""
    if path.suffix == ".npy":  # FedMLP client lists: the canonical export that the content hash pins
        return of.client_index_export(of.load_fedmlp_clients(key, path))
    return path.read_bytes()  # FedNoRo CSVs: the published bytes, sha256-pinned


def _write_atomic(target: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, target)
    except BaseException:  # interrupted or failed: no partial file, under either name
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Exclusive lock: pytest-xdist workers share the cache, and fetch's ``.part`` files are not safe to share."""
    with open(path, "a") as fh:
        if fcntl is not None:
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def fetch_spec_data(dest: str | os.PathLike, mirrors: Sequence[str] = (), timeout: float = 60.0) -> Path:
    """Make every fixture of FIXTURES exist in ``dest``; return ``dest``.

    Fixtures already there are kept (no network). Raises ChecksumError when a download does
    not verify, and DataError when no URL delivered a file (no network); the first failure
    stops the run, and leaves no fixture for that file.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with _locked(dest / ".lock"):
        for name in missing(dest):  # listed under the lock: another worker may just have made them
            key = FIXTURES[name]
            path = of.fetch_official(key, dest / DOWNLOADS, mirrors=mirrors, timeout=timeout)
            _write_atomic(dest / name, fixture_bytes(key, path))
    return dest


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.spec_data", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=None, help="folder for the fixtures (default: the test cache)")
    parser.add_argument("--mirror", action="append", default=[], metavar="URL_OR_FOLDER",
                        help="tried before GitHub: a base URL or local folder holding the published files; repeatable")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per connection (default 60)")
    args = parser.parse_args(argv)
    dest = args.dest or cache_dir()
    try:
        fetch_spec_data(dest, mirrors=args.mirror, timeout=args.timeout)
    except DataError as exc:  # ChecksumError included
        print(exc, file=sys.stderr)
        return 1
    for name in FIXTURES:
        print(dest / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
