"""The allow-list unpickler cannot be walked around with numpy's own globals (issue 46, item 1).

Each crafted file names only globals the readers allow (numpy.ndarray, numpy.dtype, _reconstruct),
yet asks for an object array whose element is an address taken from the file's bytes (here 0, a
NULL pointer: a reader that builds it crashes on first use). The readers run in a child process so a
reader that builds such an array shows up as a failed test, not a crashed test run.
"""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import fnlcore
from tests.support.upstream_formats import write_tar_gz

_ADDRESS = b"\0" * 8


class _Call:
    """Pickles as ``func(*args)`` (then ``__setstate__(state)`` when given)."""

    def __init__(self, func, args, state=None):
        self.func, self.args, self.state = func, args, state

    def __reduce__(self):
        return (self.func, self.args) if self.state is None else (self.func, self.args, self.state)


def _ndarray_with_buffer():
    # ndarray((1,), dtype('O8'), <8 bytes>): an object array over raw bytes
    return _Call(np.ndarray, ((1,), np.dtype("O8"), _ADDRESS))


def _object_dtype_marked_plain():
    # an 'O8' dtype whose state says "holds no objects", then an array of it filled from raw bytes
    dtype = _Call(np.dtype, ("O8", False, True), (3, "|", None, None, None, -1, -1, 0))
    return _Call(np._core.multiarray._reconstruct, (np.ndarray, (0,), b"b"), (1, (1,), dtype, False, _ADDRESS))


CRAFTS = {"ndarray-buffer": _ndarray_with_buffer, "dtype-flags": _object_dtype_marked_plain}


def _npy(path: Path, payload: bytes) -> Path:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "|O", "fortran_order": False, "shape": ()})
    path.write_bytes(buf.getvalue() + payload)
    return path


def _pt(path: Path, payload: bytes) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", payload)
        zf.writestr("archive/version", b"3\n")
    return path


def _cifar(path: Path, payload: bytes) -> Path:
    return write_tar_gz(path, "cifar-10-batches-py", [("batches.meta", payload)])


def _reader(extra=None):
    from fnlcore.safe_pickle import NumpyUnpickler  # here: the child-process test runs on any version

    class _Reader(NumpyUnpickler):
        allowed = {**NumpyUnpickler.numpy_globals(scalars=True), **(extra or {})}

    return _Reader


_READ = """
import json, sys
from fnlcore.errors import DataError
from fnlcore.datasets import cifar, official_files
from fnlcore.noise import cifarn
readers = {"npy": official_files.read_client_index_npy, "pt": cifarn.read_human_label_file,
           "cifar": lambda p: cifar.read_cifar_archive(p, cifar.LAYOUTS["cifar10"])}
out = {}
for kind, path in json.loads(sys.argv[1]):
    try:
        got = readers[kind](path)
        out[path] = "loaded " + repr(got)[:80]
    except DataError as exc:
        out[path] = "DataError " + str(exc)
print(json.dumps(out))
"""


def test_crafted_object_arrays_are_refused_by_every_reader(tmp_path):
    files = []
    for name, craft in CRAFTS.items():
        for kind, write, wrap in (("npy", _npy, lambda a: {0: a}), ("pt", _pt, lambda a: {"clean_label": a}),
                                  ("cifar", _cifar, lambda a: {"label_names": a})):
            path = write(tmp_path / f"{name}.{kind}", pickle.dumps(wrap(craft()), protocol=2))
            files.append((kind, str(path)))
    env = {"PYTHONPATH": str(Path(fnlcore.__file__).resolve().parents[1]), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", _READ, json.dumps(files)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, f"a reader crashed the process (rc {proc.returncode}): {proc.stderr[-2000:]}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for _, path in files:
        assert out[path].startswith("DataError "), f"{path}: {out[path]}"
        assert path in out[path]  # the message names the file
        assert "refusing" in out[path], out[path]


@pytest.mark.parametrize("craft", sorted(CRAFTS))
def test_the_unpickler_refuses_before_building_the_array(craft):
    _Reader = _reader()
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        _Reader(io.BytesIO(pickle.dumps(CRAFTS[craft](), protocol=2))).load()


@pytest.mark.parametrize("value", [
    np.arange(5, dtype=np.int64), np.zeros((2, 3), np.uint8), np.array([1.5, 2.5], np.float32),
    np.asfortranarray(np.arange(6.0).reshape(2, 3)), np.array(["ab", "c"]), np.int64(7), np.float64(0.5),
])
def test_numpys_own_pickles_still_load(value):
    _Reader = _reader()
    for protocol in (2, 3, 4):
        got = _Reader(io.BytesIO(pickle.dumps(value, protocol=protocol))).load()
        assert type(got) is type(value) and got.dtype == value.dtype
        np.testing.assert_array_equal(got, value)


def test_an_object_array_of_plain_values_still_loads():
    # np.save of a dict wraps it in a 0-d object array: numpy pickles its elements as a list
    arr = np.empty((), dtype=object)
    arr[()] = {0: [1, 2]}

    _Reader = _reader({("builtins", "list"): list})
    got = _Reader(io.BytesIO(pickle.dumps(arr, protocol=3))).load()
    assert got.dtype == object and got.item() == {0: [1, 2]}
