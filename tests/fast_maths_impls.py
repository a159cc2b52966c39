"""Correct implementations that evaluate exp the way Triton's tl.exp does on a GPU: exp2 of
x * log2(e), the product rounded to float32 first (oracle/noise/rounding.py, Note [Fast maths]).
Emulated in torch, so that the CPU suite can judge them: by default they pass; declared exact
(EXACT_MATHS) they are held to libdevice's accuracy, and the tensors of large inputs fail."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

LOG2E = 1 / math.log(2)


def fast_exp(x: torch.Tensor) -> torch.Tensor:
    """tl.exp: exp2 of the float32 product x * log2(e)."""
    return torch.exp2((x.float() * LOG2E).float())


class _FastSwiglu(torch.autograd.Function):
    """silu(e) * g with sigmoid = 1 / (1 + fast_exp(-e)), in float32, rounded as HF rounds."""

    @staticmethod
    def forward(ctx, e, g):
        ctx.save_for_backward(e, g)
        x = e.float()
        f = (x / (1 + fast_exp(-x))).to(e.dtype)
        return (f.float() * g.float()).to(e.dtype)

    @staticmethod
    def backward(ctx, dh):
        e, g = ctx.saved_tensors
        x = e.float()
        s = 1 / (1 + fast_exp(-x))
        f = (x * s).to(e.dtype).float()
        dg = (dh.float() * f).to(g.dtype)
        dhg = (dh.float() * g.float()).to(e.dtype).float()
        de = (dhg * s * (1 + x * (1 - s))).to(e.dtype)
        return de, dg


def _swiglu(e, g):
    return _FastSwiglu.apply(e, g)


# float32 emulations: no float64 path
fast_exp_swiglu = SimpleNamespace(swiglu=_swiglu, NO_FLOAT64={"swiglu"})
fast_exp_swiglu_declared_exact = SimpleNamespace(swiglu=_swiglu, NO_FLOAT64={"swiglu"}, EXACT_MATHS=True)


# --- the same in Triton, with tl.exp and tl.sigmoid: what the GPU's fast exp really does ---------

import kernels  # noqa: E402,F401  (before triton: it picks the interpreter on a machine without a GPU)
import triton  # noqa: E402
from kernels._runtime import launching  # noqa: E402  (faithful bf16 casts, numpy's IEEE warnings silenced)
import triton.language as tl  # noqa: E402

BLOCK = 1024


@triton.jit
def _forward(h_ptr, e_ptr, g_ptr, n, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    e = tl.load(e_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    f = (e * tl.sigmoid(e)).to(h_ptr.dtype.element_ty).to(tl.float32)
    tl.store(h_ptr + offsets, f * g, mask=mask)


@triton.jit
def _backward(de_ptr, dg_ptr, dh_ptr, e_ptr, g_ptr, n, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    dh = tl.load(dh_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    e = tl.load(e_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    s = 1.0 / (1.0 + tl.exp(-e))
    f = (e * s).to(e_ptr.dtype.element_ty).to(tl.float32)
    dhg = (dh * g).to(e_ptr.dtype.element_ty).to(tl.float32)
    tl.store(dg_ptr + offsets, dh * f, mask=mask)
    tl.store(de_ptr + offsets, dhg * s * (1.0 + e * (1.0 - s)), mask=mask)


class _TritonFastSwiglu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, e, g):
        e_, g_ = e.contiguous(), g.contiguous()
        h = torch.empty_like(e_)
        n = e_.numel()
        if n:
            with launching():
                _forward[(triton.cdiv(n, BLOCK),)](h, e_, g_, n, BLOCK_SIZE=BLOCK)
        ctx.save_for_backward(e_, g_)
        return h.view(e.shape)

    @staticmethod
    def backward(ctx, dh):
        e, g = ctx.saved_tensors
        dh = dh.contiguous()
        de, dg = torch.empty_like(e), torch.empty_like(g)
        n = e.numel()
        if n:
            with launching():
                _backward[(triton.cdiv(n, BLOCK),)](de, dg, dh, e, g, n, BLOCK_SIZE=BLOCK)
        return de, dg


def _triton_swiglu(e, g):
    if e.dtype == torch.float64:
        raise TypeError("a float32 kernel: no float64 path")
    return _TritonFastSwiglu.apply(e, g)


triton_fast_exp_swiglu = SimpleNamespace(swiglu=_triton_swiglu, NO_FLOAT64={"swiglu"})
triton_fast_exp_swiglu_declared_exact = SimpleNamespace(swiglu=_triton_swiglu, NO_FLOAT64={"swiglu"}, EXACT_MATHS=True)
