"""Unpickling with an allow-list: the published files some papers ship as pickles (index sets, label
arrays, the CIFAR batches) are read without letting a file name any other global, so no code in them
can run.

Naming only numpy's own globals is not enough: ``numpy.ndarray`` called with a ``buffer`` builds an
object array whose elements are whatever addresses the file's bytes name, and ``dtype.__setstate__``
trusts the flags a file gives it (an ``'O8'`` dtype marked "holds no objects" lets an array's raw
bytes become object pointers). :class:`NumpyUnpickler` therefore builds arrays only the way numpy's
own pickles do (``_reconstruct`` plus ``__setstate__``), never calls ``ndarray``, accepts a dtype's
state only when it equals what numpy itself would write for that type, and fills an object array
only from a pickled list (each element of which went through this unpickler too)."""

from __future__ import annotations

import pickle
import struct
from typing import Any

import numpy as np

#: What reading a truncated, corrupt or refused pickle can raise (the Python unpickler raises
#: struct.error, KeyError and IndexError where the C one raised UnpicklingError).
UNPICKLE_ERRORS = (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
                   MemoryError, struct.error, RecursionError)


def weights_only_refusal(err: BaseException) -> str:
    """One line for a load that ``torch.load(weights_only=True)`` refused: which global or opcode the
    file asked for (torch's own message is a page long); other errors as their first line."""
    text = str(err)
    _, marker, rest = text.partition("WeightsUnpickler error:")
    if isinstance(err, pickle.UnpicklingError) and marker:
        what = (rest.strip().splitlines() or ["?"])[0].split(" Please use")[0].strip().rstrip(".")
        return (f"refused, nothing in it was run: it holds more than tensors and plain data ({what}); "
                "a checkpoint of an older fnlcore version or a crafted file")
    lines = text.strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


class AllowListUnpickler(pickle._Unpickler):  # the Python implementation: its BUILD can be checked
    """Builds only the globals of ``allowed`` ((module, name) -> the object); refuses every other."""

    allowed: dict[tuple[str, str], Any] = {}
    #: what the message calls a refused global
    refusal = "refusing to load global"

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self.allowed[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"{self.refusal} {module}.{name}") from None

    def load_build(self) -> None:
        raise pickle.UnpicklingError(
            f"refusing to set the state of a {type(self.stack[-2]).__name__} (BUILD): these files hold plain data")

    dispatch = dict(pickle._Unpickler.dispatch)
    dispatch[pickle.BUILD[0]] = load_build


class _NdarrayName:
    """What ``numpy.ndarray`` resolves to: a name ``_reconstruct`` accepts, never a callable."""

    def __repr__(self) -> str:
        return "numpy.ndarray"

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        raise pickle.UnpicklingError("refusing to call numpy.ndarray: it can build an array over raw bytes; "
                                     "numpy's own pickles never call it")


_NDARRAY = _NdarrayName()
# Kinds of dtype a published file holds: numbers, bools, byte/unicode strings, and objects (the
# 0-d object array np.save wraps a dict in). Structured, void and datetime dtypes are refused.
_KINDS = frozenset("biufc?SUO")


def _check_dtype(dt: Any) -> np.dtype:
    """``dt`` if it is a plain dtype exactly as numpy builds it for its type string, else refuse."""
    if not isinstance(dt, np.dtype):
        raise pickle.UnpicklingError(f"refusing {type(dt).__name__} where a numpy dtype belongs")
    canon = np.dtype(dt.str)
    if (dt.kind not in _KINDS or dt.names is not None or dt.subdtype is not None or dt.metadata
            or dt.flags != canon.flags or dt.itemsize != canon.itemsize or dt != canon):
        raise pickle.UnpicklingError(f"refusing dtype {dt!r} (flags {dt.flags}): not a plain numpy type as numpy "
                                     "writes it")
    return dt


def _safe_dtype(spec: Any, align: Any = False, copy: Any = False) -> np.dtype:
    if isinstance(spec, bytes):  # a Python 2 pickle read with encoding="bytes" (the CIFAR batches)
        spec = spec.decode("ascii", "replace")
    if not isinstance(spec, str):
        raise pickle.UnpicklingError(f"refusing numpy.dtype({type(spec).__name__}): only a type string")
    try:
        dt = np.dtype(spec, bool(align), bool(copy))
    except TypeError as exc:
        raise pickle.UnpicklingError(f"refusing numpy.dtype({spec!r}): {exc}") from None
    return _check_dtype(dt)


def _latin1_encode(text: Any, encoding: str = "latin1") -> bytes:
    """``_codecs.encode`` as a protocol-2 pickle uses it (bytes written as latin-1 text); nothing else."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"refusing _codecs.encode({type(text).__name__}, {encoding!r}): only latin-1 text")
    return text.encode("latin1")


def _safe_reconstruct(subtype: Any, shape: Any, typecode: Any) -> np.ndarray:
    # numpy's ndarray.__reduce__ writes exactly _reconstruct(ndarray, (0,), b'b'); the state follows
    if subtype is not _NDARRAY or shape != (0,) or typecode not in (b"b", "b"):
        raise pickle.UnpicklingError(f"refusing _reconstruct({subtype!r}, {shape!r}, {typecode!r}): "
                                     "not how numpy pickles an array")
    return np._core.multiarray._reconstruct(np.ndarray, (0,), b"b")


def _safe_scalar(dtype: Any, data: Any) -> Any:
    dt = _check_dtype(dtype)
    if dt.hasobject or dt.kind not in "biufc?" or not isinstance(data, bytes) or len(data) != dt.itemsize:
        raise pickle.UnpicklingError(f"refusing numpy scalar of dtype {dt!r} from "
                                     f"{type(data).__name__}: only a number's {dt.itemsize} raw bytes")
    return np._core.multiarray.scalar(dt, data)


class NumpyUnpickler(AllowListUnpickler):
    """An allow-list unpickler that also builds numpy arrays, dtypes and scalars as numpy pickles them,
    and nothing that could turn a file's bytes into object pointers (see the module's docstring)."""

    @staticmethod
    def numpy_globals(scalars: bool = False) -> dict[tuple[str, str], Any]:
        """The numpy globals, under numpy 1.x's (``numpy.core``) and numpy 2's (``numpy._core``) names, and
        the latin-1 ``_codecs.encode`` a protocol-2 pickle writes an array's bytes with."""
        table: dict[tuple[str, str], Any] = {("numpy", "ndarray"): _NDARRAY, ("numpy", "dtype"): _safe_dtype,
                                             ("_codecs", "encode"): _latin1_encode}
        for mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
            table[(mod, "_reconstruct")] = _safe_reconstruct
            if scalars:
                table[(mod, "scalar")] = _safe_scalar
        return table

    def load_build(self) -> None:
        state = self.stack[-1]
        inst = self.stack[-2]
        if isinstance(inst, np.dtype):
            self._build_dtype(inst, state)
        elif type(inst) is np.ndarray:
            self._build_array(inst, state)
        else:
            AllowListUnpickler.load_build(self)
        self.stack.pop()

    @staticmethod
    def _build_dtype(dt: np.dtype, state: Any) -> None:
        canon = np.dtype(dt.str)
        # checked before __setstate__ too: an array built earlier may share this dtype object
        if not (isinstance(state, tuple) and len(state) == 8 and state[2:5] == (None, None, None)
                and state[5] in (-1, canon.itemsize) and state[6] in (-1, canon.alignment)
                and state[7] == canon.flags):
            raise pickle.UnpicklingError(f"refusing dtype state {state!r} for {dt!r}: not numpy's own state of a "
                                         "plain dtype (structured, subarray or altered flags)")
        dt.__setstate__(state)
        _check_dtype(dt)  # the flags, sizes and byte order the state set must be numpy's own for this type

    @staticmethod
    def _build_array(arr: np.ndarray, state: Any) -> None:
        if not (isinstance(state, tuple) and len(state) == 5):
            raise pickle.UnpicklingError(f"refusing array state of {type(state).__name__}")
        _, shape, dt, _, raw = state
        dt = _check_dtype(dt)
        if dt.hasobject:
            if not isinstance(raw, list):  # numpy's own object pickles list the elements
                raise pickle.UnpicklingError("refusing an object array built from raw bytes")
        elif not isinstance(raw, (bytes, bytearray, str)):
            raise pickle.UnpicklingError(f"refusing array data of {type(raw).__name__}")
        arr.__setstate__(state)

    dispatch = dict(AllowListUnpickler.dispatch)
    dispatch[pickle.BUILD[0]] = load_build
