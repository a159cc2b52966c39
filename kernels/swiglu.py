"""SwiGLU's element-wise middle, h = silu(e) * g, fused forward and backward (the seed's LoRA-MLP kernels).

With se = sigmoid(e) and everything in fp32 (fp64 for fp64 inputs), rounded like HF's eager ops:

    f  = e / (1 + exp(-e))            torch's silu formula, rounded to the dtype
    h  = f * g                        rounded
    df = dh * f                       gradient of g (the up branch), rounded
    de = (dh * g) * se * (1 + e * (1 - se))     gradient of e (the gate branch): dh * g rounded
                                                first, as autograd rounds silu's incoming gradient

Flat kernels over the elements with 64-bit offsets, so tensors beyond 2**31 elements work.

``swiglu_fg_kernel(e, g)`` and ``swiglu_DWf_DW_dfg_kernel(DW, e, g)`` are the raw kernels: the
latter writes h, df and de INTO DW, e and g (``CLOBBERS``), saving three allocations in a
hand-written MLP backward. ``swiglu(e, g)`` is the autograd op built on the same kernels; its
backward writes fresh tensors, so neither a second backward nor another user of e, g or dh loses
anything.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from . import _checks
from ._runtime import interpreted, launching

BLOCK_SIZE = 1024

if interpreted():
    @triton.jit
    def _exp(x):
        # libdevice is not available to the interpreter; numpy's exp is accurate there.
        return tl.exp(x)
else:
    @triton.jit
    def _exp(x):
        # libdevice's expf is what torch's CUDA silu calls; tl.exp is a faster, less exact approximation.
        return libdevice.exp(x)


@triton.jit
def _swiglu_forward_kernel(
    h_ptr, e_ptr, g_ptr,  # flat, same layout; h may be a fresh tensor
    n_elements,
    COMPUTE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    dtype: tl.constexpr = h_ptr.dtype.element_ty

    e = tl.load(e_ptr + offsets, mask=mask, other=0.0).to(COMPUTE)
    g = tl.load(g_ptr + offsets, mask=mask, other=0.0).to(COMPUTE)

    f = (e / (1.0 + _exp(-e))).to(dtype).to(COMPUTE)
    tl.store(h_ptr + offsets, f * g, mask=mask)


@triton.jit
def _swiglu_backward_kernel(
    DW_ptr, e_ptr, g_ptr,  # inputs: incoming gradient dh, and the forward inputs
    h_ptr, df_ptr, de_ptr,  # outputs; the raw kernel passes DW, e, g themselves
    n_elements,
    STORE_H: tl.constexpr,  # the raw kernel also recomputes h for the down-projection's weight grad
    COMPUTE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    dtype: tl.constexpr = e_ptr.dtype.element_ty

    # Load everything before any store: outputs may alias the inputs element for element.
    dw = tl.load(DW_ptr + offsets, mask=mask, other=0.0).to(COMPUTE)
    e = tl.load(e_ptr + offsets, mask=mask, other=0.0).to(COMPUTE)
    g = tl.load(g_ptr + offsets, mask=mask, other=0.0).to(COMPUTE)

    se = 1.0 / (1.0 + _exp(-e))
    f = (e / (1.0 + _exp(-e))).to(dtype).to(COMPUTE)
    dwg = (dw * g).to(dtype).to(COMPUTE)
    de = dwg * se * (1.0 + e * (1.0 - se))

    if STORE_H:
        tl.store(h_ptr + offsets, f * g, mask=mask)
    tl.store(df_ptr + offsets, dw * f, mask=mask)
    tl.store(de_ptr + offsets, de, mask=mask)


_TL = {torch.float32: tl.float32, torch.float64: tl.float64}


def _grid(n: int) -> tuple[int]:
    return (triton.cdiv(n, BLOCK_SIZE),)


def _validate(raw: bool, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        _checks.require_float(name, t)
    _checks.require_same_dtype(**tensors)
    _checks.require_kernel_device(**tensors)
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"shapes must match: {shapes}")
    if raw:
        for name, t in tensors.items():
            if not t.is_contiguous():
                raise ValueError(f"the raw kernels work on flat memory: {name} must be contiguous "
                                 f"(strides {t.stride()}); pass {name}.contiguous()")


def _same_dense_layout(*tensors: torch.Tensor) -> bool:
    """True if a flat walk over storage visits matching elements of every tensor."""
    first = tensors[0]
    return all(t.stride() == first.stride() for t in tensors) and \
        torch._debug_has_internal_overlap(first) == 0 and _is_dense(first)


def _is_dense(t: torch.Tensor) -> bool:
    """Elements fill a block of memory of exactly numel() slots (any dim order)."""
    span = 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()) if size > 0)
    return t.numel() == 0 or span == t.numel()


def _forward(e: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    if not _same_dense_layout(e, g):
        e, g = e.contiguous(), g.contiguous()
    h = torch.empty_like(e)  # keeps e's (dense) strides, so the flat walk lines up
    n = e.numel()
    if n:
        with launching():
            _swiglu_forward_kernel[_grid(n)](h, e, g, n, COMPUTE=_TL[_checks.compute_dtype(e)], BLOCK_SIZE=BLOCK_SIZE)
    return h


@torch.compiler.disable
def swiglu_fg_kernel(e: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Raw forward: a new tensor h = silu(e) * g. e, g: same shape and dtype, contiguous."""
    _validate(True, e=e, g=g)
    return _forward(e, g)


@torch.compiler.disable
def swiglu_DWf_DW_dfg_kernel(DW: torch.Tensor, e: torch.Tensor, g: torch.Tensor):
    """Raw backward of a LoRA MLP: writes h into DW, df into e and de into g; returns (DW, e, g).

    DW is the gradient reaching h. All three buffers are overwritten (``CLOBBERS``); their version
    counters are bumped, so autograd raises if anything had saved them for its own backward. They
    must not share memory (ValueError): one element would receive two of the outputs.
    """
    _validate(True, DW=DW, e=e, g=g)
    _checks.require_unaliased({"DW": DW, "e": e, "g": g}, {})
    n = e.numel()
    if n:
        with launching():
            _swiglu_backward_kernel[_grid(n)](DW, e, g, DW, e, g, n, STORE_H=True,
                                              COMPUTE=_TL[_checks.compute_dtype(e)], BLOCK_SIZE=BLOCK_SIZE)
        torch.autograd.graph.increment_version((DW, e, g))
    return DW, e, g


class SwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, e, g):
        ctx.save_for_backward(e, g)
        return _forward(e, g)

    @staticmethod
    def backward(ctx, dh):
        e, g = ctx.saved_tensors
        if not _same_dense_layout(dh, e, g):
            dh, e, g = dh.contiguous(), e.contiguous(), g.contiguous()
        de, dg = torch.empty_like(e), torch.empty_like(g)
        n = e.numel()
        if n:
            # h_ptr is never written (STORE_H=False); dg receives df, the gradient of g.
            with launching():
                _swiglu_backward_kernel[_grid(n)](dh, e, g, dg, dg, de, n, STORE_H=False,
                                                  COMPUTE=_TL[_checks.compute_dtype(e)], BLOCK_SIZE=BLOCK_SIZE)
        return de, dg


@torch.compiler.disable
def swiglu(e: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """h = silu(e) * g as HF's LlamaMLP computes it; differentiable in e and g; any layout."""
    _validate(False, e=e, g=g)
    return SwiGLUFunction.apply(e, g)
