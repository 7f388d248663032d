"""One registry mechanism for every kind of plug-in: methods, noise models, partitioners,
datasets and models.

A :class:`Registry` maps a config name to an entry (a spec class, a DatasetInfo, a model
builder). Entries are registered where they are defined, in one way for every kind: the kind's
registry's own ``register`` (``@METHODS.register``, ``@NOISE_MODELS.register``,
``@PARTITIONERS.register`` on a class; ``DATASETS.register(DatasetInfo(...))``,
``MODELS.register(ModelEntry(...))``), and the registry *discovers* its package: the first time it
is read, it imports every module of that package, so a new plug-in is one new file and no
import line anywhere. Modules named in the environment variable ``FNL_PLUGINS``
(comma-separated importable names) are imported too, so research code outside the
package adds entries the same way.

A config entry ``{"name": ..., **params}`` becomes a typed spec through
:func:`spec_from_dict`, which names what is wrong: an unknown name (listing the valid
ones), an unknown key (listing the valid keys), a missing required key. Value checks
are declarative (:func:`param` metadata, checked by :class:`fnlcore.spec.Spec`) or live in
the spec's ``validate``; :mod:`fnlcore.spec` also makes every slug.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import pkgutil
import sys
from collections.abc import Mapping
from typing import Any, Callable, Generic, Iterator, TypeVar

from .errors import ConfigError
from .spec import Spec, check_params, param, pass_fields, round_fields  # noqa: F401  (the spec half of the contract)

T = TypeVar("T")
PLUGINS_ENV = "FNL_PLUGINS"


def plugin_modules() -> list[str]:
    """The module names in ``FNL_PLUGINS``."""
    return list(filter(None, (s.strip() for s in os.environ.get(PLUGINS_ENV, "").split(","))))


def import_plugins() -> None:
    """Import the modules named in ``FNL_PLUGINS`` (once each; Python caches modules)."""
    for name in plugin_modules():
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ConfigError(f"{PLUGINS_ENV}: cannot import plug-in module {name!r} ({e}); fix the name or PYTHONPATH") from None


class Registry(Mapping, Generic[T]):
    """name -> entry, filled by ``register`` and by discovering ``package``'s modules.

    It is a read-only Mapping (``REG[name]``, ``name in REG``, ``sorted(REG)``); reading it
    triggers discovery once. ``key(entry)`` gives an entry's name (default: ``entry.name``).
    """

    def __init__(self, kind: str, package: str | None, key: Callable[[Any], str] | None = None,
                 spec: Callable[[Any], type] | None = None):
        self.kind = kind
        self.package = package
        self._key = key or (lambda e: e.name)
        self._spec = spec or (lambda e: e)
        self._entries: dict[str, T] = {}
        self._discovered = package is None
        self._discovering = False

    # -- filling --------------------------------------------------------------------------
    def register(self, entry: T, name: str | None = None) -> T:
        """Add ``entry`` (usable as a decorator); a second, different entry of one name is an error.

        The same object re-registered by re-importing its module (importlib.reload) replaces it.
        """
        name = name or self._key(entry)
        if not name:
            raise ValueError(f"{self.kind} {entry!r} has no name")
        old = self._entries.get(name)
        if old is not None and old is not entry and _origin(old) != _origin(entry):
            raise ValueError(f"{self.kind} name {name!r} is registered twice, by {'.'.join(_origin(old))} and by "
                             f"{'.'.join(_origin(entry))}; give one of them another name")
        self._entries[name] = entry
        return entry

    def discover(self) -> "Registry[T]":
        """Import every module of the package (and FNL_PLUGINS), once."""
        if self._discovered or self._discovering:
            return self
        self._discovering = True
        try:
            pkg = sys.modules.get(self.package) or importlib.import_module(self.package)
            for info in pkgutil.iter_modules(pkg.__path__, self.package + "."):
                importlib.import_module(info.name)
            import_plugins()
            self._discovered = True
        finally:
            self._discovering = False
        return self

    # -- Mapping --------------------------------------------------------------------------
    def __getitem__(self, name: str) -> T:
        return self.discover()._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.discover()._entries)

    def __len__(self) -> int:
        return len(self.discover()._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {sorted(self._entries)})"

    def builtin(self) -> dict[str, T]:
        """The entries defined inside fnlcore (the docs/ reference tables leave FNL_PLUGINS out)."""
        return {n: e for n, e in self.items() if _origin(e)[0].startswith("fnlcore.")}

    def lookup(self, name: Any) -> T:
        """The entry ``name``; an unknown name is a ConfigError listing the valid ones (and naming a
        definition of that name that was never registered)."""
        if isinstance(name, str) and name in self:
            return self[name]
        raise ConfigError(f"unknown {self.kind} name {name!r}; valid names: {', '.join(sorted(self))}"
                          + self.unregistered_note(name))

    def unregistered_note(self, name: Any) -> str:
        """'' or a note naming the definitions of ``name`` in the kind's modules (or FNL_PLUGINS') that
        were never registered: a plug-in written without its registry's ``register`` would otherwise
        be only "unknown"."""
        if not isinstance(name, str) or not self._entries:
            return ""
        kinds = {type(e) for e in self._entries.values()}  # a class (type, ABCMeta) or an entry dataclass
        registered = {id(e) for e in self._entries.values()}
        plugins = set(plugin_modules())
        found = set()
        for mod_name, mod in list(sys.modules.items()):
            if mod is None or not (mod_name in plugins or self.package and mod_name.startswith(self.package + ".")):
                continue
            for obj in list(vars(mod).values()):
                if type(obj) not in kinds or id(obj) in registered:
                    continue
                try:
                    named = self._key(obj) == name
                except Exception:  # not an entry of this kind (no name where the key looks)
                    continue
                if named:
                    found.add(".".join(_origin(obj)))
        if not found:
            return ""
        examples = self.builtin() or self._entries  # one defined in fnlcore where there is one
        example = ".".join(_origin(examples[min(examples)]))
        return (f". {', '.join(sorted(found))} is named {name!r} but was never registered: register it where it "
                f"is defined with this kind's registry's register, as {example} is")

    # -- typed specs ----------------------------------------------------------------------
    def spec_class(self, name: str) -> type:
        """The spec dataclass of entry ``name`` (the entry itself, or e.g. a method's ``Params``)."""
        return self._spec(self.lookup(name))

    def specs(self) -> dict[str, type]:
        return {n: self._spec(e) for n, e in self.items()}

    def from_dict(self, d: Any) -> Any:
        """The typed spec of a config entry ``{"name": ..., **params}`` (errors name the key)."""
        return spec_from_dict(self.kind, self.specs(), d, unknown_note=self.unregistered_note)

    def markdown(self, header: tuple[str, str, str, str]) -> str:
        """The docs/ table of the built-in entries: name, parameters (defaults), source, switches."""
        rows = []
        for name in sorted(self.builtin()):
            entry, cls = self[name], self._spec(self[name])
            rows.append((name, cls, getattr(entry, "paper", "") or cls.paper, cls.switches))
        return markdown_table(header, rows)


def _origin(entry: Any) -> tuple[str, str]:
    """(module, qualified name) of what defines ``entry``: a class itself; a DatasetInfo its prepare
    function, a ModelEntry its build function (every instance of one dataclass has the same type)."""
    obj = entry if isinstance(entry, type) else getattr(entry, "prepare", None) or getattr(entry, "build", None) or entry
    return (getattr(obj, "__module__", "?"), getattr(obj, "__qualname__", repr(obj)))


# -- typed specs ------------------------------------------------------------------------------


def spec_from_dict(kind: str, registry: Mapping[str, type], d: Any,
                   unknown_note: Callable[[Any], str] = lambda name: "") -> Any:
    """Instantiate ``registry[d["name"]]`` with the other keys of ``d``; ``kind`` names it in errors, and
    ``unknown_note(name)`` is added to the error of an unknown name."""
    if not isinstance(d, Mapping):
        raise ConfigError(f"a {kind} must be a mapping with a 'name' key, got {type(d).__name__}")
    if "name" not in d:
        raise ConfigError(f"a {kind} needs a 'name' key; valid names: {sorted(registry)}")
    name = d["name"]
    cls = registry.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ConfigError(f"unknown {kind} name {name!r}; valid names: {sorted(registry)}{unknown_note(name)}")
    params = {k: v for k, v in d.items() if k != "name"}
    fields = dataclasses.fields(cls)
    valid = [f.name for f in fields]
    unknown = [k for k in params if k not in valid]
    if unknown:
        raise ConfigError(f"{kind} {name!r}: unknown key(s) {unknown}; valid keys: {valid or '(none)'}")
    missing = [
        f.name
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in params
    ]
    if missing:
        raise ConfigError(f"{kind} {name!r}: missing required key(s) {missing}")
    return cls(**params)


def param_text(f: dataclasses.Field) -> str:
    """`key=default` or `key` (required); ``(rounds)`` marks a round count that scales rescale,
    ``(passes)`` a count of passes over every client that a rehearsal cuts (fnlcore.spec.param)."""
    text = f"`{f.name}` (required)" if f.default is dataclasses.MISSING else f"`{f.name}={f.default!r}`"
    return text + "".join(f" ({flag})" for flag in ("rounds", "passes") if f.metadata.get(flag) is True)


def markdown_table(header: tuple[str, str, str, str], rows: list[tuple[str, type, str, Mapping[str, str]]]) -> str:
    """| name | parameters (defaults) | source | code≠paper switches | for (name, dataclass, source, switches) rows."""
    lines = ["| " + " | ".join(header) + " |", "|---|---|---|---|"]
    for name, cls, source, switches in rows:
        params = ", ".join(param_text(f) for f in dataclasses.fields(cls)) or "—"
        sw = "; ".join(f"`{k}`: {v}" for k, v in switches.items()) or "—"
        cells = (f"`{name}`", params, source, sw)
        lines.append("| " + " | ".join(c.replace("\n", " ").replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"
