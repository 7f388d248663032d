"""A run's state on disk: the method's persistent state, saved and restored by the engine from what
the method declares, its per-client stores, and the run's checkpoint (:class:`RunCheckpoint`), the
one module of the engine that writes or reads a file.

A method declares its global networks (``networks``) and the names of the attributes that
carry across rounds (``persistent``: tensors, numpy arrays, numbers, containers of these,
objects with ``state_dict``/``load_state_dict`` such as samplers, and :class:`ClientStore` objects
of per-client models). :func:`method_state` copies them; :func:`load_method_state` puts them
back and checks that the checkpoint holds exactly the declared state with the same shapes, so a
checkpoint of a changed method is refused with its reason instead of loading half a state.

Tensors keep where they live: a tensor on the run's device is restored to the run's device
(which may differ from the one that saved it), a host tensor stays on the host.

Per-client models (FedGR's EMA models, FedFixer's personalised ones, FedIRM's teachers) live in
a :class:`ClientStore`: in memory only while the round that uses them runs, on disk otherwise,
and a checkpoint writes only the entries that changed since the previous one.

Reading a checkpoint never runs code. Every file is read with ``torch.load(weights_only=True)``,
whose unpickler builds only tensors and plain data (dicts, lists, tuples, sets, str, numbers,
None): a crafted file is refused, not executed. :func:`to_safe_form` turns what else a state holds
(numpy arrays and scalars, frozensets, dicts with other keys, the run's-device marker) into
tagged plain data and :func:`from_safe_form` rebuilds it exactly, so no global is allow-listed.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pickle
import re
import shutil
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import IO, Any, Callable, Mapping

import numpy as np
import torch

from ..errors import ConfigError, DataError
from ..io import atomic_path, ensure_free_space
from ..provenance import Provenance, plugin_digest
from ..safe_pickle import weights_only_refusal
from .context import RunContext
from .state import load, snapshot, State


class _OnDevice:
    """Marks a saved tensor that lived on the run's device (restored to the run's device)."""

    __slots__ = ("t",)

    def __init__(self, t: torch.Tensor):
        self.t = t


def _pack(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        t = v.detach().to("cpu", copy=True)
        return _OnDevice(t) if v.device.type != "cpu" else t
    if isinstance(v, np.ndarray):
        return v.copy()
    if isinstance(v, dict):
        return {k: _pack(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_pack(x) for x in v)
    if hasattr(v, "state_dict") and hasattr(v, "load_state_dict"):
        return {"__state__": _pack(v.state_dict())}
    return v


def _unpack(saved: Any, device: torch.device) -> Any:
    if isinstance(saved, _OnDevice):
        return saved.t.to(device)
    if isinstance(saved, torch.Tensor):
        return saved.clone()
    if isinstance(saved, np.ndarray):
        return saved.copy()
    if isinstance(saved, dict):
        return {k: _unpack(x, device) for k, x in saved.items()}
    if isinstance(saved, (list, tuple)):
        return type(saved)(_unpack(x, device) for x in saved)
    return saved


# -- the safe form: what torch.load(weights_only=True) reads without allow-listing anything ------------

# The tag key of a rebuilt value's dict; a real dict holding this key is stored as a list of pairs.
_TAG = "\x00fnl"
_PLAIN_KEYS = (str, int, float, bool, type(None))
_PASS = (str, int, float, bool, complex, bytes, type(None))


def to_safe_form(v: Any, where: str = "state") -> Any:
    """``v`` as tensors and plain data only (for ``torch.save``); :func:`from_safe_form` rebuilds it.

    A type that cannot be stored so is a TypeError naming where it sits: such a checkpoint
    could not be read back without unpickling arbitrary objects, so it is not written."""
    if type(v) in _PASS:  # exact types: np.float64 and np.str_ subclass float and str but pickle as numpy
        return v
    if isinstance(v, torch.Tensor):
        if type(v) not in (torch.Tensor, torch.nn.Parameter):
            raise TypeError(f"{where}: a {type(v).__name__} (a tensor subclass) cannot be checkpointed safely")
        return v
    if isinstance(v, _OnDevice):
        return {_TAG: "on_device", "t": to_safe_form(v.t, where)}
    if isinstance(v, np.ndarray):
        return _array_form(v, "ndarray", where)
    if isinstance(v, np.generic):
        return _array_form(np.asarray(v), "npscalar", where)
    if isinstance(v, (set, frozenset)):
        return {_TAG: type(v).__name__, "items": [to_safe_form(x, f"{where} item") for x in v]}
    if type(v) in (dict, OrderedDict):
        if all(type(k) in _PLAIN_KEYS for k in v) and _TAG not in v:
            return type(v)((k, to_safe_form(x, f"{where}[{k!r}]")) for k, x in v.items())
        return {_TAG: "dict", "items": [[to_safe_form(k, f"{where} key"), to_safe_form(x, f"{where}[{k!r}]")]
                                        for k, x in v.items()]}
    if type(v) in (list, tuple):
        return type(v)(to_safe_form(x, f"{where}[{i}]") for i, x in enumerate(v))
    raise TypeError(f"{where}: a {type(v).__module__}.{type(v).__qualname__} cannot be checkpointed safely "
                    "(tensors, numpy arrays and scalars, numbers, strings and containers of these can)")


def _array_form(a: np.ndarray, tag: str, where: str) -> dict:
    if a.dtype.hasobject:
        raise TypeError(f"{where}: a numpy array of Python objects cannot be checkpointed safely")
    # the bytes of the array in its memory order (C, or Fortran as numpy's pickle keeps it)
    fortran = a.ndim > 1 and a.flags.f_contiguous and not a.flags.c_contiguous
    flat = np.ascontiguousarray(a.T if fortran else a).reshape(-1).view(np.uint8)
    return {_TAG: tag, "dtype": a.dtype.str, "shape": list(a.shape), "fortran": fortran,
            "data": torch.from_numpy(flat.copy())}


def from_safe_form(v: Any) -> Any:
    """The value :func:`to_safe_form` stored; a ValueError when ``v`` is not such a form."""
    if isinstance(v, list):
        return [from_safe_form(x) for x in v]
    if isinstance(v, tuple):
        return tuple(from_safe_form(x) for x in v)
    if not isinstance(v, dict):
        return v
    if _TAG not in v:
        return type(v)((k, from_safe_form(x)) for k, x in v.items())
    tag = v[_TAG]
    if tag == "on_device" and isinstance(v.get("t"), torch.Tensor):
        return _OnDevice(v["t"])
    if tag in ("ndarray", "npscalar"):
        a = _array_of(v)
        return a if tag == "ndarray" else a[()]
    if tag in ("set", "frozenset") and isinstance(v.get("items"), list):
        return (set if tag == "set" else frozenset)(from_safe_form(x) for x in v["items"])
    if tag == "dict" and isinstance(v.get("items"), list) and all(isinstance(p, list) and len(p) == 2
                                                                   for p in v["items"]):
        return {from_safe_form(k): from_safe_form(x) for k, x in v["items"]}
    raise ValueError(f"not a stored value: tag {tag!r} with keys {sorted(map(str, v))}")


def _array_of(v: dict) -> np.ndarray:
    data, shape = v.get("data"), v.get("shape")
    if not (isinstance(data, torch.Tensor) and data.dtype == torch.uint8 and data.ndim == 1 and isinstance(shape, list)
            and all(type(n) is int and n >= 0 for n in shape) and isinstance(v.get("dtype"), str)):
        raise ValueError("not a stored numpy array")
    dtype = np.dtype(v["dtype"])  # a type string such as '<f8'; numpy parses it, nothing is imported
    if dtype.hasobject or dtype.itemsize * math.prod(shape) != data.numel():
        raise ValueError(f"a stored numpy array of dtype {dtype} and shape {shape} cannot hold {data.numel()} bytes")
    flat = data.numpy().view(dtype)
    return flat.reshape(shape[::-1]).T if v.get("fortran") else flat.reshape(shape)


def load_safely(path: str | Path | IO[bytes]) -> Any:
    """A file written with ``torch.save(to_safe_form(...))``, read without running code: a crafted or
    older-format file raises ``pickle.UnpicklingError`` (:func:`refusal` says why in one line)."""
    return from_safe_form(torch.load(path, map_location="cpu", weights_only=True))


refusal = weights_only_refusal  # one line for a refused load (fnlcore.safe_pickle)


def persistent_names(cls) -> tuple[str, ...]:
    """Every ``persistent`` name along the class's bases (base classes' first, no repeats)."""
    out: list[str] = []
    for c in reversed(cls.__mro__):
        for n in c.__dict__.get("persistent", ()):
            if n not in out:
                out.append(n)
    return tuple(out)


def method_state(method, files: bool = False) -> dict:
    """The method's declared state: its global networks and its persistent attributes (copies).

    A :class:`ClientStore` is saved whole (every client's entry) or, with ``files`` (the engine's
    checkpoints), as the names of its files on disk."""
    attrs = {}
    for name in persistent_names(type(method)):
        v = getattr(method, name)
        if isinstance(v, ClientStore):
            attrs[name] = v.checkpoint() if files else {"entries": {k: v.get(k) for k in v.clients()}}
        else:
            attrs[name] = _pack(v)
    return {"globals": {n: snapshot(g) for n, g in method.globals.items()}, "attrs": attrs}


def missing_store_files(method, d: dict) -> list[str]:
    """Per-client files a checkpoint's state ``d`` names that are not on disk (``<store>/<file>``)."""
    out = []
    for name in persistent_names(type(method)):
        cur, saved = getattr(method, name, None), d.get("attrs", {}).get(name)
        if isinstance(cur, ClientStore) and isinstance(saved, dict) and "files" in saved:
            out += [f"{name}/{f}" for f in cur.missing(saved)]
    return out


def load_method_state(method, d: dict) -> None:
    """Restore what :func:`method_state` saved; a ConfigError names what does not match the declarations."""

    want = set(persistent_names(type(method)))
    got = set(d.get("attrs", {}))
    if set(d.get("globals", {})) != set(method.globals) or got != want:
        raise ConfigError(
            f"the checkpoint's state does not match method {type(method).__name__!r}: networks "
            f"{sorted(d.get('globals', {}))} vs {sorted(method.globals)}, persistent state {sorted(got)} vs "
            f"{sorted(want)}; it was written by other code: move it aside to restart the run"
        )
    for n, st in d["globals"].items():
        load(method.globals[n], st)
    dev = method.ctx.device
    for name, saved in d["attrs"].items():
        cur = getattr(method, name)
        if isinstance(cur, ClientStore):
            cur.restore(saved)
        elif hasattr(cur, "load_state_dict") and isinstance(saved, dict) and "__state__" in saved:
            cur.load_state_dict(_unpack(saved["__state__"], dev))
        else:
            value = _unpack(saved, dev)
            if isinstance(cur, torch.Tensor) and (not isinstance(value, torch.Tensor) or value.shape != cur.shape
                                                  or value.dtype != cur.dtype):
                got_shape = (tuple(value.shape), value.dtype) if isinstance(value, torch.Tensor) else type(value)
                raise ConfigError(
                    f"the checkpoint's {name!r} is {got_shape}, the run's is {(tuple(cur.shape), cur.dtype)}: "
                    "it belongs to another run; move it aside to restart"
                )
            setattr(method, name, value)


class ClientStore:
    """Per-client models (or any tensor dicts) kept on disk between the rounds that use them.

    ``get(k)`` returns client k's entry (None before its first ``put``); ``put(k, state)`` keeps a
    host copy. The engine calls :meth:`end_round`: entries written this round go to disk and leave
    memory, so a run holds at most one round's entries whatever the client count. A checkpoint
    (:meth:`checkpoint`) names each client's file; files are versioned by the round that wrote
    them and an older version is removed only once a newer checkpoint no longer names it, so a
    run killed at any point resumes from a consistent set.

    ``folder``: where entries live (the engine gives ``<checkpoint>.clients/<name>``; without a
    checkpoint a temporary folder removed with the store).
    """

    def __init__(self, name: str):
        self.name = name
        self._folder: Path | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._mem: dict[int, State] = {}  # written since the last flush
        self._files: dict[int, str] = {}  # client -> file name on disk (latest version)
        self._named: set[str] = set()  # files the last checkpoint names (kept until superseded)
        self._round = 0

    # -- where ---------------------------------------------------------------------------
    def attach(self, folder: Path | None) -> None:
        """Keep entries under ``folder`` (None: a temporary folder)."""
        if folder is None:
            self._tmp = tempfile.TemporaryDirectory(prefix=f"fnl-{self.name}-")
            folder = Path(self._tmp.name)
        folder.mkdir(parents=True, exist_ok=True)
        self._folder = folder

    @property
    def folder(self) -> Path:
        if self._folder is None:
            self.attach(None)
        return self._folder

    # -- use -------------------------------------------------------------------------------
    def __contains__(self, k: int) -> bool:
        return int(k) in self._mem or int(k) in self._files

    def __len__(self) -> int:
        return len(set(self._mem) | set(self._files))

    def clients(self) -> list[int]:
        return sorted(set(self._mem) | set(self._files))

    def get(self, k: int) -> State | None:
        k = int(k)
        if k in self._mem:
            return self._mem[k]
        if k in self._files:
            path = self.folder / self._files[k]
            try:  # tensors only: a crafted file is refused, not run
                return torch.load(path, map_location="cpu", weights_only=True)
            except (RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as err:  # truncated, corrupt, crafted
                raise DataError(
                    f"{path}: client {k}'s saved {self.name} state is unreadable ({refusal(err)}); "
                    f"move {self.folder.parent} and the checkpoint beside it aside to restart the run"
                ) from None
        return None

    def put(self, k: int, state: State) -> None:
        self._mem[int(k)] = {n: v.detach().to("cpu", copy=True) for n, v in state.items()}

    def begin_round(self, r: int) -> None:
        self._round = int(r)

    def end_round(self) -> None:
        """Write this round's entries to disk and drop them from memory."""
        if self._mem:
            size = sum(v.numel() * v.element_size() for st in self._mem.values() for v in st.values())
            ensure_free_space(self.folder, int(size * 1.05) + (64 << 10) * len(self._mem),
                              f"{len(self._mem)} clients' {self.name} state")
        for k, st in sorted(self._mem.items()):
            fname = f"client{k}.r{self._round}.pt"
            with atomic_path(self.folder / fname, suffix=".pt") as tmp:
                torch.save(st, tmp)
            old = self._files.get(k)
            self._files[k] = fname
            if old is not None and old != fname and old not in self._named:
                _remove(self.folder / old)
        self._mem = {}

    # -- checkpoints ----------------------------------------------------------------------
    def checkpoint(self) -> dict:
        """Flush, and name the current files (what a checkpoint records)."""
        self.end_round()
        return {"files": dict(self._files)}

    def committed(self) -> None:
        """The checkpoint that named the current files is on disk: files it does not name can go."""
        keep = set(self._files.values())
        for f in self._named - keep:
            _remove(self.folder / f)
        self._named = keep
        for p in self.folder.glob("client*.pt"):  # written after the previous checkpoint, then superseded
            if p.name not in keep:
                _remove(p)

    def restore(self, saved: dict) -> None:
        """Back to a saved state: whole entries, or the files of a checkpoint in this store's folder."""
        if "entries" in saved:
            self._files, self._mem = {}, {}
            for k, st in saved["entries"].items():
                self.put(k, st)
            self.end_round()
            return
        missing = self.missing(saved)
        if missing:
            raise ConfigError(
                f"the checkpoint names per-client state files that are gone from {self.folder}: {missing[:3]}; "
                "move the checkpoint aside to restart the run"
            )
        self._files = {int(k): _store_file(f) for k, f in saved["files"].items()}
        self._named = set(self._files.values())
        self._mem = {}

    def missing(self, saved: dict) -> list[str]:
        """Files a checkpoint's ``saved`` entry names that are not in this store's folder (a ValueError
        for a name that is not one of this store's files)."""
        return [f for f in map(_store_file, saved.get("files", {}).values()) if not (self.folder / f).is_file()]

    def reset(self) -> None:
        """Forget every entry and remove the files on disk (a run restarting from round 0)."""
        self._mem, self._files, self._named = {}, {}, set()
        if self._folder is not None:
            for p in self._folder.glob("client*.pt"):
                _remove(p)

    def clear(self) -> None:
        if self._folder is not None and self._tmp is None:
            shutil.rmtree(self._folder, ignore_errors=True)


_STORE_FILE = re.compile(r"client\d+\.r\d+\.pt")


def _store_file(name: Any) -> str:
    """``name`` if it is a per-client file name as :meth:`ClientStore.end_round` writes them: a checkpoint
    naming another path (``../x``) would have the store read, and later remove, a file outside its folder."""
    if not (isinstance(name, str) and _STORE_FILE.fullmatch(name)):
        raise ValueError(f"{name!r} is not a per-client state file name (client<k>.r<round>.pt)")
    return name


def _remove(p: Path) -> None:
    try:
        os.remove(p)
    except FileNotFoundError:
        pass


# -- the run's checkpoint ------------------------------------------------------------------

# 2: the relabel log; 3: declared method state, per-client stores on disk; 4: what made it (code, settings);
# 5: tensors and plain data only, read with weights_only=True (to_safe_form)
CHECKPOINT_VERSION = 5

# Training settings that never change a run's numbers (kept out of its identity, as out of its path).
_NOT_IDENTITY = ("checkpoint_every",)


def run_identity(method, ctx: RunContext, extra: Mapping[str, Any] | None = None) -> dict:
    """Everything that determines a run's numbers, as the engine sees it; ``extra`` adds what it
    cannot see (the dataset, a digest of the noisy labels). The device is left out: a checkpoint
    resumes on another device."""
    training = {f.name: getattr(ctx.settings, f.name) for f in dataclasses.fields(ctx.settings)
                if f.name not in _NOT_IDENTITY}
    return {"training": training, "method": method.params, "seed": ctx.seed, "model": ctx.model_name,
            "clients": len(ctx.data.clients), "plugin_code": plugin_digest(type(method)), **(extra or {})}


class RunCheckpoint:
    """A run's checkpoint file and the per-client stores beside it (``<checkpoint>.clients/<store>``):
    what the server loop (:class:`~fnlcore.fl.simulation.Simulation`, whose docstring says when)
    saves and resumes from. Without a path nothing is saved and the stores live in temporary folders.

    A checkpoint records what made it (``provenance``: the code's version and a digest of the run's
    settings, :func:`run_identity` with ``identity``, what the engine cannot see); one of other code or
    settings is never resumed. One that does
    not load is moved aside to ``<checkpoint>.corrupt`` (``.corrupt.1``, ...: nothing is
    overwritten); either way the run restarts from round 0 and ``progress`` says why."""

    def __init__(self, path: str | Path | None, method, ctx: RunContext, identity: Mapping[str, Any] | None,
                 progress: Callable[[str], None]):
        self.path = Path(path) if path else None
        self.method, self.ctx, self.progress = method, ctx, progress
        self.provenance = Provenance.of(run_identity(method, ctx, identity))
        self.stores = method.stores()
        for st in self.stores:
            st.attach(None if self.path is None else Path(str(self.path) + ".clients") / st.name)

    def begin_round(self, r: int) -> None:
        for st in self.stores:
            st.begin_round(r)

    def end_round(self) -> None:
        """What this round wrote to the stores goes to disk, out of memory."""
        for st in self.stores:
            st.end_round()

    def save_round(self, next_round: int, rows: list[dict]) -> None:
        """Checkpoint the run before ``next_round``, with its metric rows so far."""
        if self.path is None:
            return
        payload = {
            "version": CHECKPOINT_VERSION,
            "made_by": self.provenance.to_dict(),
            "next_round": next_round,
            "method": method_state(self.method, files=True),
            "given": self.ctx.data.given.detach().cpu().clone(),
            "relabels": self.ctx.data.relabels.state_dict(),
            "rng": self.ctx.rng_state(),
            "rows": rows,
        }
        ensure_free_space(self.path.parent, estimated_size(payload), f"checkpoint {self.path.name}")
        safe = to_safe_form(payload, "checkpoint")  # before the write: a type it cannot hold fails here, naming it
        with atomic_path(self.path, suffix=".pt") as tmp:
            torch.save(safe, tmp)
        for st in self.stores:
            st.committed()

    def resume(self) -> tuple[int, list[dict]] | None:
        """(the next round, the metric rows so far) of the checkpoint, loaded into the run; None when
        there is none to resume (none written, or one of other code, settings or shape: restarted)."""
        path = self.path
        if path is None or not path.exists():
            return None
        try:
            payload = load_safely(path)  # tensors and plain data only: the folder may be writable by others
        except PermissionError as err:
            raise DataError(f"{path}: cannot read the run's checkpoint ({err}); make it readable and rerun") from None
        except Exception as err:  # truncated or corrupt (zip, EOF errors), older format or crafted (refused)
            return self._restart(f"checkpoint {path} is unreadable ({refusal(err)})", aside=True)
        if not isinstance(payload, dict) or not isinstance(payload.get("version"), int):
            return self._restart(f"checkpoint {path} is unreadable (not a checkpoint: no format version)", aside=True)
        made_by = Provenance.from_dict(payload.get("made_by"))
        if payload.get("version") != CHECKPOINT_VERSION or not self.provenance.same_as(made_by):
            old = made_by.describe() if made_by is not None else (
                f"checkpoint format {payload.get('version')!r}, which does not record its code and settings")
            return self._restart(f"checkpoint {path} was written by {old}; this run is {self.provenance.describe()}")
        try:
            _check_payload(payload, self.ctx, self.method)
            missing = missing_store_files(self.method, payload["method"])
        except (TypeError, ValueError, KeyError, AttributeError) as err:  # before anything is loaded into the run
            return self._restart(f"checkpoint {path} is unreadable (not a checkpoint of this run: {err})", aside=True)
        if missing:
            return self._restart(f"checkpoint {path} names per-client files that are gone ({', '.join(missing[:3])})",
                                 aside=True)
        load_method_state(self.method, payload["method"])
        self.ctx.data.given.copy_(payload["given"].to(self.ctx.data.given.device))
        self.ctx.data.relabels.load_state_dict(payload["relabels"])
        self.ctx.load_rng_state(payload["rng"])
        self.progress(f"resumed from {path} at round {payload['next_round']} ({self.provenance.describe()})")
        return int(payload["next_round"]), list(payload["rows"])

    def _restart(self, why: str, aside: bool = False) -> None:
        """Start from round 0: the checkpoint is moved to ``<checkpoint>.corrupt`` (``aside``: one that does
        not load, kept for a look) or removed (a readable one of other code or settings), its per-client
        files go, and the log says why."""
        assert self.path is not None
        if aside:
            kept = _free_name(Path(str(self.path) + ".corrupt"))
            os.rename(self.path, kept)
            done = f"moved it to {kept}"
        else:
            os.remove(self.path)
            done = "removed it"
        for st in self.stores:
            st.reset()
        self.progress(f"{why}: {done}; restarting the run from round 0")

    def remove(self) -> None:
        """The run is complete: its checkpoint and per-client files go."""
        if self.path is not None and self.path.exists():
            os.remove(self.path)
        for st in self.stores:
            st.clear()


def estimated_size(obj: Any) -> int:
    """Bytes a checkpoint of ``obj`` takes on disk, about: its tensors and arrays, plus 5% and 1 MiB
    for the pickled structure (the rows, the random states' small parts)."""
    return int(_nbytes(obj) * 1.05) + (1 << 20)


def _nbytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    inner = getattr(obj, "t", None)  # persist's marker of a device tensor
    return _nbytes(inner) if isinstance(inner, torch.Tensor) else 64


def _free_name(path: Path) -> Path:
    """``path``, or ``path.1``, ``path.2``, ... the first that does not exist (a file moved aside earlier stays)."""
    n, out = 0, path
    while out.exists():
        n += 1
        out = Path(f"{path}.{n}")
    return out


def _check_payload(p: dict, ctx: RunContext, method) -> None:
    """Raise (TypeError, ValueError, KeyError) when a checkpoint's payload is not shaped as this run's,
    before any of it is loaded: a wrong one is moved aside instead of half-loaded."""
    for key, kind in (("next_round", int), ("method", dict), ("given", torch.Tensor), ("relabels", list),
                      ("rng", dict), ("rows", list)):
        if not isinstance(p.get(key), kind):
            raise TypeError(f"{key!r} is a {type(p.get(key)).__name__}, not a {kind.__name__}")
    given = ctx.data.given
    if p["given"].shape != given.shape or p["given"].dtype != given.dtype:
        raise ValueError(f"labels {tuple(p['given'].shape)} {p['given'].dtype}, "
                         f"the run's {tuple(given.shape)} {given.dtype}")
    if not 0 <= p["next_round"] <= method.num_rounds():
        raise ValueError(f"next round {p['next_round']} of 0..{method.num_rounds()}")
    if not all(isinstance(r, dict) for r in p["rows"]) or not all(isinstance(c, dict) for c in p["relabels"]):
        raise TypeError("rows or relabels are not records")
    saved = p["method"].get("globals")
    if not isinstance(saved, dict) or set(saved) != set(method.globals):
        raise ValueError(f"networks {sorted(map(str, saved or {}))}, the run's {sorted(method.globals)}")
    for name, net in method.globals.items():
        want = net.state_dict()
        st = saved[name]
        if not isinstance(st, dict) or set(st) != set(want) or any(
                not isinstance(st[k], torch.Tensor) or st[k].shape != v.shape for k, v in want.items()):
            raise ValueError(f"network {name!r} does not have the run's parameters")
