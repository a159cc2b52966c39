"""Other libraries' kernels declared from outside the harness (peers/): the declarations are sharp
(the reference computed in fp32 passes, a planted slip fails) and an adapter without its library
stops the session with the reason and the command that gets it. The libraries themselves run on
the H200 (scripts/h200.sh flash-attn-tests) or, on CPU, with FLASH_ATTN_SOURCE set."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from oracle.cases import CPU_BUDGET
from oracle.engine import run_case
from oracle.declare.implementations import Implementation
from peers.flash_attn_triton import ops
from peers.liger.ops import sparsemax
from tests.conftest import ROOT

# The declarations' specs, not registered: this session's registry stays the harness's own.
SPECS = {op.name: op.spec for op in (ops.FA_ROTARY, ops.FA_ROTARY_VARLEN, ops.FA_ADD_RMS_NORM, ops.FA_ADD_LAYER_NORM)}

CPU = torch.device("cpu")
ROTARY = ("fa_rotary", "fa_rotary_varlen")


def _in_fp32(reference):
    """The reference computed in fp32 and rounded once: what a correct kernel does."""
    def call(*args):
        outs = reference(*[a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args])
        dtype = args[0].dtype
        return tuple(o.to(dtype) for o in outs) if isinstance(outs, tuple) else outs.to(dtype)
    return call


def _sin_sign_flipped(x, cos, sin, interleaved):
    return _in_fp32(ops.rotary)(x, cos, -sin, interleaved)


@pytest.mark.parametrize("op", ROTARY + ("fa_add_rms_norm", "fa_add_layer_norm"))
def test_a_correct_kernel_passes_every_stratified_case(op):
    spec = SPECS[op]
    good = Implementation("fp32", SimpleNamespace(**{op: _in_fp32(spec.reference)}))
    for dtype in ("bfloat16", "float32"):
        for case in spec.stratified(dtype, CPU_BUDGET)[:4]:
            result = run_case(spec, case, good, CPU)
            assert result.passed, result.explain()


def test_a_rotation_the_wrong_way_fails():
    spec = SPECS["fa_rotary"]
    bad = Implementation("flipped", SimpleNamespace(fa_rotary=_sin_sign_flipped))
    for variant in ("plain", "interleaved"):
        case = next(c for c in spec.stratified("float32", CPU_BUDGET) if c.variant == variant)
        assert not run_case(spec, case, bad, CPU).passed


def test_varlen_positions_restart_with_each_sequence():
    assert ops.segments(1) == [1] and ops.segments(80) == [1, 7, 64, 3, 5] and sum(ops.segments(1000)) == 1000
    x = torch.randn(8, 1, 4, dtype=torch.float64)
    angles = ops.rotary_angles(8, 2)
    y = ops.rotary_varlen(x, angles.cos(), angles.sin(), False)
    assert torch.equal(y[0], x[0]) and torch.equal(y[1], x[1])  # two sequences' first tokens: position 0


def test_without_the_library_the_session_stops_with_how_to_get_it():
    env = {k: v for k, v in os.environ.items() if k != "FLASH_ATTN_SOURCE"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--co", "--pyargs",
                           "oracle.suite", "--op-module", "peers.flash_attn_triton.ops",
                           "--impl", "peers.flash_attn_triton.impl:impl"], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, out
    assert "flash-attn's source is not given: pip download" in out and "FLASH_ATTN_SOURCE=" in out, out


@pytest.mark.skipif("FLASH_ATTN_SOURCE" not in os.environ, reason="FLASH_ATTN_SOURCE names no flash-attn sdist "
                    "(peers/flash_attn_triton/__init__.py says how to get it)")
def test_flash_attn_rotary_passes_its_stratified_cases():
    from oracle import interpreter

    module = interpreter.prepare_for("peers.flash_attn_triton.impl")  # on CPU: the interpreter, bf16 casts corrected
    flash_attn = Implementation("flash-attn", module.impl)
    for op in ROTARY:
        for case in SPECS[op].stratified("bfloat16", CPU_BUDGET)[:3]:
            result = run_case(SPECS[op], case, flash_attn, CPU)
            assert result.passed, result.explain()


def _sparsemax_jacobian_product(X: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Sparsemax's Jacobian (Martins & Astudillo 2016) applied to g, row by row: on the support
    S = {j: y_j > 0}, g minus its mean over S; 0 off it."""
    support = (sparsemax(X) > 0).to(X.dtype)
    mean = (g * support).sum(-1, keepdim=True) / support.sum(-1, keepdim=True)
    return support * (g - mean)


@pytest.mark.parametrize("tie", [False, True])
def test_liger_sparsemax_reference_has_sparsemaxs_jacobian_at_a_tie(tie):
    """An entry exactly at tau (y = 0; on a 16-bit grid it happens: bf16 2.375 = tau in a Liger case)
    is off the support. torch.clamp(min=0) passed the gradient there while tau kept it over the other
    entries, a derivative of neither side, which failed Liger's (correct) dX at that element."""
    # support {3, 2.5}: tau = (3 + 2.5 - 1) / 2 = 2.25, so a third entry of 2.25 sits exactly at tau
    X = torch.tensor([[3.0, 2.5, 2.25 if tie else 2.0, 1.5, 0.0]], dtype=torch.float64, requires_grad=True)
    y = sparsemax(X)
    assert y.tolist() == [[0.75, 0.25, 0.0, 0.0, 0.0]]
    g = torch.tensor([[0.3, -1.2, 0.7, 2.0, -0.4]], dtype=torch.float64)
    (dX,) = torch.autograd.grad(y, X, g)
    torch.testing.assert_close(dX, _sparsemax_jacobian_product(X.detach(), g), rtol=0, atol=1e-15)
