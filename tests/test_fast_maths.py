"""Fast GPU maths is judged by what it entitles (oracle/noise/rounding.py, Note [Fast maths]): a
correct float32 SwiGLU whose exp is Triton's tl.exp passes the suite's test by default, says which
tensors needed that room, and fails when it declares exact maths; the kernels are judged exactly."""

from __future__ import annotations

import torch

from oracle.cases import Case
from oracle.engine import run_case
from oracle.declare.implementations import load
from tests.test_catalogue import _run_suite_test

LARGE = Case("swiglu", "default", "float32", {"shape": [4, 999]}, "contiguous", "large", {}, seed=6)


def test_a_fast_exp_kernel_passes_by_default_and_says_it_needed_the_room(device):
    impl = load("tests.fast_maths_impls:fast_exp_swiglu")
    assert impl.maths("swiglu") == "fast"
    assert _run_suite_test_for(impl.name, "float32", device) is None
    result = run_case("swiglu", LARGE, impl, device)
    assert result.passed, result.explain()
    needed = {v.name for v in result.verdicts if v.needed_fast_maths}
    assert needed and all(v.maths == "fast" for v in result.verdicts), result.explain()
    assert "fast maths" in result.explain()


def test_declared_exact_it_is_held_to_the_librarys_accuracy(device):
    impl = load("tests.fast_maths_impls:fast_exp_swiglu_declared_exact")
    assert impl.maths("swiglu") == "exact"
    assert not run_case("swiglu", LARGE, impl, device).passed
    assert _run_suite_test_for(impl.name, "float32", device) is not None


def test_the_kernels_declare_exact_maths_and_are_judged_so(device):
    impl = load("kernels")
    result = run_case("swiglu", LARGE, impl, device)
    assert result.passed and {v.maths for v in result.verdicts} == {"exact"}


def _run_suite_test_for(impl: str, dtype: str, device):
    """What the generic SwiGLU test raised against ``impl`` (None: it passed)."""
    raised, _ = _run_suite_test(load(impl), "swiglu", dtype, device)
    return raised


def test_a_triton_kernel_with_tl_exp_passes_by_default(device):
    """On a GPU tl.exp is the hardware's fast exp2 (under the interpreter numpy's exp, exact: then
    the kernel passes either way). Declared exact, on a GPU, its large-value case fails."""
    assert _run_suite_test_for("tests.fast_maths_impls:triton_fast_exp_swiglu", "float32", device) is None
    exact = run_case("swiglu", LARGE, load("tests.fast_maths_impls:triton_fast_exp_swiglu_declared_exact"), device)
    assert exact.passed == (device.type != "cuda"), exact.explain()
