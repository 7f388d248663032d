"""One typed-spec base for every parameterised plug-in: methods, partitioners, noise models.

A spec is a frozen dataclass; a config entry ``{"name": ..., **params}`` becomes one
(:func:`fnlcore.registry.spec_from_dict`). Its fields say what they accept with
:func:`param` — bounds, choices, a doc line, whether the value counts rounds — and
:class:`Spec` checks them on construction from the field's type and that metadata, with
one error form that names the key: ``method 'fedprox': mu=-1 must be >= 0``. Checks that
tie several fields together go in :meth:`Spec.validate`.

One slug scheme: :meth:`Spec.slug` is a pure function of the parameters. It is the slug
head (the name unless ``slug_head`` says otherwise), then the parts named by
``slug_fields``, then ``h<6 hex>`` (a hash of every other field that differs from its
default) so that different settings never share a slug. A ``slug_fields`` item is

* ``"mu"``               -> ``mu0.01`` (the field name without underscores, then the value);
* ``("alpha", "a")``     -> ``a2.0`` (a label; ``""`` shows the bare value);
* ``("order", {"draw": "draworder"})`` -> a token for some values, nothing for the others;
* ``("subsample", fn)``  -> ``fn(spec)``, a string or None.

A part that shows nothing (a None value, a value without a token) leaves its field to the
hash, which skips defaults; ``param(..., slug=False)`` keeps a field out of the slug entirely
(it must not change any result, e.g. a retry limit). Floats are written canonically
(:func:`fnlcore.slugs.fmt_float`), so 0.90 and 0.9 share a slug.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .errors import ConfigError
from .slugs import fmt_float, short_hash

_BOUNDS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))


def param(default: Any = dataclasses.MISSING, *, ge=None, gt=None, le=None, lt=None, choices=None,
          doc: str = "", switch: str = "", rounds: bool = False, passes: bool = False, slug: bool = True) -> Any:
    """A spec field with declarative checks (bounds, choices), a doc line and flags.

    ``switch``: the field selects between the official code's behaviour (its default) and the
    paper text's, or between other published variants; the text says what each value does. It
    joins the spec's ``switches`` (the code≠paper column of the docs/ tables and docs/switches.md), next to the field it describes.

    No default makes the key required. ``rounds=True``: the value counts communication
    rounds (a warm-up, a ramp, a stage boundary), so a scale rescales it with
    ``training.rounds`` (metadata ``{"rounds": True}``). ``passes=True``: the value counts passes
    over every client before ``training.rounds`` (FedCorr's pre-processing iterations), which a
    rehearsal shortens (metadata ``{"passes": True}``). ``slug=False``: the field never
    changes the numbers and stays out of the slug.
    """
    meta = {"doc": doc, "switch": switch, "ge": ge, "gt": gt, "le": le, "lt": lt, "choices": tuple(choices) if choices else None}
    if rounds:
        meta["rounds"] = True
    if passes:
        meta["passes"] = True
    if not slug:
        meta["slug"] = False
    return dataclasses.field(default=default, metadata={k: v for k, v in meta.items() if v not in (None, "")})


class _Switches:
    """``SpecClass.switches``: field -> its ``param(switch=...)`` text, in field order, then the class's
    ``switch_notes`` (code≠paper differences that no field selects, e.g. a variant not offered)."""

    def __get__(self, obj: Any, owner: type) -> dict[str, str]:
        found = {f.name: f.metadata["switch"] for f in dataclasses.fields(owner) if "switch" in f.metadata}
        return {**found, **owner.switch_notes}


def _flagged(cls: type, flag: str) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get(flag) is True)


def round_fields(cls: type) -> tuple[str, ...]:
    """Fields of a spec class that count rounds (``param(..., rounds=True)``)."""
    return _flagged(cls, "rounds")


def pass_fields(cls: type) -> tuple[str, ...]:
    """Fields of a spec class that count passes over every client (``param(..., passes=True)``)."""
    return _flagged(cls, "passes")


# -- checks ---------------------------------------------------------------------------------


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _base_type(f: dataclasses.Field) -> tuple[str | None, bool]:
    """(``'int'|'float'|'bool'|'str'`` or None, None allowed) from the field's annotation."""
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", None) or str(f.type)
    names = {p.strip() for p in t.split("|")}
    optional = "None" in names
    names.discard("None")
    base = names.pop() if len(names) == 1 else None
    return (base if base in ("int", "float", "bool", "str") else None), optional


def _coerce(where: str, key: str, v: Any, base: str | None) -> Any:
    """``v`` as the field's declared type (numpy scalars and ints-for-floats accepted)."""
    bad = f"{where}: {key}={v!r} must be "
    if base == "float":
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise ConfigError(bad + "a number")
        if not math.isfinite(v):
            raise ConfigError(bad + "a finite number")
        return float(v)
    if base == "int":
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise ConfigError(bad + "an integer")
        return int(v)
    if base == "bool":
        if not isinstance(v, (bool, np.bool_)):
            raise ConfigError(bad + "true or false")
        return bool(v)
    if base == "str" and not isinstance(v, str):
        raise ConfigError(bad + "a string")
    return v


def _check_bounds(where: str, key: str, v: Any, m: dict, raw: Any) -> None:
    given = [(op, m[op]) for op, _ in _BOUNDS if op in m]
    if not given:
        return
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise ConfigError(f"{where}: {key}={v!r} must be a number")
    ok = {"ge": v >= m.get("ge", 0), "gt": v > m.get("gt", 0), "le": v <= m.get("le", 0), "lt": v < m.get("lt", 0)}
    if all(ok[op] for op, _ in given):
        return
    lo = [(op, b) for op, b in given if op in ("ge", "gt")]
    hi = [(op, b) for op, b in given if op in ("le", "lt")]
    if lo and hi:
        (lop, lb), (hop, hb) = lo[0], hi[0]
        need = f"in {'[' if lop == 'ge' else '('}{_num(lb)}, {_num(hb)}{']' if hop == 'le' else ')'}"
    else:
        op, b = given[0]
        need = f"{dict(_BOUNDS)[op]} {_num(b)}"
    raise ConfigError(f"{where}: {key}={raw!r} must be {need}")


def check_params(spec: Any, where: str) -> None:
    """Check (and coerce to the declared type) every field of ``spec``: type, choices, bounds.

    A ``float`` field takes any finite number and stores a float; ``int`` refuses floats
    and bools; ``X | None`` also takes None. The error names the key and what is valid.
    """
    for f in dataclasses.fields(spec):
        v, m = getattr(spec, f.name), f.metadata
        base, optional = _base_type(f)
        if v is None and (optional or f.default is None):
            continue
        raw, v = v, _coerce(where, f.name, v, base)  # errors show the value as given
        if "choices" in m and v not in m["choices"]:
            raise ConfigError(f"{where}: {f.name}={raw!r} must be one of {list(m['choices'])}")
        _check_bounds(where, f.name, v, m, raw)
        if v is not raw:
            object.__setattr__(spec, f.name, v)


# -- the base class ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Spec:
    """Base of every spec: declared checks on construction, ``params``/``to_dict``, one slug scheme.

    ClassVars: ``kind`` (what errors call it: 'method', 'partition', 'noise model'),
    ``name`` (the config name), ``paper`` (where it comes from), ``switch_notes`` (code≠paper
    differences no field selects; a field's own switch is ``param(switch=...)``, and ``switches``
    lists both, for docs/), ``slug_head`` and ``slug_fields`` (see the module doc). Defining a
    subclass registers nothing: its kind's registry's ``register`` does (``@NOISE_MODELS.register``).
    """

    kind: ClassVar[str] = "spec"
    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    switch_notes: ClassVar[dict[str, str]] = {}
    switches = _Switches()  # read-only: computed from the fields and switch_notes
    slug_head: ClassVar[str] = ""
    slug_fields: ClassVar[tuple] = ()

    def __init_subclass__(cls, **kw) -> None:
        super().__init_subclass__(**kw)
        if "switches" in cls.__dict__:
            raise TypeError(f"{cls.__name__}: declare each switch on its field, param(..., switch=...), "
                            "and differences no field selects in switch_notes; not a switches dict")

    def __post_init__(self) -> None:
        check_params(self, self.where)
        self.validate()

    def validate(self) -> None:
        """Checks that tie several fields together (after the declared ones); raise :meth:`error`."""

    @property
    def where(self) -> str:
        return f"{self.kind} {self.name!r}"

    def error(self, key: str, problem: str) -> ConfigError:
        """``<kind> '<name>': <key>=<value> <problem>``, the one error form."""
        return ConfigError(f"{self.where}: {key}={getattr(self, key)!r} {problem}")

    def params(self) -> dict[str, Any]:
        """Field values as plain JSON-able Python (tuples become lists)."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def to_dict(self) -> dict[str, Any]:
        """The config entry that rebuilds this spec: ``{"name": ..., **params}``."""
        return {"name": self.name, **self.params()}

    def slug(self) -> str:
        """Readable, filesystem-safe, a pure function of the parameters (see the module doc)."""
        parts, shown = [self.slug_head or self.name], set()
        for item in self.slug_fields:
            key, how = (item, None) if isinstance(item, str) else item
            text = _slug_part(self, key, how)
            if text is not None:
                parts.append(text)
                shown.add(key)
        rest = {
            f.name: _plain(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if f.name not in shown and f.metadata.get("slug", True) and not _is_default(f, getattr(self, f.name))
        }
        if rest:
            parts.append(short_hash(rest))
        return "-".join(parts)


def _slug_part(spec: Spec, key: str, how: Any) -> str | None:
    v = getattr(spec, key)
    if callable(how):
        return how(spec)
    if isinstance(how, dict):
        try:
            return how.get(v)
        except TypeError:  # an unhashable value has no token
            return None
    if v is None:
        return None
    label = key.replace("_", "") if how is None else how
    return label + (fmt_float(v) if isinstance(v, float) else str(v))


def _is_default(f: dataclasses.Field, v: Any) -> bool:
    if f.default is not dataclasses.MISSING:
        return v == f.default
    if f.default_factory is not dataclasses.MISSING:
        return v == f.default_factory()
    return False  # a required field not shown readably goes into the hash


def _plain(v: Any) -> Any:
    return [_plain(x) for x in v] if isinstance(v, tuple) else v
