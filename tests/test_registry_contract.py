"""One registry mechanism: discovery of a package's modules and of FNL_PLUGINS, one name per
entry, errors that name the key, declarative checks and round-valued fields."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from fnlcore.datasets import DATASETS, load_prepared, prepare_dataset
from fnlcore.errors import ConfigError
from fnlcore.methods import METHODS, method_from_dict
from fnlcore.models import MODELS, build_model
from fnlcore.noise import NOISE_MODELS, noise_spec_from_dict
from fnlcore.partition import PARTITIONERS, partition_spec_from_dict
from fnlcore.registry import Registry, check_params, param, round_fields


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
        "from fnlcore.methods import FLMethod, MethodParams, register\n"
        "@dataclass(frozen=True)\nclass P(MethodParams):\n    name = 'my_method'\n"
        "@register\nclass M(FLMethod):\n    Params = P\n"
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
    with pytest.raises(ValueError, match="registered twice"):
        reg.register(B)
    with pytest.raises(ConfigError, match=r"unknown widget name 'b'; valid names: a"):
        reg.lookup("b")


@pytest.mark.parametrize(
    "build, entry, words",
    [
        (method_from_dict, {"name": "fedprx"}, ["unknown method name 'fedprx'", "fedprox"]),
        (method_from_dict, {"name": "fedprox", "nu": 1}, ["unknown key(s) ['nu']", "mu"]),
        (method_from_dict, {"name": "fedprox", "mu": -1}, ["method 'fedprox': mu=-1 must be >= 0"]),
        (method_from_dict, {"name": "fedprox", "form": "sq"}, ["form='sq' is not valid", "'squared_half'"]),
        (partition_spec_from_dict, {"name": "bernoulli_dirichlet"}, ["missing required key(s) ['num_clients']"]),
        (noise_spec_from_dict, {"name": "sym"}, ["unknown noise model name 'sym'", "symmetric"]),
    ],
)
def test_errors_name_the_key_and_the_valid_choices(build, entry, words):
    with pytest.raises(ConfigError) as e:
        build(entry)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_declarative_checks():
    @dataclass(frozen=True)
    class S:
        a: float = param(0.5, ge=0, lt=1)
        b: str = param("x", choices=("x", "y"))
        c: int = param(3, gt=2, rounds=True)
        d: int | None = param(None, ge=0)

    check_params(S(), "spec 's'")
    for bad, msg in (({"a": 1.0}, "a=1.0 must be < 1"), ({"b": "z"}, "b='z' is not valid; valid: 'x', 'y'"),
                     ({"c": 2}, "c=2 must be > 2"), ({"a": "1"}, "a='1' must be a number")):
        with pytest.raises(ConfigError, match="spec 's': " + msg.replace("(", r"\(").replace(")", r"\)")):
            check_params(S(**bad), "spec 's'")
    assert round_fields(S) == ("c",)
    assert dataclasses.fields(S)[0].metadata["ge"] == 0


def test_fednoro_marks_its_round_valued_fields():
    assert set(round_fields(METHODS["fednoro"].Params)) == {"warmup_rounds", "ramp_begin", "ramp_end"}


def test_models_are_a_registry_and_only_some_have_pretrained_weights():
    assert {"mlp", "lenet5", "resnet18"} <= set(MODELS)
    with pytest.raises(ConfigError, match="only resnet18, resnet50 do"):
        build_model("mlp", 10, 1, (8, 8), pretrained=True)


def test_slugs_of_the_papers_settings_are_pinned():
    # Artifact paths and caches hang on these: a change here orphans every result.
    pins = {
        ("partition", "bernoulli_dirichlet", (("num_clients", 20), ("p", 0.9), ("alpha", 2.0))): "bd-p0.9-a2.0-K20",
        ("noise", "fednoro_hidn", (("rho", 0.4), ("eta_l", 0.3), ("eta_u", 0.5))): "hidn-rho0.4-eta0.3-0.5",
        ("method", "fedprox", (("mu", 0.01),)): "fedprox-mu0.01",
        ("method", "fednoro", (("warmup_rounds", 10),)): "fednoro-warmuprounds10",
        ("method", "fedla", (("tau", 1.0),)): "fedla-tau1.0",
        ("method", "fedavg", ()): "fedavg",
        ("noise", "clean", ()): "clean",
    }
    build = {"partition": partition_spec_from_dict, "noise": noise_spec_from_dict, "method": method_from_dict}
    for (kind, name, params), slug in pins.items():
        assert build[kind]({"name": name, **dict(params)}).slug() == slug


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
