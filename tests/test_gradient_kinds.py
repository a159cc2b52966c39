"""Kinds of incoming gradient (oracle/cases GRAD_KINDS, oracle/declare/spec.py upstream_gradient),
drawn and stratified as input values are: a backward whose row sum is computed in 16 bits fails the
suite only where the gradient lies along the output (tests/sixteen_bit_norm.py), and the same kernel
with a float32 sum passes."""

from __future__ import annotations

import os
import re
import subprocess
from types import SimpleNamespace

import pytest
import torch

from oracle import GRAD_KINDS
from oracle import engine
from oracle.cases import CPU_BUDGET, MODEST_GRAD_KINDS, NEAR_RANGE_VALUES, Case, spread_grad_kinds
from oracle.declare.implementations import Implementation, prepared
from oracle.declare.registry import SPECS
from oracle.declare.spec import fill, generator, upstream_gradient
from oracle.engine.devices import default_device
from oracle.ops import MODULES
from tests.conftest import module_runs


def _case(kind: str, layout: str = "contiguous", dtype: str = "bfloat16", seed: int = 3, rows: int = 3,
          cols: int = 40) -> Case:
    return Case("rms_norm", "llama", dtype, {"lead": [rows], "cols": cols}, "contiguous", "normal",
                {"eps": 1e-6, "weight": "same"}, seed=seed, grad_layout=layout, grad_values=kind)


def test_each_kind_is_what_it_says():
    y = (torch.randn(64, 40, generator=torch.Generator().manual_seed(0)) * 3).bfloat16()
    made = {kind: upstream_gradient(_case(kind), "Y", y) for kind in GRAD_KINDS}
    assert torch.equal(made["aligned"], y)  # exactly the output
    noisy = made["aligned_noisy"].double() - y.double()
    assert 0 < noisy.abs().max() < 0.1 * y.double().abs().max()  # the output and a little noise
    assert made["large"].double().abs().max() > 100 and made["tiny"].double().abs().max() < 1e-2
    assert (made["zero_rows"] == 0).all(-1).any()  # whole rows of zeros: ignored tokens
    outliers = made["outliers"].double().abs()
    assert outliers.max() > 100 * outliers.median()
    assert all(g.dtype == y.dtype and g.shape == y.shape for g in made.values())


def test_a_normal_gradient_is_the_one_drawn_before_kinds_existed():
    """Cases stored before gradients had kinds rerun with the same numbers, and keep their identity."""
    y = torch.randn(6, 40).bfloat16()
    for layout in ("contiguous", "broadcast"):
        case = _case("normal", layout)
        shape = y.shape[-1:] if layout == "broadcast" else y.shape
        before = fill(shape, y.dtype, "normal", generator(case, "dY"), "cpu").expand(y.shape)
        assert torch.equal(upstream_gradient(case, "Y", y), before)
    assert "grad_values" not in _case("normal").to_json()
    assert Case.from_json(_case("normal").to_json()) == _case("normal")


def test_a_broadcast_gradient_repeats_one_row_of_any_kind():
    y = torch.randn(5, 40).bfloat16()
    for kind in GRAD_KINDS:
        g = upstream_gradient(_case(kind, "broadcast"), "Y", y)
        assert torch.equal(g, g[:1].expand_as(g)), kind


def test_the_kind_is_named_in_the_case_line_the_label_and_the_repro():
    case = _case("aligned")
    assert "grad_values=aligned" in case.summary() and "dy_aligned" in case.label
    assert Case.from_json(case.to_json()) == case
    assert '\\"grad_values\\":\\"aligned\\"' in engine.repro_command(case, "kernels") or \
        '"grad_values":"aligned"' in engine.repro_command(case, "kernels")


def test_stratified_cases_cover_every_kind_of_every_op_with_gradients():
    for spec in SPECS.values():
        kinds = {case.grad_values for dtype in ("float32", "bfloat16") for case in spec.stratified(dtype, CPU_BUDGET)}
        assert kinds == (set(GRAD_KINDS) if spec.differentiable else {"normal"}), spec.name


def test_values_near_their_range_take_a_gradient_no_larger_than_normal():
    """A larger gradient on large, outlier or non-finite values makes HF's own 16-bit backward overflow
    where the truth is a number (SwiGLU's de = dh * g * silu'(e) with g at 4000): nothing to judge.
    Those values take a normal, tiny or zero-rows gradient, in the stratified cases and the drawn ones."""
    from hypothesis import given, settings

    def modest(case):
        return case.values not in NEAR_RANGE_VALUES or case.grad_values in MODEST_GRAD_KINDS

    for spec in SPECS.values():
        for case in spec.stratified("float16", CPU_BUDGET):
            assert modest(case), case.summary()

    @settings(max_examples=60, database=None)
    @given(case=SPECS["swiglu"].cases(CPU_BUDGET, ("float16",)))
    def drawn(case):
        assert modest(case), case.summary()

    drawn()


def test_the_kinds_spread_over_the_covering_rows_and_normal_values_keep_a_normal_gradient():
    """Seven kinds of gradient cost two cases beyond the rows covering the kinds of values, not six;
    the first case of normal values is the plain one every kernel is first written for."""
    built_in = [SPECS[op.name] for module in MODULES for op in module.SPECS if SPECS[op.name].differentiable]
    for spec in built_in:
        cases = spec.stratified("bfloat16", CPU_BUDGET)
        assert len(cases) <= len({case.values for case in cases}) + 3, (spec.name, len(cases))
        first = next(case for case in cases if case.values == "normal")
        assert first.grad_values == "normal", spec.name
    assert len(built_in) >= 4
    taken, left = spread_grad_kinds(["normal", "large", "tiny"], GRAD_KINDS)
    assert taken == ["normal", "tiny", "aligned"] and left == ["aligned_noisy", "large", "zero_rows", "outliers"]
    assert spread_grad_kinds(["large"], ("normal", "aligned")) == (["normal"], ["aligned"])


def test_a_declaration_restricts_its_kinds_and_a_wrong_one_is_named():
    from oracle import DeclarationError, Dim, Op, Tensor

    def declared(**options):
        return Op("scaled", reference=lambda X: 2 * X, inputs={"X": Tensor("rows", "cols")},
                  dims={"rows": Dim(1, 8, programs=True), "cols": Dim(1, 8)}, **options)

    assert {c.grad_values for c in declared(grad_kinds=("normal", "aligned")).spec.stratified("float32", CPU_BUDGET)} \
        == {"normal", "aligned"}
    with pytest.raises(DeclarationError, match="grad_kinds: must be some of normal, aligned"):
        declared(grad_kinds=("sideways",))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_sixteen_bit_row_sum_fails_only_under_a_gradient_along_the_output(dtype):
    module = prepared("tests.sixteen_bit_norm")
    spec = SPECS["rms_norm"]
    verdicts = {}
    for build in ("correct", "sixteen_bit_sum"):
        impl = Implementation(build, SimpleNamespace(rms_norm=getattr(module, build).rms_norm))
        for kind in ("normal", "aligned", "aligned_noisy"):
            results = [engine.run_case(spec, _case(kind, dtype=dtype, seed=seed, rows=8, cols=256), impl,
                                       default_device())
                       for seed in range(2)]
            verdicts[build, kind] = [(r.passed, [v.name for v in r.verdicts if not v.passed]) for r in results]
    assert all(passed for kind in ("normal", "aligned", "aligned_noisy") for passed, _ in verdicts["correct", kind])
    assert all(passed for passed, _ in verdicts["sixteen_bit_sum", "normal"])  # what random gradients see
    assert all(failed == ["dX"] for kind in ("aligned", "aligned_noisy")
               for passed, failed in verdicts["sixteen_bit_sum", kind])


def _suites(*impls: str) -> list[subprocess.CompletedProcess]:
    """The generic suite's differential test on the norm as a user declares it (no one-column rows),
    derandomized, in float16 (the in-process test above has bfloat16 too): one run per implementation,
    side by side."""
    runs = {impl: ["-q", "-p", "no:xdist", "-p", "no:cacheprovider", "--pyargs", "oracle.suite", "--op-module",
                   "tests.sixteen_bit_norm", "--impl", f"tests.sixteen_bit_norm:{impl}", "--ops", "wide_rms_norm",
                   "-k", "matches_hf and float16 and not bfloat16"] for impl in impls}
    done = module_runs("pytest", runs, timeout=600, env={**os.environ, "CI": "true"})
    return [done[impl] for impl in impls]


def test_the_suite_fails_the_sixteen_bit_sum_and_passes_the_float32_one():
    bad, good = _suites("sixteen_bit_sum", "correct")
    assert bad.returncode == 1 and "grad_values=aligned" in bad.stdout and "FAIL dX" in bad.stdout, bad.stdout[-3000:]
    assert "1 failed" in bad.stdout and not re.search(r"\d+ passed", bad.stdout), bad.stdout[-2000:]
    assert good.returncode == 0 and "1 passed" in good.stdout, good.stdout[-3000:]
