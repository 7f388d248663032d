"""CIFAR-10N and CIFAR-100N (Wei et al., ICLR 2022): real human label noise over the CIFAR training sets.

"Learning with Noisy Labels Revisited: A Study Using Real-World Human Annotations" re-labelled
CIFAR-10's and CIFAR-100's 50,000 training images on Amazon Mechanical Turk and published the
labels in GitHub ``UCSC-REAL/cifar-10-100n`` (pinned below):

* ``data/CIFAR-10_human.pt``: ``clean_label`` (CIFAR-10's own), ``aggre_label`` (majority of
  three annotators, 9.03 % noisy as published; 9.01 % in the file), ``worse_label`` (a wrong one
  of the three where any, 40.21 %), ``random_label1..3`` (annotator 1, 2, 3: 17.23, 18.12, 17.64 %);
* ``data/CIFAR-100_human.pt``: ``clean_label``, ``noisy_label`` (one annotator, fine classes, 40.20 %)
  and the coarse labels (not used).

Each array is in CIFAR's official training order, ``data_batch_1`` .. ``data_batch_5`` of the
python archive concatenated (CIFAR-100: its one ``train`` batch): the official loader
(``data/cifar.py``) reads those batches in that order and asserts that its labels minus
``clean_label`` sum to 0 (a weak check). That is the order
:mod:`fnlcore.datasets.cifar` prepares, and every use checks it again: the file's
``clean_label`` must equal the prepared training labels position by position (a DataError names
the positions otherwise), so the human label of image i is never given to image j.

The noise models ``cifar10n`` (``type``: aggre | worst | random1 | random2 | random3) and
``cifar100n`` give every sample of every client its human label; samples in no client keep
theirs. No draw is random: the seed changes nothing. They run on the prepared ``cifar10`` /
``cifar100`` only (a ConfigError names the dataset otherwise, a smoke-scale stand-in included).

How the labels reach the draw: through the noise models' artifact hook
(:meth:`NoiseSpec.soft_labels_from`, the one H-IDN's annotator networks use): the noise job
passes the prepared dataset, this module downloads the pinned file into that dataset's raw
folder (``meta.json``'s ``raw_dir``, beside the CIFAR archive) through
:func:`fnlcore.datasets.download.fetch` (size and sha256 checked; a lock keeps parallel noise
jobs from sharing a ``.part``), checks it against the prepared labels and returns the human
labels one-hot, (n, C) float32, as ``soft_labels``; :meth:`draw` takes each row's arg-max. Any
(n, C) class-probability table works the same way (the contract tests pass random ones).

Reading without torch: the files are ``torch.save`` archives (a zip holding
``<folder>/data.pkl``, a protocol-2 pickle of a dict of numpy int64 arrays, and
``<folder>/version``). The noise job's environment (envs/labels.yaml) has no torch, and
``torch.load(weights_only=True)`` would need numpy's reconstruction globals allow-listed anyway;
so the pickle is read here with an unpickler that resolves exactly the globals those files
name (``numpy.core.multiarray._reconstruct`` or its numpy 2 name, ``numpy.ndarray``,
``numpy.dtype``, and ``_codecs.encode`` restricted to latin-1, which protocol 2 uses for bytes)
and refuses every other global and any tensor storage: no code in a file can run. The tests
check that it reads what ``torch.load(weights_only=True)`` reads with those globals allowed.

Not ported: the official ``main.py`` without ``--is_human`` trains on *synthetic* labels drawn
from the human labels' class transition matrix; these models give the human labels themselves
(the README's "use human annotations" runs).

Offline (a cluster node without GitHub): place the file in the dataset's raw folder by hand, or
fill it where GitHub is reachable (``--mirror``: a base URL or folder holding the files)::

    python -m fnlcore.noise.cifarn --dest <data.raw_dir>/cifar10 cifar10
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import pickle
import sys
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..datasets.download import RemoteFile, fetch, verify_file
from ..errors import ChecksumError, ConfigError, DataError
from ..safe_files import open_regular
from ..safe_pickle import UNPICKLE_ERRORS, NumpyUnpickler
from ..spec import param
from .checks import check_num_classes, single_labels
from .result import NoiseResult, make_result
from .specs import NOISE_MODELS, NoiseSpec

try:
    import fcntl
except ImportError:  # not POSIX: no lock (only parallel noise jobs on one raw folder need it)
    fcntl = None

__all__ = [
    "CIFARN_REPO",
    "CIFARN_COMMIT",
    "CIFAR10N_TYPES",
    "PUBLISHED_NOISE_RATES",
    "HUMAN_LABEL_FILES",
    "HumanLabelFile",
    "CIFAR10N",
    "CIFAR100N",
    "annotation_labels",
    "fetch_human_labels",
    "human_label_noise",
    "load_human_labels",
    "noise_rates",
    "read_human_label_file",
]

# The repository's newest commit in the snapshot read for this module (2023-05-17, a README
# edit). The label files took their final form at 199b915 (2023-03-15, "revise pytorch
# CIFAR-100N coarse labels": the coarse labels changed, the fine ones did not); CIFAR-10_human.pt
# has not changed since d112813 (2021-10-12). The sha256 and sizes are of the blobs in this
# commit's tree (their git blob ids are given too).
CIFARN_REPO = "UCSC-REAL/cifar-10-100n"
CIFARN_COMMIT = "49df7d8a69e355470c77c1c2f2424916325a394b"

#: ``type`` of cifar10n -> the key of its labels in CIFAR-10_human.pt
CIFAR10N_TYPES: dict[str, str] = {
    "aggre": "aggre_label",
    "worst": "worse_label",
    "random1": "random_label1",
    "random2": "random_label2",
    "random3": "random_label3",
}
CLEAN_KEY = "clean_label"
CIFAR100N_KEY = "noisy_label"

#: The noise rates (%) the paper and the repository's README publish, (dataset, label key) -> rate.
#: The files give aggre 9.01 % (4,505 of 50,000); the others agree to the published digits.
PUBLISHED_NOISE_RATES: dict[tuple[str, str], float] = {
    ("cifar10", "aggre_label"): 9.03,
    ("cifar10", "random_label1"): 17.23,
    ("cifar10", "random_label2"): 18.12,
    ("cifar10", "random_label3"): 17.64,
    ("cifar10", "worse_label"): 40.21,
    ("cifar100", "noisy_label"): 40.20,
}

#: A protocol-2 pickle of two (50,000,) int64 arrays is about 1 MB per array; the real ones are
#: 2.4 MB and 1.0 MB. Anything far larger is not one of these files (or a bomb): refused unread.
MAX_PICKLE_BYTES = 64 << 20
HUMAN = "human"  # the noise type of every client in NoiseResult.client_type


def _raw_url(path: str) -> str:
    return f"https://raw.githubusercontent.com/{CIFARN_REPO}/{CIFARN_COMMIT}/{path}"


@dataclass(frozen=True)
class HumanLabelFile:
    """One published label file: what it labels, where it lives (``remote``: pinned URL, size,
    sha256, checked by ``fetch``), the label arrays it must hold."""

    dataset: str
    path: str
    remote: RemoteFile
    git_blob: str
    num_classes: int
    num_samples: int
    keys: tuple[str, ...]


def _entry(dataset: str, path: str, *, sha256: str, size: int, git_blob: str, num_classes: int,
           keys: tuple[str, ...]) -> HumanLabelFile:
    remote = RemoteFile(path.rsplit("/", 1)[-1], (_raw_url(path),), sha256=sha256, size=size)
    return HumanLabelFile(dataset, path, remote, git_blob, num_classes, 50_000, keys)


#: prepared dataset name -> its human label file (read at call time, so tests may replace an entry).
HUMAN_LABEL_FILES: dict[str, HumanLabelFile] = {
    "cifar10": _entry(
        "cifar10", "data/CIFAR-10_human.pt",
        sha256="873e69c39cb9b5e97fb6bae2d60bb59b38a5cbc31d2b868f7903dcb2b9dd2310", size=2_401_007,
        git_blob="e5466d3cdb2fe3bade64c4ab58f20e18de15f217", num_classes=10,
        keys=(CLEAN_KEY, *CIFAR10N_TYPES.values()),
    ),
    "cifar100": _entry(
        "cifar100", "data/CIFAR-100_human.pt",
        sha256="bd2d80409754d420292d622e15e25248ba21e37d27429efac49c8da723f44394", size=1_000_959,
        git_blob="5dac9db8af8f7224f982fbac9794c67f60f8bd45", num_classes=100,
        keys=(CLEAN_KEY, CIFAR100N_KEY),
    ),
}


def human_label_file(dataset: str) -> HumanLabelFile:
    try:
        return HUMAN_LABEL_FILES[dataset]
    except KeyError:
        raise ConfigError(
            f"no CIFAR-N label file for dataset {dataset!r}; valid: {', '.join(sorted(HUMAN_LABEL_FILES))}"
        ) from None


# -- reading a torch.save archive of numpy arrays, without torch and without running code ----------


def _allowed_globals() -> dict[tuple[str, str], Any]:
    # numpy 1.x's names (as in the published files), numpy 2's, and the latin-1 _codecs.encode
    return NumpyUnpickler.numpy_globals()


class _LabelUnpickler(NumpyUnpickler):
    """Builds dicts, lists, ints, strings and numpy arrays; refuses every other global and any storage."""

    allowed = _allowed_globals()

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("the file holds tensor storages; CIFAR-N's label files hold numpy arrays only")


_READ_ERRORS = UNPICKLE_ERRORS


def read_human_label_file(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The label arrays of a CIFAR-N ``.pt`` file: key -> 1-D int64 array, in file order.

    Lists of ints (CIFAR-100N's coarse labels at the pinned commit) become arrays too. Raises
    DataError naming the file when it is not a ``torch.save`` zip with one ``<folder>/data.pkl``,
    when that pickle names anything but the allowed numpy globals (nothing is executed), or when
    a value is not a 1-D array of integers.
    """
    p = Path(path)
    fix = "delete it and fetch it again (python -m fnlcore.noise.cifarn)"
    try:
        with zipfile.ZipFile(p) as zf:
            names = zf.namelist()
            pkls = [n for n in names if n.count("/") == 1 and n.endswith("/data.pkl")]
            if len(pkls) != 1:
                raise DataError(f"{p}: expected one <folder>/data.pkl in the torch.save archive, found {pkls or 'none'}; "
                                f"this is not a CIFAR-N label file; {fix}")
            folder = pkls[0].split("/", 1)[0]
            if any(n.startswith(f"{folder}/data/") for n in names):
                raise DataError(f"{p}: the archive holds tensor storages ({folder}/data/...); CIFAR-N's label files "
                                f"hold numpy arrays only; {fix}")
            info = zf.getinfo(pkls[0])
            if info.file_size > MAX_PICKLE_BYTES:
                raise DataError(f"{p}: {pkls[0]} is {info.file_size:,} bytes, far more than a label file's; refused "
                                f"unread; {fix}")
            raw = zf.read(info)
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as exc:
        raise DataError(f"{p}: not a readable torch.save archive ({exc}); {fix}") from None
    try:
        obj = _LabelUnpickler(io.BytesIO(raw)).load()
    except _READ_ERRORS as exc:
        raise DataError(f"{p}: cannot read {pkls[0]} as a pickle of numpy arrays ({exc}); {fix}") from None
    if not isinstance(obj, dict):
        raise DataError(f"{p}: expected a pickled dict of label arrays, found {type(obj).__name__}; {fix}")
    out: dict[str, np.ndarray] = {}
    for key, value in obj.items():
        if not isinstance(key, str):
            raise DataError(f"{p}: a key of the label dict is a {type(key).__name__}, expected str; {fix}")
        try:
            arr = np.asarray(value)
        except (ValueError, TypeError):
            arr = np.asarray([], dtype=object)
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise DataError(f"{p}: {key!r} must be a 1-D array of class indices, got {arr.dtype} {arr.shape}; {fix}")
        out[key] = arr.astype(np.int64, copy=False)
    return out


def noise_rates(labels: dict[str, np.ndarray], keys: Sequence[str]) -> dict[str, float]:
    """Percent of samples whose label under each key differs from ``clean_label``."""
    clean = labels[CLEAN_KEY]
    return {k: 100.0 * float(np.mean(labels[k] != clean)) for k in keys}


def load_human_labels(dataset: str, path: str | os.PathLike, true_labels: np.ndarray | None = None,
                      num_classes: int | None = None) -> dict[str, np.ndarray]:
    """Read ``path`` as ``dataset``'s CIFAR-N file and check it: its keys, equal lengths, classes in
    range, and (given the prepared training labels) ``clean_label`` equal to them position by
    position, i.e. the file and the prepared set share one training order."""
    entry = human_label_file(dataset)
    labels = read_human_label_file(path)
    missing = [k for k in entry.keys if k not in labels]
    if missing:
        raise DataError(f"{path}: keys {missing} missing (found {sorted(labels)}); not {entry.path} of {CIFARN_REPO}")
    c = entry.num_classes if num_classes is None else int(num_classes)
    n = len(labels[CLEAN_KEY]) if true_labels is None else len(true_labels)
    for k in entry.keys:
        a = labels[k]
        if len(a) != n:
            raise DataError(f"{path}: {k!r} has {len(a):,} labels, the prepared {dataset} training set {n:,}; "
                            "the file is not for this set")
        if len(a) and (a.min() < 0 or a.max() >= c):
            raise DataError(f"{path}: {k!r} has classes outside [0, {c}) (min {a.min()}, max {a.max()})")
    if true_labels is not None:
        wrong = np.flatnonzero(labels[CLEAN_KEY] != np.asarray(true_labels))
        if wrong.size:
            first = ", ".join(str(i) for i in wrong[:5])
            raise DataError(
                f"{path}: clean_label differs from the prepared {dataset} training labels at {wrong.size:,} of {n:,} "
                f"positions (first: {first}). The CIFAR-N labels follow CIFAR's official training order "
                "(data_batch_1..5 of the python archive, concatenated); the prepared set is in another order or is "
                "another set. Fix: prepare the dataset again with this checkout (fnlcore/datasets/cifar.py)."
            )
    return labels


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Exclusive lock: parallel noise jobs fetch into one raw folder, and a ``.part`` is not safe to share."""
    with open_regular(path, "a") as fh:  # a planted link is refused, never followed
        if fcntl is not None:
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def fetch_human_labels(dataset: str, dest_dir: str | os.PathLike, mirrors: Sequence[str] = (),
                       timeout: float = 60.0) -> Path:
    """Make ``dest_dir/<file>`` the pinned CIFAR-N file of ``dataset`` (size and sha256 checked); its path.

    A file already there that verifies is used as is (no network); otherwise ``mirrors`` (base URLs
    or local folders), then the pinned GitHub URL, through :func:`fnlcore.datasets.download.fetch`.
    """
    entry = human_label_file(dataset)
    dest = Path(dest_dir)
    here = dest / entry.remote.filename
    with contextlib.suppress(DataError):  # a good copy needs no lock (the folder may be read-only)
        verify_file(here, sha256=entry.remote.sha256, size=entry.remote.size)
        return here
    dest.mkdir(parents=True, exist_ok=True)
    with _locked(dest / f".{entry.remote.filename}.lock"):
        return fetch(entry.remote, dest, mirrors=mirrors, timeout=timeout)


def _fetch_for_job(spec_name: str, dataset: str, raw_dir: Path) -> Path:
    """:func:`fetch_human_labels` for a noise job; a failed download says how to place the file."""
    entry = human_label_file(dataset)
    try:
        return fetch_human_labels(dataset, raw_dir)
    except ChecksumError:
        raise
    except DataError as exc:
        raise DataError(
            f"noise model {spec_name!r} needs {entry.remote.filename} ({CIFARN_REPO} at {CIFARN_COMMIT[:7]}, "
            f"{entry.path}; sha256 {entry.remote.sha256}, {entry.remote.size:,} bytes) in {raw_dir}, and it could "
            f"not be downloaded there:\n{exc}\nFix: place the file in {raw_dir} by hand, or fetch it where GitHub is "
            f"reachable: python -m fnlcore.noise.cifarn --dest {raw_dir} {dataset} [--mirror URL_OR_FOLDER]"
        ) from None


# -- the noise models -------------------------------------------------------------------------------


def annotation_labels(annotations: Any, n: int, num_classes: int) -> np.ndarray:
    """The class of each row of an (n, C) annotation table (one-hot human labels, or any class
    probabilities): its arg-max, the lowest class on a tie. DataError on a wrong shape or values."""
    a = np.asarray(annotations)
    if a.shape != (n, num_classes):
        raise DataError(
            f"soft_labels must be an (n, num_classes) = ({n}, {num_classes}) table of the human labels, got shape "
            f"{a.shape}; it comes from soft_labels_from(<the prepared dataset>)"
        )
    if n and (not np.issubdtype(a.dtype, np.number) or not np.isfinite(a).all() or (a < 0).any()
              or (a.sum(axis=1) <= 0).any()):
        raise DataError("soft_labels must hold finite non-negative class weights with a positive sum in every row")
    return a.argmax(axis=1).astype(np.int64) if n else np.zeros(0, np.int64)


def human_label_noise(model: str, labels: np.ndarray, assignment, num_classes: int, annotations: Any) -> NoiseResult:
    """Every assigned sample takes its human label (the arg-max of its ``annotations`` row).

    Every client is nominally noisy with the set-wide rate of the labels (nominal level: the
    fraction of all n samples whose human label differs from the true one, the published rate
    for the real files); the summary's realized rate is each client's own.
    """
    y = single_labels(labels, num_classes, assignment)
    human = annotation_labels(annotations, len(y), num_classes)
    given = y.copy()
    k = assignment.num_clients
    if k:
        idx = np.concatenate(assignment.clients)
        given[idx] = human[idx]
    rate = float(np.mean(human != y)) if len(y) else 0.0
    return make_result(model, y, given, np.full(k, rate > 0), np.full(k, rate), [HUMAN] * k)


@dataclass(frozen=True)
class _HumanLabelNoise(NoiseSpec):
    """Shared by cifar10n and cifar100n (not registered itself)."""

    needs_soft_labels: ClassVar[bool] = True
    dataset: ClassVar[str] = ""
    soft_labels_source: ClassVar[str] = (
        "the human labels one-hot: soft_labels_from(<the prepared CIFAR set>) downloads the pinned CIFAR-N file "
        "into its raw folder and checks it"
    )

    def label_key(self) -> str:
        raise NotImplementedError

    def check_dataset(self, num_classes: int, num_clients: int | None = None) -> None:
        check_num_classes(num_classes, minimum=2)

    def noisy_clients(self, num_clients: int, seed: int) -> list[int] | None:
        return None  # every client, once the file says its labels differ somewhere: known from the labels only

    def soft_labels_from(self, dataset: Any, annotator_files: list[str]) -> np.ndarray:
        """The human labels of ``dataset`` (a prepared CIFAR set) one-hot, (n, C) float32, in sample order."""
        name = dataset.info.name
        if name != self.dataset:
            standin = " (a smoke-scale stand-in has no human labels: run this noise at scale paper)" \
                if name.startswith("synthetic_") else ""
            raise ConfigError(
                f"noise model {self.name!r} gives CIFAR's training images the human labels of "
                f"{human_label_file(self.dataset).remote.filename} (Wei et al. 2022), so it runs on dataset "
                f"{self.dataset!r} only; the dataset here is {name!r}{standin}. Fix: use it in a table or data grid "
                f"entry with dataset: {self.dataset}"
            )
        raw = dataset.meta.get("raw_dir")
        if not raw:
            raise ConfigError(f"the prepared {name} in {dataset.out_dir} records no raw folder (meta.json raw_dir); "
                              "prepare the dataset again")
        path = _fetch_for_job(self.name, self.dataset, Path(raw))
        true = dataset.labels("train")
        c = dataset.info.num_classes
        labels = load_human_labels(self.dataset, path, true, c)
        human = labels[self.label_key()]
        onehot = np.zeros((len(human), c), dtype=np.float32)
        onehot[np.arange(len(human)), human] = 1.0
        return onehot

    def draw(self, labels, assignment, num_classes, seed, soft_labels=None) -> NoiseResult:
        return human_label_noise(self.name, labels, assignment, num_classes, soft_labels)


@NOISE_MODELS.register
@dataclass(frozen=True)
class CIFAR10N(_HumanLabelNoise):
    """CIFAR-10N: each client's CIFAR-10 training images take one of the published human label sets.

    type: 'aggre' (majority vote, 9.03 %) | 'worst' (a wrong annotation where any, 40.21 %) |
    'random1'..'random3' (one annotator's label, 17-18 %). Default 'worst': the hardest set and the
    one the paper's benchmark tables lead with; 'aggre' is close to clean.
    """

    name: ClassVar[str] = "cifar10n"
    paper: ClassVar[str] = f"CIFAR-10N, Wei et al. (ICLR'22), {CIFARN_REPO} data/CIFAR-10_human.pt (dataset cifar10 only)"
    dataset: ClassVar[str] = "cifar10"
    slug_fields: ClassVar[tuple] = (("type", ""),)

    type: str = param("worst", choices=tuple(CIFAR10N_TYPES),
                      doc="which human label set: aggre 9.03 %, worst 40.21 %, random1/2/3 17.23/18.12/17.64 % noisy")

    def label_key(self) -> str:
        return CIFAR10N_TYPES[self.type]


@NOISE_MODELS.register
@dataclass(frozen=True)
class CIFAR100N(_HumanLabelNoise):
    """CIFAR-100N: each client's CIFAR-100 training images take their human fine label (40.20 % noisy)."""

    name: ClassVar[str] = "cifar100n"
    paper: ClassVar[str] = f"CIFAR-100N, Wei et al. (ICLR'22), {CIFARN_REPO} data/CIFAR-100_human.pt (dataset cifar100 only)"
    dataset: ClassVar[str] = "cifar100"

    def label_key(self) -> str:
        return CIFAR100N_KEY


# -- command line: fill a raw folder where GitHub (or a mirror) is reachable --------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fnlcore.noise.cifarn",
                                     description="Download and check the pinned CIFAR-N label files.")
    parser.add_argument("datasets", nargs="*", metavar="DATASET",
                        help=f"which files: {', '.join(sorted(HUMAN_LABEL_FILES))} (default: all)")
    parser.add_argument("--dest", type=Path, required=True,
                        help="the dataset's raw folder (<data.raw_dir>/<dataset> unless data.datasets.<dataset>.raw_dir)")
    parser.add_argument("--mirror", action="append", default=[], metavar="URL_OR_FOLDER",
                        help="tried before GitHub: a base URL or local folder holding the files; repeatable")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per connection (default 60)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.datasets) - set(HUMAN_LABEL_FILES))
    if unknown:
        parser.error(f"unknown dataset(s) {unknown}; valid: {', '.join(sorted(HUMAN_LABEL_FILES))}")
    for d in args.datasets or sorted(HUMAN_LABEL_FILES):
        try:
            path = fetch_human_labels(d, args.dest, mirrors=args.mirror, timeout=args.timeout)
            entry = human_label_file(d)
            rates = noise_rates(load_human_labels(d, path), entry.keys[1:])
        except DataError as exc:  # ChecksumError included
            print(exc, file=sys.stderr)
            return 1
        print(path, " ".join(f"{k}={v:.2f}%" for k, v in rates.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
