"""The generic differential suite: every spec x every float dtype, hypothesis-drawn, for --impl.

One test per property, expanded over the registry (oracle/ops/, see Note [Specs]); nothing here
names an op. A failure prints the case, per-tensor metrics, aliasing findings, and the command that
reruns exactly that case. Ops the implementation lacks are skipped with the reason. The fixtures
(``impl``, ``device``, ``asked_ops``) come from the harness's pytest plugin (oracle/pytest_plugin.py).

Run it on any implementation with ``pytest --pyargs oracle.suite --impl package.module:attr``; this
repository's tests/test_ops.py imports the tests (``__all__``) so that its own run holds them too.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings

from oracle import aliasing
from oracle.cases import FLOAT_DTYPES
from oracle.devices import case_budget
from oracle.engine import place, prepare, repro_command, run_case
from oracle.ops import SPECS
from oracle.specs import OpSpec

BUDGET = case_budget()


def _require_op(impl, spec: OpSpec, asked_ops: list[str]):
    """Skip an op the run does not ask for: the plugin has made sure every op asked is there, so
    what is left are ops excluded by --ops or declared LACKING by the implementation."""
    if spec.name not in asked_ops:
        why = impl.declared_lacking().get(spec.name) or "not in --ops"
        pytest.skip(f"{spec.name} not asked of {impl.name}: {why}")


def _differential_test(spec: OpSpec, dtype: str):
    @given(case=spec.cases(BUDGET, (dtype,)))
    def test(case, impl, device, asked_ops):
        _require_op(impl, spec, asked_ops)
        result = run_case(spec, case, impl, device)
        assert result.passed, result.explain()

    # Pinned regressions and the stratified cases (every variant, layout, gradient layout, kind of
    # values, short and long) run in every profile before hypothesis draws its own.
    for pinned in [c for c in spec.regressions if c.dtype == dtype] + spec.stratified(dtype, BUDGET):
        test = example(case=pinned)(test)
    test.__doc__ = f"{spec.name} in {dtype}: forward and every gradient judged against HF and the fp64 truth."
    test.oracle_op = spec.name  # the plugin skips ops not asked before hypothesis runs any example
    return test


def _aliasing_test(spec: OpSpec, check: str):
    @settings(max_examples=max(2, settings().max_examples // 3))
    @given(case=spec.cases(BUDGET))
    def test(case, impl, device, asked_ops):
        _require_op(impl, spec, asked_ops)
        findings = aliasing.run_check(check, spec, case, impl, device)
        assert not findings, "\n".join([case.summary()] + [f.describe() for f in findings]) + \
            f"\nrerun: {repro_command(case, impl.name, check)}"

    for pinned in aliasing_examples(spec):
        test = example(case=pinned)(test)
    test.__doc__ = f"{spec.name}: aliasing check {check!r} (see oracle/aliasing.py)."
    test.oracle_op = spec.name
    return test


def aliasing_examples(spec: OpSpec) -> list:
    """One short stratified case per variant and dtype, so that every check runs on each."""
    out = []
    for dtype in FLOAT_DTYPES:
        short = [c for c in spec.stratified(dtype, BUDGET) if not spec.long(c)]
        out += [next(c for c in short if c.variant == variant) for variant in spec.variants]
    return out


for _spec in SPECS.values():
    for _dtype in FLOAT_DTYPES:
        globals()[f"test_matches_hf__{_spec.name}__{_dtype}"] = _differential_test(_spec, _dtype)
    for _check in aliasing.applicable(_spec):
        globals()[f"test_aliasing__{_spec.name}__{_check.replace('-', '_')}"] = _aliasing_test(_spec, _check)


FLOAT64_CASES = [pytest.param(case, id=f"{case.op}-{case.variant}") for spec in SPECS.values() for case in spec.float64_cases]


@pytest.mark.parametrize("case", FLOAT64_CASES)
def test_float64(case, impl, device, asked_ops):
    """In float64: torch.autograd.gradcheck of a hand-written backward against finite differences;
    for a kernel outside autograd (the raw SwiGLU ones), its outputs against HF's formula, to within
    float64 rounding (a float32 intermediate is 1e-7 off; 1e-10 is allowed). Skipped only for an
    op the implementation declares in NO_FLOAT64."""
    spec = SPECS[case.op]
    _require_op(impl, spec, asked_ops)
    if not impl.takes_float64(spec.name):
        pytest.skip(f"{impl.name} declares no float64 path for {spec.name} (NO_FLOAT64)")
    prepared = prepare(spec, case, device)
    if not spec.differentiable:
        args, _ = place(spec, case, prepared.args, device, [])
        got = dict(zip(spec.outputs, spec.call(impl.op(spec.name), args)))
        for name, want in prepared.hf.outputs.items():
            torch.testing.assert_close(got[name], want, rtol=1e-10, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")
        return
    leaves = [prepared.args[n].detach().clone().requires_grad_() for n in spec.differentiable]

    def fn(*values):
        # Fresh guarded copies in the case's layout each call: in-place ops (rope) must not rotate
        # gradcheck's own inputs, and the copies carry the gradient back to them.
        args, _ = place(spec, case, prepared.args, device, [], sources=dict(zip(spec.differentiable, values)))
        return spec.call(impl.op(spec.name), args)

    assert torch.autograd.gradcheck(fn, leaves, fast_mode=True)


SCALE_CASES = [pytest.param(case, id=case.label, marks=pytest.mark.scale)
               for spec in SPECS.values() for case in spec.scale()]


@pytest.mark.parametrize("case", SCALE_CASES)
def test_at_scale(case, impl, device, asked_ops):
    """The scale grid: the sizes people train at, up to 2^31 elements, judged against HF and the
    truth on a slice of each case's programs (oracle/scale.py). Opt in with --scale, on a GPU."""
    _require_op(impl, SPECS[case.op], asked_ops)
    if device.type != "cuda":
        pytest.skip("the scale grid needs a CUDA GPU: up to 2^31 elements per case")
    result = run_case(case.op, case, impl, device)
    assert result.passed, result.explain()


# The tests, and only they: what tests/test_ops.py's star import takes.
__all__ = [name for name in list(globals()) if name.startswith("test_")]
