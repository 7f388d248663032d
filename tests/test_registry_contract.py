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


# Artifact paths and caches hang on slugs: a change here orphans every result. Recorded from
# the code before the slug scheme was unified: every entry of config/ and tests/configs/,
# plus every registered spec at defaults and with each readable part and the hash exercised.
SLUG_PINS = [
    ('method', {'name': 'fedncl'}, 'fedncl-beta1.0-alpha0.6'),
    ('method', {'name': 'trimmed_mean'}, 'trimmed_mean-cleanfraction0.5'),
    ('method', {'name': 'coteaching', 'tau': 0.75}, 'coteaching-tau0.75'),
    ('method', {'name': 'dividemix'}, 'dividemix-warmuprounds50'),
    ('method', {'name': 'dividemix', 'warmup_rounds': 100}, 'dividemix-warmuprounds100'),
    ('method', {'name': 'rofl'}, 'rofl-tpl100'),
    ('method', {'name': 'rofl', 't_pl': 10}, 'rofl-tpl10'),
    ('method', {'name': 'rofl', 't_pl': 10, 'cen_grad': True, 'weighting': 'size', 'fg_init': 'round0_mean'}, 'rofl-tpl10-h47a085'),
    ('method', {'name': 'arfl'}, 'arfl'),
    ('method', {'name': 'arfl', 'huber_lambda': 1.5, 'delta': 0.2}, 'arfl-h1c565c'),
    ('method', {'name': 'jointopt'}, 'jointopt-warmuprounds50'),
    ('method', {'name': 'jointopt', 'warmup_rounds': 100, 'history': 15}, 'jointopt-warmuprounds100-hddc96c'),
    ('method', {'name': 'fedcorr'}, 'fedcorr-wu5-ft500'),
    ('method', {'name': 'fedcorr', 'logit_adjust': True}, 'fedcorr-wu5-ft500-la'),
    ('method', {'name': 'feddiv'}, 'feddiv-wu5'),
    ('method', {'name': 'feddiv', 'filter': 'local', 'reg_coef': 1.0}, 'feddiv-wu5-localfilter-reg'),
    ('method', {'name': 'rhfl'}, 'rhfl-betac0.5'),
    ('method', {'name': 'fedlsr', 't_w': 60}, 'fedlsr-tw60'),
    ('method', {'name': 'fednoro_detection', 'indicator': 'lid', 'gmm_seeds': 10000}, 'fednoro_detection-lid-h7d5cfe'),
    ('method', {'name': 'fednoro_detection', 'indicator': 'loss', 'logit_adjust': True, 'per_class': True, 'norm': True}, 'fednoro_detection-loss-la-perclass-norm'),
    ('partition', {'name': 'bernoulli_dirichlet', 'num_clients': 10, 'p': 0.9, 'alpha': 2.0}, 'bd-p0.9-a2.0-K10'),
    ('noise', {'name': 'clean'}, 'clean'),
    ('noise', {'name': 'fedcorr', 'rho': 0.4, 'tau': 0.5}, 'fedcorr-rho0.4-tau0.5'),
    ('noise', {'name': 'fednoro_hidn', 'rho': 0.6, 'eta_l': 0.5, 'eta_u': 0.7, 'annotator_epochs': 20}, 'hidn-rho0.6-eta0.5-0.7-h90b7c4'),
    ('partition', {'name': 'iid', 'num_clients': 10}, 'iid-K10'),
    ('partition', {'name': 'dirichlet_niidbench', 'num_clients': 10, 'alpha': 0.5, 'min_require_size': 10}, 'dir-a0.5-K10-min10'),
    ('noise', {'name': 'fedgr', 'phi': 0.6, 'rho_min': 0.2, 'rho_max': 0.4, 'noise_type': 'mixed'}, 'fedgr-mixed-phi0.6-r0.2-0.4-auto'),
    ('method', {'name': 'fedavg'}, 'fedavg'),
    ('method', {'name': 'fedmlp'}, 'fedmlp-warmuprounds50'),
    ('method', {'name': 'fedavg_pl'}, 'fedavg_pl'),
    ('method', {'name': 'fedfixmatch'}, 'fedfixmatch'),
    ('method', {'name': 'fedfixmatch', 'unsup_pos_weight': 'client_index'}, 'fedfixmatch-hf441f5'),
    ('method', {'name': 'fedmlp', 'st': False}, 'fedmlp-warmuprounds50-h27ad89'),
    ('method', {'name': 'fedmlp', 'wpc': False, 'cr': 'none', 'st': False}, 'fedmlp-warmuprounds50-h7b0db0'),
    ('method', {'name': 'rscfed'}, 'rscfed-groupsize6'),
    ('method', {'name': 'fedlsr_ml'}, 'fedlsr_ml-tw40'),
    ('method', {'name': 'fednoro_ml'}, 'fednoro_ml'),
    ('method', {'name': 'rscfed', 'group_size': 4}, 'rscfed-groupsize4'),
    ('method', {'name': 'fedirm'}, 'fedirm-suprounds20'),
    ('method', {'name': 'cbafed'}, 'cbafed-warmuprounds50'),
    ('method', {'name': 'fedprox', 'mu': 0.01}, 'fedprox-mu0.01'),
    ('method', {'name': 'fedla'}, 'fedla-tau1.0'),
    ('method', {'name': 'fednoro', 'warmup_rounds': 10}, 'fednoro-warmuprounds10'),
    ('partition', {'name': 'bernoulli_dirichlet', 'num_clients': 20, 'p': 0.9, 'alpha': 2.0}, 'bd-p0.9-a2.0-K20'),
    ('noise', {'name': 'fednoro_hidn', 'rho': 0.2, 'eta_l': 0.3, 'eta_u': 0.5, 'soft_labels': 'official_csv'}, 'hidn-rho0.2-eta0.3-0.5-ha81658'),
    ('noise', {'name': 'fednoro_hidn', 'rho': 0.2, 'eta_l': 0.5, 'eta_u': 0.7, 'soft_labels': 'official_csv'}, 'hidn-rho0.2-eta0.5-0.7-ha81658'),
    ('noise', {'name': 'fednoro_hidn', 'rho': 0.3, 'eta_l': 0.3, 'eta_u': 0.5, 'soft_labels': 'official_csv'}, 'hidn-rho0.3-eta0.3-0.5-ha81658'),
    ('noise', {'name': 'fednoro_hidn', 'rho': 0.3, 'eta_l': 0.5, 'eta_u': 0.7, 'soft_labels': 'official_csv'}, 'hidn-rho0.3-eta0.5-0.7-ha81658'),
    ('noise', {'name': 'fednoro_hidn', 'rho': 0.4, 'eta_l': 0.3, 'eta_u': 0.5, 'soft_labels': 'official_csv'}, 'hidn-rho0.4-eta0.3-0.5-ha81658'),
    ('noise', {'name': 'fednoro_hidn', 'rho': 0.4, 'eta_l': 0.5, 'eta_u': 0.7, 'soft_labels': 'official_csv'}, 'hidn-rho0.4-eta0.5-0.7-ha81658'),
    ('noise', {'name': 'fednoro_hidn', 'rho': 0.6, 'eta_l': 0.3, 'eta_u': 0.5, 'soft_labels': 'official_csv'}, 'hidn-rho0.6-eta0.3-0.5-ha81658'),
    ('noise', {'name': 'fednoro_hidn', 'rho': 0.6, 'eta_l': 0.5, 'eta_u': 0.7, 'soft_labels': 'official_csv'}, 'hidn-rho0.6-eta0.5-0.7-ha81658'),
    ('method', {'name': 'fedla', 'tau': 1.0}, 'fedla-tau1.0'),
    ('partition', {'name': 'bernoulli_dirichlet', 'num_clients': 20, 'p': 0.99, 'alpha': 1.5}, 'bd-p0.99-a1.5-K20'),
    ('noise', {'name': 'fednoro_hidn', 'rho': 0.4, 'eta_l': 0.5, 'eta_u': 0.7}, 'hidn-rho0.4-eta0.5-0.7'),
    ('noise', {'name': 'fednoro_hidn', 'rho': 0.6, 'eta_l': 0.5, 'eta_u': 0.7}, 'hidn-rho0.6-eta0.5-0.7'),
    ('method', {'name': 'fedprox', 'mu': 0.1}, 'fedprox-mu0.1'),
    ('method', {'name': 'fednoro', 'warmup_rounds': 20}, 'fednoro-warmuprounds20'),
    ('method', {'name': 'fednoro', 'warmup_rounds': 10, 'use_noisy_clients': False}, 'fednoro-warmuprounds10-hc854ff'),
    ('method', {'name': 'fednoro', 'warmup_rounds': 10, 'use_kd': False, 'use_daagg': True}, 'fednoro-warmuprounds10-hd95f1d'),
    ('method', {'name': 'fednoro', 'warmup_rounds': 10, 'use_kd': True, 'use_daagg': False}, 'fednoro-warmuprounds10-hf2f72c'),
    ('partition', {'name': 'iid', 'num_clients': 5}, 'iid-K5'),
    ('partition', {'name': 'bernoulli_dirichlet', 'num_clients': 5, 'p': 0.9, 'alpha': 2.0}, 'bd-p0.9-a2.0-K5'),
    ('noise', {'name': 'fednoro_hidn', 'rho': 0.6, 'eta_l': 0.5, 'eta_u': 0.7, 'annotator_epochs': 2}, 'hidn-rho0.6-eta0.5-0.7-h4adec2'),
    ('partition', {'name': 'iid', 'num_clients': 100}, 'iid-K100'),
    ('partition', {'name': 'iid', 'num_clients': 20, 'client_order': 'draw'}, 'iid-K20-draworder'),
    ('partition', {'name': 'iid', 'num_clients': 100, 'balance': 'per_class'}, 'iid-K100-perclass'),
    ('partition', {'name': 'bernoulli_dirichlet', 'num_clients': 500}, 'bd-p0.7-a10.0-K500'),
    ('partition', {'name': 'bernoulli_dirichlet', 'num_clients': 20, 'p': 1, 'alpha': 2, 'num_classes': 14}, 'bd-p1.0-a2.0-K20-C14'),
    ('partition', {'name': 'iid_niidbench', 'num_clients': 100}, 'iidperm-K100'),
    ('partition', {'name': 'iid_niidbench', 'num_clients': 10, 'remainder': 'array_split'}, 'iidperm-K10-arraysplit'),
    ('partition', {'name': 'dirichlet_niidbench', 'num_clients': 100}, 'dir-a0.3-K100-min10'),
    ('partition', {'name': 'dirichlet_niidbench', 'num_clients': 100, 'alpha': 0.5, 'min_require_size': 0, 'num_classes': 10}, 'dir-a0.5-K100-min0-C10'),
    ('partition', {'name': 'dirichlet_niidbench', 'num_clients': 100, 'max_attempts': 5}, 'dir-a0.3-K100-min10'),
    ('partition', {'name': 'quantity_skew', 'num_clients': 20}, 'qskew-s0.3-K20'),
    ('partition', {'name': 'quantity_skew', 'num_clients': 20, 'sigma': 0.0001}, 'qskew-s0.0001-K20'),
    ('partition', {'name': 'fedmlp_equal', 'num_clients': 5}, 'fedmlp-K5-sub5000'),
    ('partition', {'name': 'fedmlp_equal', 'num_clients': 8, 'subsample': None}, 'fedmlp-K8-all'),
    ('partition', {'name': 'fedmlp_equal', 'num_clients': 8, 'subsample': 100}, 'fedmlp-K8-sub100'),
    ('noise', {'name': 'fedcorr', 'rho': 1, 'tau': 0, 'label_space': 'all'}, 'fedcorr-rho1.0-tau0.0-all'),
    ('noise', {'name': 'fednoro_hidn', 'rho': 0.4, 'eta_l': 0.3, 'eta_u': 0.5}, 'hidn-rho0.4-eta0.3-0.5'),
    ('noise', {'name': 'fednoro_hidn', 'rho': 0.6, 'eta_l': 0.5, 'eta_u': 0.7, 'soft_labels': 'annotator', 'annotator_model': 'tiny', 'annotator_epochs': 2}, 'hidn-rho0.6-eta0.5-0.7-hebc757'),
    ('noise', {'name': 'fednoro_hidn', 'rho': 0.6, 'eta_l': 0.5, 'eta_u': 0.7, 'annotator_lr': 0.001, 'annotator_weight_decay': 0, 'annotator_batch_size': 8, 'annotator_seed': 3}, 'hidn-rho0.6-eta0.5-0.7-h5614d6'),
    ('noise', {'name': 'fedncl_bernoulli', 'p': 0.7}, 'nclbern-p0.7'),
    ('noise', {'name': 'fedncl_bernoulli', 'p': 0.6, 'include_true': False}, 'nclbern-p0.6-excl'),
    ('noise', {'name': 'fedncl_gaussian', 'mu': 0.4, 'sigma': 0.2}, 'nclgauss-mu0.4-sd0.2'),
    ('noise', {'name': 'fedncl_gaussian', 'mu': 0.4, 'sigma': 0.2, 'truncation': 'truncnorm', 'include_true': False}, 'nclgauss-mu0.4-sd0.2-truncnorm-excl'),
    ('noise', {'name': 'fedgr', 'noise_type': 'sym', 'phi': 0.6, 'rho_min': 0.2, 'rho_max': 0.4}, 'fedgr-sym-phi0.6-r0.2-0.4'),
    ('noise', {'name': 'fedgr', 'noise_type': 'sym', 'phi': 0.6, 'rho_min': 0.2, 'rho_max': 0.4, 'asym_map': 'cyclic'}, 'fedgr-sym-phi0.6-r0.2-0.4-h624880'),
    ('noise', {'name': 'fedgr', 'noise_type': 'asym', 'phi': 0.6, 'rho_min': 0.2, 'rho_max': 0.4}, 'fedgr-asym-phi0.6-r0.2-0.4-auto'),
    ('noise', {'name': 'fedgr', 'noise_type': 'mixed', 'phi': 1, 'rho_min': 0, 'rho_max': 1, 'asym_map': 'cifar10_classic'}, 'fedgr-mixed-phi1.0-r0.0-1.0-classic'),
    ('noise', {'name': 'fedgr', 'noise_type': 'asym', 'phi': 0.5, 'rho_min': 0.1, 'rho_max': 0.2, 'asym_map': [1, 2, 0]}, 'fedgr-asym-phi0.5-r0.1-0.2-maph519f4c'),
    ('noise', {'name': 'symmetric', 'rate': 0.2}, 'sym-r0.2'),
    ('noise', {'name': 'symmetric', 'rate': 0.2, 'include_true': True}, 'sym-r0.2-incl'),
    ('noise', {'name': 'asymmetric', 'rate': 0.2}, 'asym-r0.2-classic'),
    ('noise', {'name': 'asymmetric', 'rate': 0.4, 'asym_map': 'next_in_group'}, 'asym-r0.4-group'),
    ('noise', {'name': 'asymmetric', 'rate': 0.4, 'asym_map': [1, 0, 2]}, 'asym-r0.4-maph07eb7f'),
    ('noise', {'name': 'fedmlp_partial', 'missing': 2}, 'mlp-miss2'),
    ('noise', {'name': 'fedmlp_partial', 'missing': 2, 'class_seed': None}, 'mlp-miss2-csnoise'),
    ('noise', {'name': 'fedmlp_partial', 'missing': 3, 'class_seed': 7}, 'mlp-miss3-cs7'),
    ('method', {'name': 'fedprox'}, 'fedprox-mu0.01'),
    ('method', {'name': 'fedprox', 'mu': 0.01, 'form': 'fedcorr_unsquared', 'skip_first_batch': True}, 'fedprox-mu0.01-h86339d'),
    ('method', {'name': 'fedla', 'tau': 0.5}, 'fedla-tau0.5'),
    ('method', {'name': 'fednoro'}, 'fednoro-warmuprounds10'),
    ('method', {'name': 'fednoro', 'warmup_rounds': 1, 'ramp_begin': 1, 'ramp_end': 2}, 'fednoro-warmuprounds1-h8ff958'),
    ('method', {'name': 'fednoro', 'warmup_rounds': 10, 'detection_votes': 1, 'detection_augment': False, 'distance': 'global_l2'}, 'fednoro-warmuprounds10-hb365a2'),
    ('method', {'name': 'fednoro', 'tau': 0.5, 'kd_temperature': 1.5, 'lambda_max': 0.5}, 'fednoro-warmuprounds10-h4c6ab5'),
    ('method', {'name': 'fedgr'}, 'fedgr-warmuprounds100-lamR0.2'),
    ('method', {'name': 'fedgr', 'warmup_rounds': 50, 'lambda_r': 0.1}, 'fedgr-warmuprounds50-lamR0.1'),
    ('method', {'name': 'fedgr', 'lambda_r': 0.1, 'sieving': 'local'}, 'fedgr-warmuprounds100-lamR0.1-h4d0c08'),
    ('method', {'name': 'fedfixer'}, 'fedfixer-bmax2.0'),
    ('method', {'name': 'fedfixer', 'beta_max': 20.0}, 'fedfixer-bmax20.0'),
    ('method', {'name': 'fedfixer', 'personalised': 'persistent', 'lam': 0.0}, 'fedfixer-bmax2.0-h81d445'),
]


@pytest.mark.parametrize("kind, entry, slug", SLUG_PINS, ids=[s for _, _, s in SLUG_PINS])
def test_slugs_are_pinned(kind, entry, slug):
    build = {"partition": partition_spec_from_dict, "noise": noise_spec_from_dict, "method": method_from_dict}
    spec = build[kind](entry)
    assert spec.slug() == slug
    assert build[kind](spec.to_dict()).slug() == slug  # the round trip keeps it


def test_every_registered_spec_has_a_pinned_slug():
    pinned = {(k, e["name"]) for k, e, _ in SLUG_PINS}
    for kind, reg in (("partition", PARTITIONERS), ("noise", NOISE_MODELS), ("method", METHODS)):
        assert {(kind, n) for n in reg.builtin()} <= pinned


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
    """README's Extending examples, each saved as its own module and named in FNL_PLUGINS, just work."""
    import re

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme[readme.index("## Extending"):readme.index("## Tests and benchmarks")]
    names = re.findall(r"\*\*A [a-z ]+\*\* — `fnlcore/\w+/(\w+)\.py`:\s*```python\n(.*?)```", section, re.S)
    assert [n for n, _ in names] == ["fedsmooth", "halfsym", "blocks", "blobs"]
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
        "assert method_from_dict({'name': 'fedsmooth'}).slug() == 'fedsmooth-smoothing0.1'\n"
        "assert round_fields(METHODS['fedsmooth'].Params) == ('start_round',)\n"
        "try:\n    method_from_dict({'name': 'fedsmooth', 'smoothing': 1.5})\n"
        "except ConfigError as e:\n    assert str(e) == \"method 'fedsmooth': smoothing=1.5 must be in [0, 1)\", e\n"
        "else:\n    raise AssertionError('no error')\n"
        "noise = noise_spec_from_dict({'name': 'halfsym', 'rate': 0.4})\n"
        "part = partition_spec_from_dict({'name': 'blocks', 'num_clients': 10})\n"
        "assert (noise.slug(), part.slug()) == ('halfsym-r0.4', 'blocks-K10')\n"
        "y = np.arange(100) % 4\n"
        "a = part.run(y, 0)\n"
        "assert a.num_clients == 10 and 0 < noise.run(y, a, 4, 0).is_noisy.mean() <= 0.2\n"
        "prepare_dataset('blobs', raw_dir=r'TMP/raw', out_dir=r'TMP/out')\n"
        "assert load_prepared(r'TMP/out').labels('train').shape == (40,)\n"
        "print('ok')\n"
    ).replace("TMP", str(tmp_path))
    env = {**os.environ, "FNL_PLUGINS": ",".join(f"readme_{n}" for n, _ in names),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    out = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "ok", out.stderr[-3000:]
