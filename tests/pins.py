"""Slug pins and registry lists: recorded by one command, compared by the tests, never edited by hand.

Artifact paths and caches hang on slugs (results/partitions/<dataset>/<partition slug>/...,
results/noise/.../<noise slug>/..., the runs' method slugs): a slug that changes orphans every
result made before. ``tests/pins/slugs.json`` holds, for every built-in method, noise model and
partitioner, config entries with the slug each must keep (at least one per entry), and the
name list of each registry. tests/test_registry_contract.py rebuilds every pinned entry and
compares its slug; tests/test_noise_specs.py and tests/test_partition_specs.py compare the
registries with the recorded lists, so a new built-in entry (or a removed one) fails until it
is recorded.

Record (after adding or removing a built-in entry):

    .venv/bin/python -m tests.pins

An entry that is already pinned keeps its pins: the command checks them and refuses to write
when a pinned slug changed (a slug is never meant to change). A new entry gets pins generated
from its dataclass fields by the contract tests' generator (tests/test_contracts.py): its
defaults with each required field filled, then each field perturbed once, so that every
readable part and the hash are pinned. The pins of an entry no longer registered are dropped.
Only where a slug change is MEANT (say so in the commit, old artifacts are orphaned):

    .venv/bin/python -m tests.pins --rerecord fedprox   # re-pin these entries at today's slugs
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

PINS_FILE = Path(__file__).resolve().parent / "pins" / "slugs.json"
RECORD_COMMAND = ".venv/bin/python -m tests.pins"
KINDS = ("method", "noise", "partition")


def registries() -> dict[str, Any]:
    """kind -> the registry of that kind's specs (imported lazily: fnlcore loads torch)."""
    from fnlcore.methods import METHODS
    from fnlcore.noise import NOISE_MODELS
    from fnlcore.partition import PARTITIONERS

    return {"method": METHODS, "noise": NOISE_MODELS, "partition": PARTITIONERS}


def build(kind: str, entry: dict) -> Any:
    """The typed spec of a config entry of ``kind`` (the slug's owner)."""
    from fnlcore.methods import method_from_dict
    from fnlcore.noise import noise_spec_from_dict
    from fnlcore.partition import partition_spec_from_dict

    return {"method": method_from_dict, "noise": noise_spec_from_dict, "partition": partition_spec_from_dict}[kind](entry)


def load_pins() -> dict:
    """The recording: {"registries": {kind: [names]}, "pins": {kind: {name: [{"entry", "slug"}]}}}."""
    if not PINS_FILE.exists():
        return {"registries": {k: [] for k in KINDS}, "pins": {k: {} for k in KINDS}}
    with open(PINS_FILE) as fh:
        return json.load(fh)


def pin_cases(pins: dict | None = None) -> list[tuple[str, dict, str]]:
    """(kind, entry, slug) of every recorded pin, in file order."""
    pins = load_pins() if pins is None else pins
    return [(kind, p["entry"], p["slug"]) for kind in KINDS for ps in pins["pins"][kind].values() for p in ps]


def missing_message(kind: str, names: set[str] | list[str], what: str = "not recorded") -> str:
    return (f"built-in {kind} entries {sorted(names)} {what} in {PINS_FILE.relative_to(PINS_FILE.parents[2])}: "
            f"record them with `{RECORD_COMMAND}` (a slug, once recorded, never changes)")


def _short_entry(spec) -> dict:
    """``spec.to_dict()`` without the fields at their defaults (the entry a config would write)."""
    fields = {f.name: f for f in dataclasses.fields(spec)}
    out = {}
    for k, v in spec.to_dict().items():
        f = fields.get(k)
        required = f is not None and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if f is None or required or v != f.default or type(v) is not type(f.default):
            out[k] = v
    return out


def generated_pins(kind: str, name: str) -> list[dict]:
    """Pins for an entry not yet pinned: its base spec and each field perturbed once."""
    from .test_contracts import _generated_specs

    cls = registries()[kind].spec_class(name)
    out, seen = [], set()
    for spec in _generated_specs(cls, per_field=1):
        entry = {k: round(v, 6) if type(v) is float else v for k, v in _short_entry(spec).items()}  # 0.65, not 0.6499999999999999
        key = json.dumps(entry, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append({"entry": entry, "slug": build(kind, entry).slug()})
    return out


def dumps(pins: dict) -> str:
    """The recording as JSON with one pin or one name list a line (a new pin is a one-line diff)."""
    line = lambda v: json.dumps(v, ensure_ascii=False)  # noqa: E731
    regs = ",\n".join(f"  {line(k)}: {line(v)}" for k, v in pins["registries"].items())
    kinds = []
    for kind, by_name in pins["pins"].items():
        names = ",\n".join(
            f"   {line(n)}: [\n" + ",\n".join(f"    {line(p)}" for p in ps) + "\n   ]" for n, ps in by_name.items()
        )
        kinds.append(f"  {line(kind)}: {{\n{names}\n  }}")
    text = '{\n "registries": {\n' + regs + '\n },\n "pins": {\n' + ",\n".join(kinds) + "\n }\n}\n"
    assert json.loads(text) == pins
    return text


def record(rerecord: list[str] | None = None) -> int:
    """Update the recording; 0 on success, 1 (nothing written) when a pinned slug changed."""
    rerecord = set(rerecord or ())
    old = load_pins()
    regs = registries()
    new: dict = {"registries": {}, "pins": {}}
    changed = []
    for kind in KINDS:
        names = sorted(regs[kind].builtin())
        new["registries"][kind] = names
        pins = old["pins"].get(kind, {})
        for gone in sorted(set(pins) - set(names)):
            print(f"{kind} {gone!r} is no longer registered: its pins are dropped", file=sys.stderr)
        new["pins"][kind] = {}
        for name in names:
            if name in pins and name not in rerecord:
                for p in pins[name]:
                    slug = build(kind, p["entry"]).slug()
                    if slug != p["slug"]:
                        changed.append(f"{kind} {p['entry']}: pinned {p['slug']!r}, now {slug!r}")
                new["pins"][kind][name] = pins[name]
            elif name in pins:  # re-pinned on purpose: the same entries, today's slugs
                new["pins"][kind][name] = [{"entry": p["entry"], "slug": build(kind, p["entry"]).slug()}
                                           for p in pins[name]]
                print(f"re-pinned {kind} {name!r}", file=sys.stderr)
            else:
                new["pins"][kind][name] = generated_pins(kind, name)
                print(f"pinned new {kind} {name!r}: {[p['slug'] for p in new['pins'][kind][name]]}", file=sys.stderr)
    unknown = rerecord - {n for kind in KINDS for n in new["pins"][kind]}
    if unknown:
        print(f"--rerecord: no built-in entry named {sorted(unknown)}", file=sys.stderr)
        return 1
    if changed:
        print("pinned slugs changed (nothing written); slugs name artifacts and must not change:\n  "
              + "\n  ".join(changed) + "\nfix the code, or re-pin on purpose with "
              f"`{RECORD_COMMAND} --rerecord NAME` and say so in the commit", file=sys.stderr)
        return 1
    PINS_FILE.parent.mkdir(parents=True, exist_ok=True)
    PINS_FILE.write_text(dumps(new))
    print(f"wrote {PINS_FILE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--rerecord"]:
        sys.exit(record(args[1:]))
    if args:
        sys.exit(f"usage: {RECORD_COMMAND} [--rerecord NAME ...]")
    sys.exit(record())
