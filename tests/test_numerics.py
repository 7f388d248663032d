"""fnlcore.numerics: torch's elementary functions with the same bits on every CPU, and the guard that enforces them.

The values: the square root is the correctly rounded one (what float64 gives, rounded once more:
innocuous for a square root), the others agree with torch's to an ulp or two; the gradients are
torch's formulas. The guard (tests/vml_guard.py) fails a call that reaches MKL's vector math and
lets the portable forms through; the portable worker runs every call under it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fnlcore import numerics

from .portable import PortableWorker, PortableWorkerError
from .vml_guard import VMLCallError, VMLGuard

FUNCS = ["sqrt", "exp", "log", "sin", "cos"]


def _inputs(name: str, dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(4096, generator=gen, dtype=torch.float64)
    x = {"sqrt": x * 1e3, "log": x * 50 + 1e-6, "exp": x * 40 - 20}.get(name, x * 20 - 10)
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sqrt_is_correctly_rounded(dtype):
    x = torch.cat([_inputs("sqrt", dtype), torch.arange(1, 65537, dtype=dtype) / 7])
    got = numerics.sqrt(x)
    if dtype == torch.float32:  # float64's correctly rounded root, rounded to float32: the correctly rounded one
        want = torch.from_numpy(np.sqrt(x.double().numpy())).float()
    else:  # exact: r is the rounded root when the midpoints about it bracket x (checked in exact integers)
        want = got
        r = got.numpy()
        lo, hi = np.nextafter(r, 0), np.nextafter(r, np.inf)
        from fractions import Fraction

        for xi, ri, l, h in list(zip(x.numpy(), r, lo, hi))[:300]:
            f, fr = Fraction(float(xi)), Fraction(float(ri))
            assert ((fr + Fraction(float(l))) / 2) ** 2 <= f <= ((fr + Fraction(float(h))) / 2) ** 2
    assert torch.equal(got, want)


@pytest.mark.parametrize("name", FUNCS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_values_agree_with_torch_within_two_ulps(name, dtype):
    x = _inputs(name, dtype)
    got, want = getattr(numerics, name)(x), getattr(torch, name)(x)
    assert got.dtype == dtype and got.shape == x.shape
    ulp = torch.abs(torch.nextafter(want, torch.full_like(want, float("inf"))) - want)
    assert torch.all(torch.abs(got - want) <= 2 * ulp), name


@pytest.mark.parametrize("name", FUNCS)
def test_gradients_are_torchs(name):
    x = _inputs(name, torch.float64)[:64]
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    g = torch.linspace(-1, 1, 64, dtype=torch.float64)
    (getattr(numerics, name)(a) * g).sum().backward()
    (getattr(torch, name)(b) * g).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-14, atol=0)
    assert torch.autograd.gradcheck(getattr(numerics, name), (x[:8].clone().requires_grad_(),))


def test_shapes_strides_scalars_and_specials():
    x = torch.tensor([[0.0, 4.0], [-1.0, float("inf")]]).t()  # not contiguous
    got = numerics.sqrt(x)
    assert got[0, 0] == 0 and torch.isnan(got[0, 1]) and got[1, 0] == 2 and got[1, 1] == float("inf")
    assert numerics.log(torch.tensor(0.0)).item() == float("-inf") and numerics.log(torch.tensor(0.0)).dim() == 0
    assert numerics.sqrt(torch.tensor(9.0, dtype=torch.float64)).item() == 3.0


def test_other_dtypes_and_the_foreach_form():
    half = torch.tensor([4.0, 9.0], dtype=torch.bfloat16)
    assert numerics.sqrt(half).dtype == torch.bfloat16 and numerics.sqrt(half).tolist() == [2.0, 3.0]
    ts = [torch.tensor([4.0, 2.0]), torch.tensor([16.0], dtype=torch.float64), half]
    got = numerics.foreach_sqrt(ts)
    assert [t.dtype for t in got] == [t.dtype for t in ts]
    assert all(torch.equal(a, numerics.sqrt(t)) for a, t in zip(got, ts))


# -- the guard --------------------------------------------------------------------------------------------


def _raises_vml(fn, op: str):
    with pytest.raises(VMLCallError, match=op) as err, VMLGuard():
        fn()
    assert "test_numerics.py" in str(err.value)  # the caller is named
    return err


@pytest.mark.parametrize("call", [
    lambda x: torch.sqrt(x), lambda x: x.exp(), lambda x: x.clone().log_(), lambda x: torch.tanh(x),
    lambda x: torch.pow(x, 0.5), lambda x: x ** -0.5, lambda x: torch._foreach_sqrt([x]),
    lambda x: torch.cdist(x.view(32, 2), x.view(32, 2)), lambda x: torch.erf(x.double()),
], ids=["sqrt", "exp", "log_", "tanh", "pow_half", "pow_minus_half", "foreach_sqrt", "cdist_mm", "erf64"])
def test_the_guard_fails_a_vml_backed_call_naming_op_and_caller(call):
    x = torch.rand(64) + 0.5
    _raises_vml(lambda: call(x), r"aten\.")


def test_the_guard_sees_torchs_own_adam_on_the_cpu():
    p = torch.nn.Parameter(torch.rand(8))
    p.grad = torch.rand(8)
    opt = torch.optim.Adam([p], foreach=False)
    _raises_vml(opt.step, "sqrt")


def test_the_guard_lets_portable_calls_through():
    x = torch.rand(64, requires_grad=True)
    with VMLGuard():
        for name in FUNCS:
            getattr(numerics, name)(x + 0.5).sum().backward()
        torch.sqrt(x.detach().bfloat16())  # not MKL's
        torch.cdist(x.detach().view(32, 2), x.detach().view(32, 2), compute_mode="donot_use_mm_for_euclid_dist")
        torch.pow(x.detach(), 2.0), torch.rsqrt(x.detach() + 1), torch.log1p(x.detach()), torch.sigmoid(x.detach())
        p = torch.nn.Parameter(torch.rand(8))
        p.grad = torch.rand(8)
        torch.optim.Adam([p], fused=True).step()
        torch.nn.functional.cross_entropy(x.detach().view(8, 8), torch.zeros(8, dtype=torch.long))


def _calls_torch_sqrt():
    return torch.sqrt(torch.rand(4)).tolist()


def test_the_portable_worker_runs_every_call_under_the_guard():
    worker = PortableWorker("tests.test_numerics:_calls_torch_sqrt")
    try:
        with pytest.raises(PortableWorkerError, match=r"VMLCallError: aten\.sqrt.*test_numerics\.py"):
            worker.call()
    finally:
        worker.close()


def _glibc_active_features(env) -> dict[str, int]:
    import shutil
    import subprocess

    loader = shutil.which("ld.so") or "/lib64/ld-linux-x86-64.so.2"
    out = subprocess.run([loader, "--list-diagnostics"], env=env, capture_output=True, text=True, check=True).stdout
    words = dict(line.split("=", 1) for line in out.splitlines() if ".active[" in line)
    return {k: int(v, 16) for k, v in words.items()}


def test_the_portable_environment_turns_off_glibcs_fma_and_avx_variants():
    """glibc reads GLIBC_TUNABLES' names only if they are its own (2.36: 'FMA', not 'FMA_Usable'): the active
    feature words of a process under PORTABLE_ENV have FMA (leaf 1 ecx bit 12), AVX (bit 28) and AVX2
    (leaf 7 ebx bit 5) off, so libm takes the same SSE2 code for exp, log, pow, sin... on every CPU."""
    from .portable import portable_env

    words = _glibc_active_features(portable_env())
    leaf1_ecx = words["x86.cpu_features.features[0x0].active[0x2]"]
    leaf7_ebx = words["x86.cpu_features.features[0x1].active[0x1]"]
    assert not leaf1_ecx & (1 << 12) and not leaf1_ecx & (1 << 28) and not leaf7_ebx & (1 << 5)
