"""The generic differential suite for --impl, as this repository runs it, and the specs' own structure.

The generic tests live in the package (oracle/suite/test_contract.py, what ``pytest --pyargs
oracle.suite`` runs elsewhere); importing them here makes ``pytest -n auto`` run them once, beside
the tests below of the specs themselves: every variant has a float64 case, and hypothesis and the
stratified examples reach every variant, layout and size.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from oracle.cases import FLOAT_DTYPES
from oracle.declare.registry import SPECS
from oracle.suite.test_contract import *  # the generic tests, collected as this module's
from oracle.suite.test_contract import BUDGET, aliasing_examples


@pytest.mark.parametrize("op", list(SPECS))
def test_every_variant_has_a_float64_case(op):
    spec = SPECS[op]
    assert {c.variant for c in spec.float64_cases} == set(spec.variants)
    assert {c.dtype for c in spec.float64_cases} == {"float64"}


@pytest.mark.parametrize("op", list(SPECS))
def test_hypothesis_draws_every_variant_layout_and_size(op):
    """The strategies reach every variant, dtype, input and gradient layout a spec declares, and
    sizes past the tiles (no dead corners)."""
    spec = SPECS[op]
    seen = []

    @settings(max_examples=200, database=None, derandomize=True)
    @given(case=spec.cases(BUDGET))
    def collect(case):
        seen.append(case)

    collect()
    inputs, grads = spec.input_layouts(), spec.gradient_layouts()
    assert {c.variant for c in seen} == set(spec.variants)
    assert {c.dtype for c in seen} == set(FLOAT_DTYPES)
    assert {c.layout for c in seen} == inputs
    assert {c.grad_layout for c in seen} == grads
    assert sum(map(spec.long, seen)) >= len(seen) // 10, "too few cases past the kernels' tiles"


@pytest.mark.parametrize("op", list(SPECS))
def test_stratified_cases_cover_every_combination_that_matters(op):
    """In every dtype, the stratified examples alone hold every variant, input layout, gradient
    layout, short and long sizes; and the aliasing examples every variant."""
    spec = SPECS[op]
    inputs, grads = spec.input_layouts(), spec.gradient_layouts()
    for dtype in FLOAT_DTYPES:
        cases = spec.stratified(dtype, BUDGET)
        assert {c.dtype for c in cases} == {dtype}
        assert {c.variant for c in cases} == set(spec.variants)
        assert {c.layout for c in cases} == inputs and {c.grad_layout for c in cases} == grads
        assert {spec.long(c) for c in cases} == {True, False}
        assert {(c.variant, spec.long(c)) for c in cases} == {(v, p) for v in spec.variants for p in (True, False)}
    assert {(c.variant, c.dtype) for c in aliasing_examples(spec)} == \
        {(v, d) for v in spec.variants for d in FLOAT_DTYPES}

