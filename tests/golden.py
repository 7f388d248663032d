"""The golden set: what every registered method does on fixed data, recorded once and compared forever.

A refactor of the engine or of a method must not change a single decision or number. For
every method (on its first label kind, and on multi-label data too when it trains on both),
a short run on the digits context of the contract tests is reduced to its observable
outputs: per-round metrics (every column but the wall time, floats exact as hex), the
relabel log, the per-client results, the working labels and the final evaluated model
(SHA-256 of its tensors). ``tests/golden/methods.json`` holds the record;
tests/test_golden.py compares a fresh run against it, field by field.

Record (only when a change is MEANT to alter results, and say so in the commit):

    .venv/bin/python -m tests.golden            # every method
    .venv/bin/python -m tests.golden fedgr      # some methods; the others keep their record

Records are made and compared under portable numerics (tests/portable.py): one code path in
every float library and one thread, so that the bits do not depend on the machine's CPU or
core count. ``python -m tests.golden`` re-executes itself under them; tests/test_golden.py runs
its cases in a child process started with them.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

if __name__ == "__main__":  # the variables must be set before torch and numpy load
    from tests.portable import reexec_portable

    reexec_portable("tests.golden")

import numpy as np
import pandas as pd
import torch

GOLDEN_FILE = Path(__file__).resolve().parent / "golden" / "methods.json"
# Columns of a round's row that say how it ran, not what it computed (fnlcore.fl.simulation)
EXECUTION_COLUMNS = ("seconds", "engine", "clients_at_once")


# Two settings: the contract tests' (Adam, every client, 4 rounds) and a longer one that takes
# the SGD path with momentum, samples 3 of 4 clients a round and trains 2 local epochs, so that
# relabelling, detection and sampling stages are entered more often.
VARIANTS = ("short", "long")


def _settings(variant: str):
    import dataclasses

    from .test_contracts import SETTINGS

    if variant == "short":
        return SETTINGS
    return dataclasses.replace(
        SETTINGS, rounds=8, local_epochs=2, optimizer="sgd", lr=0.05, momentum=0.9, client_fraction=0.75,
    )


def golden_cases() -> list[tuple[str, bool, str]]:
    """(method name, multi-label, variant) of every run in the golden set."""
    from fnlcore.methods import METHODS

    out = []
    for variant in VARIANTS:
        for n in sorted(METHODS):
            kinds = METHODS[n].label_kinds
            out.append((n, "single" not in kinds, variant))
            if set(kinds) == {"single", "multi"}:
                out.append((n, True, variant))
    return out


def case_id(name: str, multi: bool, variant: str = "short") -> str:
    return name + ("-multi" if multi else "") + ("" if variant == "short" else f"-{variant}")


def _value(v):
    """A JSON value that keeps a float exactly (hex) and says NaN/inf plainly."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return "nan" if math.isnan(f) else f.hex()
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, (list, tuple, np.ndarray)):
        return [_value(x) for x in v]
    return repr(v)


def _frame(df: pd.DataFrame | None) -> dict | None:
    if df is None:
        return None
    df = df.reset_index(drop=True)
    return {"columns": [str(c) for c in df.columns], "rows": [[_value(v) for v in row] for row in df.itertuples(index=False)]}


def tensor_digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k, v in tensors.items():
        t = v.detach().cpu().contiguous()
        h.update(k.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def run_case(name: str, multi: bool, variant: str = "short", engine: str = "sequential") -> dict:
    """The observable outputs of one short run of method ``name``."""
    import dataclasses

    from fnlcore.errors import ConfigError
    from fnlcore.fl.simulation import Simulation
    from fnlcore.methods import METHODS

    from .engine_helpers import make_ctx
    from .test_contracts import _fitting_params

    settings = dataclasses.replace(_settings(variant), engine=engine)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ctx = make_ctx(settings, seed=0, multi_label=multi)
        params = _fitting_params(name)
        try:
            params.check_training(settings)
            method = METHODS[name](params, ctx)
        except ConfigError:  # e.g. trimmed mean cannot keep a client of 3: every client a round
            settings = dataclasses.replace(settings, client_fraction=1.0)
            ctx = make_ctx(settings, seed=0, multi_label=multi)
            params.check_training(settings)
            method = METHODS[name](params, ctx)
        metrics = Simulation(method, ctx, progress=lambda s: None).run()
    finally:
        torch.set_num_threads(threads)
    metrics = metrics.drop(columns=list(EXECUTION_COLUMNS))
    return {
        "metrics": _frame(metrics),
        "relabels": _frame(ctx.data.relabels.frame()),
        "clients": _frame(method.client_results()),
        "given": tensor_digest({"given": ctx.data.given}),
        "model": tensor_digest(method.eval_model().state_dict()),
    }


def first_difference(want, got, where=""):
    """The first field where two records differ, as "path: recorded X, now Y" (None when equal)."""
    if type(want) is not type(got):
        return f"{where}: {want!r} vs {got!r}"
    if isinstance(want, dict):
        if list(want) != list(got):
            return f"{where}: keys {list(want)} vs {list(got)}"
        for k in want:
            d = first_difference(want[k], got[k], f"{where}.{k}")
            if d:
                return d
        return None
    if isinstance(want, list):
        if len(want) != len(got):
            return f"{where}: {len(want)} vs {len(got)} entries"
        for i, (a, b) in enumerate(zip(want, got)):
            d = first_difference(a, b, f"{where}[{i}]")
            if d:
                return d
        return None
    return None if want == got else f"{where}: recorded {want!r}, now {got!r}"


def load_golden() -> dict:
    with open(GOLDEN_FILE) as fh:
        return json.load(fh)


def record(names: list[str] | None = None) -> None:
    from .portable import is_portable
    from .vml_guard import VMLGuard

    if not is_portable():
        raise RuntimeError("record under portable numerics: run `python -m tests.golden`")
    golden = load_golden() if GOLDEN_FILE.exists() else {}
    for name, multi, variant in golden_cases():
        if names and name not in names:
            continue
        cid = case_id(name, multi, variant)
        print(f"recording {cid}", file=sys.stderr, flush=True)
        with VMLGuard():  # a record must not hang on MKL's vector math (tests/vml_guard.py)
            golden[cid] = run_case(name, multi, variant)
    GOLDEN_FILE.parent.mkdir(parents=True, exist_ok=True)
    with open(GOLDEN_FILE, "w") as fh:
        json.dump(dict(sorted(golden.items())), fh, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    record(sys.argv[1:] or None)
