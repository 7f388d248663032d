"""One registry mechanism: discovery of a package's modules and of FNL_PLUGINS, one name per
entry, errors that name the key, declarative checks and round-valued fields."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from fnlcore.datasets import DATASETS, load_prepared, prepare_dataset
from fnlcore.errors import ConfigError
from fnlcore.methods import METHODS, method_from_dict
from fnlcore.models import MODELS, build_model
from fnlcore.noise import NOISE_MODELS, noise_spec_from_dict
from fnlcore.partition import PARTITIONERS, partition_spec_from_dict
from fnlcore.registry import Registry, Spec, check_params, param, round_fields

from .pins import PINS_FILE, RECORD_COMMAND, dumps, load_pins, missing_message, pin_cases


def test_test_only_plugins_join_every_registry_with_no_other_edit():
    assert "test_smooth" in METHODS and "test_half_symmetric" in NOISE_MODELS
    assert "test_blocks" in PARTITIONERS and "test_blobs" in DATASETS
    assert round_fields(METHODS["test_smooth"].Params) == ("start_round",)


def test_the_test_only_dataset_prepares_and_loads(tmp_path):
    prepare_dataset("test_blobs", raw_dir=str(tmp_path / "raw"), out_dir=str(tmp_path / "out"))
    ds = load_prepared(str(tmp_path / "out"))
    assert ds.images("train").shape[0] == 40 and ds.labels("test").tolist()[:3] == [1, 2, 0]


def test_discovery_imports_a_module_dropped_into_the_package(tmp_path, monkeypatch):
    pkg = tmp_path / "myplugins"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from fnlcore.registry import Registry\nREG = Registry('widget', 'myplugins')\n"
    )
    (pkg / "round_widget.py").write_text(
        "from . import REG\n\nclass Round:\n    name = 'round'\n\nREG.register(Round)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import myplugins

    assert "round" not in myplugins.REG._entries  # nothing imported the module yet
    assert sorted(myplugins.REG) == ["round"]  # the first read discovers it


def test_fnl_plugins_names_modules_outside_the_package(tmp_path):
    (tmp_path / "my_method.py").write_text(
        "from dataclasses import dataclass\n"
        "from fnlcore.methods import METHODS, FLMethod, MethodParams\n"
        "@dataclass(frozen=True)\nclass P(MethodParams):\n    name = 'my_method'\n"
        "@METHODS.register\nclass M(FLMethod):\n    Params = P\n"
    )
    code = "from fnlcore.methods import METHODS; print('my_method' in METHODS)"
    env = {"FNL_PLUGINS": "my_method", "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr[-2000:]
    env["FNL_PLUGINS"] = "no_such_module"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "FNL_PLUGINS" in out.stderr and "no_such_module" in out.stderr


def test_a_name_registered_twice_is_refused():
    reg: Registry = Registry("widget", None)

    class A:
        name = "a"

    class B:
        name = "a"

    reg.register(A)
    reg.register(A)  # the same entry again (a module reloaded) is fine
    with pytest.raises(ValueError, match="registered twice") as e:
        reg.register(B)
    assert ".A and by " in str(e.value) and str(e.value).endswith(".B; give one of them another name")
    with pytest.raises(ConfigError, match=r"unknown widget name 'b'; valid names: a"):
        reg.lookup("b")


def test_two_models_of_one_name_are_refused_naming_both_build_functions():
    from fnlcore.models.builder import ModelEntry

    def build_a(num_classes, in_channels, image_size):
        raise AssertionError("not built")

    def build_b(num_classes, in_channels, image_size):
        raise AssertionError("not built")

    reg: Registry = Registry("model", None)
    first = reg.register(ModelEntry("net", build_a))
    assert reg.register(ModelEntry("net", build_a)) is not first  # the same build again (a module reloaded)
    with pytest.raises(ValueError, match="model name 'net' is registered twice") as e:
        reg.register(ModelEntry("net", build_b))
    assert "build_a and by " in str(e.value) and "build_b; give one of them another name" in str(e.value)


def test_defining_a_spec_subclass_registers_nothing_its_registry_s_register_does():
    from fnlcore.noise.specs import NoiseSpec

    @dataclass(frozen=True)
    class Unregistered(NoiseSpec):
        name = "test_unregistered_noise"

    assert "test_unregistered_noise" not in NOISE_MODELS  # one way to register: NOISE_MODELS.register
    reg: Registry = Registry("noise model", None)
    assert reg.register(Unregistered) is Unregistered and reg["test_unregistered_noise"] is Unregistered


def test_an_unknown_name_defined_but_never_registered_is_named_with_the_fix(tmp_path, monkeypatch):
    (tmp_path / "forgot_register.py").write_text(
        "from dataclasses import dataclass\n"
        "from fnlcore.methods import FLMethod, MethodParams\n"
        "from fnlcore.noise.specs import NoiseSpec\n"
        "@dataclass(frozen=True)\nclass P(MethodParams):\n    name = 'forgot_method'\n"
        "class Forgot(FLMethod):\n    Params = P\n"
        "@dataclass(frozen=True)\nclass ForgotNoise(NoiseSpec):\n    name = 'forgot_noise'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("FNL_PLUGINS", "forgot_register")
    monkeypatch.delitem(sys.modules, "forgot_register", raising=False)
    __import__("forgot_register")
    with pytest.raises(ConfigError) as e:
        method_from_dict({"name": "forgot_method"})
    assert str(e.value).startswith("unknown method name 'forgot_method'; valid names:")
    assert "forgot_register.Forgot is named 'forgot_method' but was never registered" in str(e.value)
    assert "as fnlcore.methods." in str(e.value)  # a registered entry to copy
    with pytest.raises(ConfigError, match="forgot_register.ForgotNoise is named 'forgot_noise' but was never registered"):
        NOISE_MODELS.lookup("forgot_noise")
    with pytest.raises(ConfigError) as e:  # a name nothing defines: no such note
        NOISE_MODELS.lookup("forgot_nothing")
    assert "never registered" not in str(e.value)
    monkeypatch.delenv("FNL_PLUGINS")  # a module that is no plug-in and outside the package is not searched
    with pytest.raises(ConfigError) as e:
        NOISE_MODELS.lookup("forgot_noise")
    assert "never registered" not in str(e.value)


@pytest.mark.parametrize(
    "build, entry, words",
    [
        (method_from_dict, {"name": "fedprx"}, ["unknown method name 'fedprx'", "fedprox"]),
        (method_from_dict, {"name": "fedprox", "nu": 1}, ["unknown key(s) ['nu']", "mu"]),
        (method_from_dict, {"name": "fedprox", "mu": -1}, ["method 'fedprox': mu=-1 must be >= 0"]),
        (method_from_dict, {"name": "fedprox", "form": "sq"}, ["method 'fedprox': form='sq' must be one of ['squared_half', 'fedcorr_unsquared']"]),
        (partition_spec_from_dict, {"name": "bernoulli_dirichlet"}, ["missing required key(s) ['num_clients']"]),
        (noise_spec_from_dict, {"name": "sym"}, ["unknown noise model name 'sym'", "symmetric"]),
    ],
)
def test_errors_name_the_key_and_the_valid_choices(build, entry, words):
    with pytest.raises(ConfigError) as e:
        build(entry)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_declarative_checks_name_the_key_and_coerce_to_the_declared_type():
    @dataclass(frozen=True)
    class S:
        a: float = param(0.5, ge=0, lt=1)
        b: str = param("x", choices=("x", "y"))
        c: int = param(3, gt=2, rounds=True)
        d: int | None = param(None, ge=0)
        e: bool = True

    check_params(S(), "spec 's'")
    for bad, msg in (
        ({"a": 1}, "a=1 must be in [0, 1)"),
        ({"b": "z"}, "b='z' must be one of ['x', 'y']"),
        ({"c": 2}, "c=2 must be > 2"),
        ({"a": "1"}, "a='1' must be a number"),
        ({"a": float("nan")}, "a=nan must be a finite number"),
        ({"c": 3.0}, "c=3.0 must be an integer"),
        ({"c": True}, "c=True must be an integer"),
        ({"d": -1}, "d=-1 must be >= 0"),
        ({"e": "yes"}, "e='yes' must be true or false"),
    ):
        with pytest.raises(ConfigError) as err:
            check_params(S(**bad), "spec 's'")
        assert str(err.value) == "spec 's': " + msg
    s = S(a=0, c=np.int64(4), e=np.bool_(False))
    check_params(s, "spec 's'")
    assert (type(s.a), type(s.c), type(s.e)) == (float, int, bool)  # one value, one slug
    assert round_fields(S) == ("c",)
    assert dataclasses.fields(S)[0].metadata["ge"] == 0


def test_one_slug_scheme_for_every_kind():
    @dataclass(frozen=True)
    class W(Spec):
        kind = "widget"
        name = "w"
        slug_fields = ("alpha_beta", ("k", "K"), ("mode", {"fast": "fast"}), ("sub", lambda s: f"sub{s.sub or 'all'}"))
        k: int = param(ge=1)
        alpha_beta: float = param(0.5, ge=0)
        mode: str = param("slow", choices=("slow", "fast"))
        sub: int | None = None
        extra: int = 0
        retries: int = param(3, slug=False)

    assert W(k=2).slug() == "w-alphabeta0.5-K2-suball"
    assert W(alpha_beta=1, k=2, mode="fast", sub=5).slug() == "w-alphabeta1.0-K2-fast-sub5"
    assert W(k=2, retries=9).slug() == W(k=2).slug()  # a slug=False field never changes it
    hashed = W(k=2, extra=1).slug()
    assert hashed.startswith("w-alphabeta0.5-K2-suball-h") and len(hashed.rsplit("-", 1)[1]) == 7
    assert W(k=2, extra=2).slug() != hashed
    with pytest.raises(ConfigError, match=r"^widget 'w': k=0 must be >= 1$"):
        W(k=0)
    assert W(k=2).to_dict() == {"name": "w", "k": 2, "alpha_beta": 0.5, "mode": "slow", "sub": None, "extra": 0,
                                "retries": 3}


def test_fednoro_marks_its_round_valued_fields():
    assert set(round_fields(METHODS["fednoro"].Params)) == {"warmup_rounds", "ramp_begin", "ramp_end"}


def test_models_are_a_registry_and_only_some_have_pretrained_weights():
    assert {"mlp", "lenet5", "resnet18"} <= set(MODELS)
    with pytest.raises(ConfigError, match="only resnet18, resnet50 do"):
        build_model("mlp", 10, 1, (8, 8), pretrained=True)


# Artifact paths and caches hang on slugs: a change here orphans every result. The pins (every
# entry of config/ and tests/configs/ when the slug scheme was unified, plus every registered spec
# at defaults and with each readable part and the hash exercised) are recorded in
# tests/pins/slugs.json by `python -m tests.pins` (see tests/pins.py), never edited by hand.
PINS = load_pins()
SLUG_PINS = pin_cases(PINS)


@pytest.mark.parametrize("kind, entry, slug", SLUG_PINS, ids=[s for _, _, s in SLUG_PINS])
def test_slugs_are_pinned(kind, entry, slug):
    build = {"partition": partition_spec_from_dict, "noise": noise_spec_from_dict, "method": method_from_dict}
    spec = build[kind](entry)
    assert spec.slug() == slug
    assert build[kind](spec.to_dict()).slug() == slug  # the round trip keeps it


def test_slug_heads_are_distinct_within_each_registry():
    """Two entries of one kind with one slug head could share a slug, hence an artifact folder."""
    for reg in (PARTITIONERS, NOISE_MODELS):
        heads: dict[str, str] = {}
        for name, cls in reg.items():
            head = cls.slug_head or cls.name
            assert heads.setdefault(head, name) == name, f"{reg.kind}s {heads[head]!r} and {name!r} share the slug head {head!r}"


def test_every_registered_spec_has_a_pinned_slug():
    for kind, reg in (("partition", PARTITIONERS), ("noise", NOISE_MODELS), ("method", METHODS)):
        pinned = {e["name"] for k, e, _ in SLUG_PINS if k == kind}
        assert set(reg.builtin()) <= pinned, missing_message(kind, set(reg.builtin()) - pinned, "have no pinned slug")
        assert set(reg.builtin()) == set(PINS["registries"][kind]), missing_message(
            kind, set(reg.builtin()) ^ set(PINS["registries"][kind]), "differ from the registry list"
        )


def test_the_recorded_pins_are_what_the_recording_command_writes():
    """Hand edits show: the file is exactly what `python -m tests.pins` writes for its content."""
    assert PINS_FILE.read_text() == dumps(PINS), f"{PINS_FILE.name} was edited by hand; record with `{RECORD_COMMAND}`"
    assert all(p["entry"]["name"] == name for kind in PINS["pins"] for name, ps in PINS["pins"][kind].items()
               for p in ps)


@pytest.mark.parametrize(
    "entry, slug",
    [
        ({"rho": 0.4, "eta_l": 0.3, "eta_u": 0.5}, "ann-auto-e5-lr0.0003-bs16-s0"),
        ({"rho": 0.6, "eta_l": 0.5, "eta_u": 0.7, "annotator_model": "tiny", "annotator_epochs": 2},
         "ann-tiny-e2-lr0.0003-bs16-s0"),
        ({"rho": 0.6, "eta_l": 0.5, "eta_u": 0.7, "annotator_lr": 0.001, "annotator_weight_decay": 0,
          "annotator_batch_size": 8, "annotator_seed": 3}, "ann-auto-e5-lr0.001-bs8-s3-wd0.0"),
    ],
)
def test_annotator_slugs_are_pinned(entry, slug):
    assert noise_spec_from_dict({"name": "fednoro_hidn", **entry}).annotator_slug() == slug


def test_prepared_labels_are_writable_so_torch_does_not_warn(tmp_path):
    import warnings

    import torch

    prepare_dataset("test_blobs", raw_dir=str(tmp_path / "raw"), out_dir=str(tmp_path / "out"))
    ds = load_prepared(str(tmp_path / "out"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for split in ("train", "test"):
            assert ds.labels(split).flags.writeable
            torch.as_tensor(ds.labels(split))
            torch.as_tensor(ds.images(split))


def test_the_readme_one_file_examples_register_and_run(tmp_path):
    """The examples of docs/extending.md, each saved as its own module and named in FNL_PLUGINS, just work.

    They load beside the test-only plug-ins (tests/support/plugins.py) and the built-ins: the docs'
    are named ``my_*``, the test plug-ins ``test_*``, so no name or slug head can be taken twice.
    """
    import re

    section = (Path(__file__).resolve().parents[1] / "docs" / "extending.md").read_text()
    names = re.findall(r"\*\*A [a-z ]+\*\* — `fnlcore/\w+/(\w+)\.py`:\s*```python\n(.*?)```", section, re.S)
    assert [n for n, _ in names] == ["my_smooth", "my_halfsym", "my_blocks", "my_blobs"]
    # a FedAvg variant with another loss: one file of at most 40 lines, one loss form for both engines
    assert len(names[0][1].splitlines()) <= 40 and "batched" not in names[0][1]
    for mod, code in names:
        (tmp_path / f"readme_{mod}.py").write_text(code)
    check = (
        "import numpy as np\n"
        "from fnlcore.datasets import DATASETS, load_prepared, prepare_dataset\n"
        "from fnlcore.errors import ConfigError\n"
        "from fnlcore.methods import METHODS, method_from_dict\n"
        "from fnlcore.noise import noise_spec_from_dict\n"
        "from fnlcore.partition import partition_spec_from_dict\n"
        "from fnlcore.registry import round_fields\n"
        "assert method_from_dict({'name': 'my_smooth'}).slug() == 'my_smooth-smoothing0.1'\n"
        "assert round_fields(METHODS['my_smooth'].Params) == ('start_round',)\n"
        "try:\n    method_from_dict({'name': 'my_smooth', 'smoothing': 1.5})\n"
        "except ConfigError as e:\n    assert str(e) == \"method 'my_smooth': smoothing=1.5 must be in [0, 1)\", e\n"
        "else:\n    raise AssertionError('no error')\n"
        "noise = noise_spec_from_dict({'name': 'my_halfsym', 'rate': 0.4})\n"
        "part = partition_spec_from_dict({'name': 'my_blocks', 'num_clients': 10})\n"
        "assert (noise.slug(), part.slug()) == ('my_halfsym-r0.4', 'my_blocks-K10')\n"
        "y = np.arange(100) % 4\n"
        "a = part.run(y, 0)\n"
        "assert a.num_clients == 10 and 0 < noise.run(y, a, 4, 0).is_noisy.mean() <= 0.2\n"
        "prepare_dataset('my_blobs', raw_dir=r'TMP/raw', out_dir=r'TMP/out')\n"
        "from fnlcore.noise import NOISE_MODELS\n"
        "from fnlcore.partition import PARTITIONERS\n"
        "assert 'test_half_symmetric' in NOISE_MODELS and 'test_blocks' in PARTITIONERS  # loaded side by side\n"
        "for reg in (METHODS, NOISE_MODELS, PARTITIONERS, DATASETS):\n"
        "    readme = {n for n in reg if n.startswith('my_')}\n"
        "    assert len(readme) == 1 and not readme & set(reg.builtin()), sorted(reg)\n"
        "    assert not {n for n in reg if n.startswith('test_')} & readme\n"
        "assert load_prepared(r'TMP/out').labels('train').shape == (40,)\n"
        "print('ok')\n"
    ).replace("TMP", str(tmp_path))
    env = {**os.environ, "FNL_PLUGINS": ",".join(["tests.support.plugins"] + [f"readme_{n}" for n, _ in names]),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    out = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "ok", out.stderr[-3000:]
