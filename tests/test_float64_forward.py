"""The float64 check holds an autograd op's forward to the float64 truth, not only its backward to
finite differences of that forward (oracle/engine/__init__.py, Note [The float64 forward]).

The bug it is for: RMSNorm's eps handed to a kernel rounded to float32. A kernel computing in
float64 adds back what the rounding lost (kernels/rms_norm.py, ``_inv_rms``'s ``var + eps_lo``);
without it Y is 1e-8 off on rows of tiny values, where eps dominates mean(x^2), and its backward
is still the exact derivative of its own forward, so gradcheck passes it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from oracle.declare.implementations import Implementation, load
from oracle.declare.registry import SPECS
from oracle.engine import FLOAT64_RTOL, Float64Failure, check_float64

NORM = SPECS["rms_norm"]
TINY = next(c for c in NORM.float64_cases if c.values == "tiny")


def _kernel_with_eps_in_float32() -> Implementation:
    """The built-in kernel given eps rounded to float32: eps_lo is then 0, as in the mutants of
    ``var + eps_lo`` that drop the term or eps."""
    norm = load("kernels").op("rms_norm")

    def rms_norm(X, W, eps, gemma=False):
        return norm(X, W, float(torch.tensor(eps, dtype=torch.float32)), gemma)

    return Implementation("eps_in_float32", SimpleNamespace(rms_norm=rms_norm))


def test_the_float64_cases_of_rms_norm_include_rows_of_tiny_values():
    """The case where eps rounded to float32 shows: its eps (1e-5) loses 2.5e-8 of itself in float32,
    and on rows where eps dominates mean(x^2) that moves 1/rms, so Y, by half as much: over 100 times
    the rtol allowed."""
    eps = TINY.params["eps"]
    lost = abs(eps - float(torch.tensor(eps, dtype=torch.float32)))
    assert TINY.dtype == "float64" and lost / eps / 2 > 100 * FLOAT64_RTOL


def test_a_float64_forward_off_by_eps_rounding_fails_and_the_kernel_passes(device):
    wrong = _kernel_with_eps_in_float32()
    with pytest.raises(Float64Failure) as failure:
        check_float64(NORM, TINY, wrong, device)
    text = str(failure.value)
    first = text.splitlines()[0]
    assert first.startswith("Y differs from the float64 truth at 28 of 28 elements"), text
    assert "off by 1.26e-08 relative; allowed: rtol 1e-10 plus atol" in first, first
    assert f"float64 check of {TINY.summary()}  [impl eps_in_float32]" in text
    assert "rerun: python -m oracle.repro --impl eps_in_float32 --float64" in text
    assert "NO_FLOAT64 = {'rms_norm'}" in text and "tensor(" not in text, text
    for case in NORM.float64_cases:  # the kernel itself, adding eps_lo back, passes every float64 case
        check_float64(NORM, case, load("kernels"), device)


def test_gradcheck_alone_passes_the_forward_off_by_eps_rounding(device):
    """Why the forward is compared: the backward of the wrong forward is that forward's own exact
    derivative, and finite differences agree with it."""
    op = _kernel_with_eps_in_float32().op("rms_norm")
    args = NORM.make_args(TINY, device)
    leaves = [args["X"].clone().requires_grad_(), args["W"].clone().requires_grad_()]
    assert torch.autograd.gradcheck(lambda X, W: op(X, W, TINY.params["eps"]), leaves, fast_mode=True)


def test_a_float64_input_computed_in_float32_fails_the_forward(device):
    """HF's own RMSNorm computes in float32 whatever its input (``compute`` is float32 unless asked):
    its float64 outputs are 1e-7 off, and the check says so before gradcheck runs."""
    in_float32 = Implementation("hf_in_float32", SimpleNamespace(rms_norm=NORM.reference))
    with pytest.raises(Float64Failure, match=r"^Y differs from the float64 truth at \d+ of \d+ elements .* off by "
                                             r"[0-9.]+e-0[78] relative"):
        check_float64(NORM, NORM.float64_cases[0], in_float32, device)
    check_float64(NORM, NORM.float64_cases[0], load("hf"), device)  # hf computes float64 inputs in float64
