"""The generic differential suite: every spec x every float dtype, hypothesis-drawn, for --impl.

One test per property, expanded over oracle.specs.SPECS (see Note [Specs]); nothing here names an
op. A failure prints the case, per-tensor metrics, aliasing findings, and the command that reruns
exactly that case. Ops the implementation lacks are skipped with the reason.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings

from oracle import aliasing
from oracle.cases import FLOAT_DTYPES
from oracle.devices import case_budget
from oracle.engine import place, prepare, repro_command, run_case
from oracle.impls import ImplementationUnavailable, load
from oracle.specs import SPECS, OpSpec

BUDGET = case_budget()


@pytest.fixture(scope="session")
def impl(impl_name):
    try:
        return load(impl_name)
    except ImplementationUnavailable as exc:
        pytest.skip(str(exc))


def _require_op(impl, spec: OpSpec):
    if impl.op(spec.name) is None:
        pytest.skip(f"{impl.name} has no {spec.name}")


def _differential_test(spec: OpSpec, dtype: str):
    @given(case=spec.cases(BUDGET, (dtype,)))
    def test(case, impl, device):
        _require_op(impl, spec)
        result = run_case(spec, case, impl, device)
        assert result.passed, result.explain()

    for pinned in spec.regressions:
        if pinned.dtype == dtype:
            test = example(case=pinned)(test)
    test.__doc__ = f"{spec.name} in {dtype}: forward and every gradient judged against HF and the fp64 truth."
    return test


def _aliasing_test(spec: OpSpec, check: str):
    @settings(max_examples=max(2, settings().max_examples // 3))
    @given(case=spec.cases(BUDGET))
    def test(case, impl, device):
        _require_op(impl, spec)
        findings = aliasing.run_check(check, spec, case, impl, device)
        assert not findings, "\n".join([case.summary()] + [f.describe() for f in findings]) + \
            f"\nrerun: {repro_command(case, impl.name, check)}"

    test.__doc__ = f"{spec.name}: aliasing check {check!r} (see oracle/aliasing.py)."
    return test


for _spec in SPECS.values():
    for _dtype in FLOAT_DTYPES:
        globals()[f"test_matches_hf__{_spec.name}__{_dtype}"] = _differential_test(_spec, _dtype)
    for _check in aliasing.applicable(_spec):
        globals()[f"test_aliasing__{_spec.name}__{_check.replace('-', '_')}"] = _aliasing_test(_spec, _check)


@pytest.mark.parametrize("op", [name for name, spec in SPECS.items() if spec.gradcheck_case is not None])
def test_gradcheck_float64(op, impl, device):
    """torch.autograd.gradcheck of the hand-written backward against finite differences, in float64."""
    spec = SPECS[op]
    _require_op(impl, spec)
    case = spec.gradcheck_case
    prepared = prepare(spec, case, device)
    leaves = [prepared.args[n].detach().clone().requires_grad_() for n in spec.differentiable]

    def fn(*values):
        # Fresh guarded copies in the case's layout each call: in-place ops (rope) must not rotate
        # gradcheck's own inputs, and the copies carry the gradient back to them.
        args, _ = place(spec, case, prepared.args, device, [], sources=dict(zip(spec.differentiable, values)))
        return spec.call(impl.op(spec.name), args)

    try:
        assert torch.autograd.gradcheck(fn, leaves, fast_mode=True)
    except TypeError as exc:
        if "float64" in str(exc) or "dtype" in str(exc):
            pytest.skip(f"{impl.name}'s {op} does not take float64: {exc}")
        raise


def test_hypothesis_draws_every_variant():
    """The strategies reach every variant, dtype and layout a spec declares (no dead corners)."""
    for spec in SPECS.values():
        seen = set()

        @settings(max_examples=200, database=None, derandomize=True)
        @given(case=spec.cases(BUDGET))
        def collect(case):
            seen.add((case.variant, case.dtype, case.layout))

        collect()
        assert {v for v, _, _ in seen} == set(spec.variants), spec.name
        assert {d for _, d, _ in seen} == set(FLOAT_DTYPES), spec.name

