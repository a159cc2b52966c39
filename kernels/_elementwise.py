"""Plumbing shared by the gated element-wise activations, h = act(e) * g (SwiGLU, GeGLU).

An activation module writes two @triton.jit kernels with these signatures (extra constexprs after
BLOCK_SIZE pick a variant, e.g. GeLU's approximation):

    forward(h_ptr, e_ptr, g_ptr, n_elements, COMPUTE, BLOCK_SIZE, ...)
        h = act(e) * g
    backward(DW_ptr, e_ptr, g_ptr, h_ptr, df_ptr, de_ptr, n_elements, STORE_H, COMPUTE, BLOCK_SIZE, ...)
        df = DW * act(e), de = DW * g * act'(e), and h (if STORE_H); outputs may be the inputs' buffers

and bundles them as ``GatedKernels``. This module launches them: a flat 1-D grid of BLOCK_SIZE
elements per program with 64-bit offsets (tensors beyond 2**31 elements work), COMPUTE fp32 (fp64
for fp64 inputs). It provides the three entry points every such activation exports:

- ``raw_forward``: a new h, from contiguous e and g;
- ``raw_backward``: h, df, de written INTO DW, e, g (their version counters bumped, so autograd
  raises if anything had saved them), refused when the buffers share memory;
- ``autograd_op``: differentiable in e and g, any layout; its backward writes fresh tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from . import _checks
from ._launch import TL_COMPUTE, cdiv
from ._runtime import interpreted, launching

BLOCK_SIZE = 1024

if interpreted():
    @triton.jit
    def exp(x):
        # libdevice is not available to the interpreter; numpy's exp is accurate there.
        return tl.exp(x)
else:
    @triton.jit
    def exp(x):
        # libdevice's expf is what torch's CUDA kernels call; tl.exp is a faster, less exact approximation.
        return libdevice.exp(x)


@triton.jit
def flat_block(n_elements, BLOCK_SIZE: tl.constexpr):
    """This program's element offsets, 64-bit, and the mask of those inside the tensor."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    return offsets, offsets < n_elements


@dataclass(frozen=True)
class GatedKernels:
    """One activation's forward and backward kernels, and the constexprs that select its variant."""

    forward: triton.JITFunction
    backward: triton.JITFunction
    constexprs: dict[str, object] = field(default_factory=dict)


def validate(raw: bool, **tensors: torch.Tensor) -> None:
    """Float tensors of one dtype, shape and kernel device; the raw kernels also need contiguous memory."""
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


def _launch_flat(kernel: triton.JITFunction, constexprs: dict, e: torch.Tensor, *pointers, **launch_constexprs) -> None:
    """One flat launch over e's elements (computing in e's compute dtype); none for an empty e."""
    n = e.numel()
    if n == 0:
        return
    with launching():
        kernel[(cdiv(n, BLOCK_SIZE),)](*pointers, n, **launch_constexprs, **constexprs,
                                              COMPUTE=TL_COMPUTE[_checks.compute_dtype(e)], BLOCK_SIZE=BLOCK_SIZE)


def forward(kernels: GatedKernels, e: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    if not _same_dense_layout(e, g):
        e, g = e.contiguous(), g.contiguous()
    h = torch.empty_like(e)  # keeps e's (dense) strides, so the flat walk lines up
    _launch_flat(kernels.forward, kernels.constexprs, e, h, e, g)
    return h


def raw_forward(kernels: GatedKernels, e: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    validate(True, e=e, g=g)
    return forward(kernels, e, g)


def raw_backward(kernels: GatedKernels, DW: torch.Tensor, e: torch.Tensor, g: torch.Tensor):
    """h into DW, df into e, de into g; returns (DW, e, g). Buffers that share memory are refused:
    one element would receive two of the outputs."""
    validate(True, DW=DW, e=e, g=g)
    _checks.require_unaliased({"DW": DW, "e": e, "g": g}, {})
    if e.numel():
        _launch_flat(kernels.backward, kernels.constexprs, e, DW, e, g, DW, e, g, STORE_H=True)
        torch.autograd.graph.increment_version((DW, e, g))
    return DW, e, g


class GatedFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, e, g, kernels: GatedKernels):
        ctx.save_for_backward(e, g)
        ctx.kernels = kernels
        return forward(kernels, e, g)

    @staticmethod
    def backward(ctx, dh):
        e, g = ctx.saved_tensors
        if not _same_dense_layout(dh, e, g):
            dh, e, g = dh.contiguous(), e.contiguous(), g.contiguous()
        de, dg = torch.empty_like(e), torch.empty_like(g)
        # h_ptr is never written (STORE_H=False); dg receives df, the gradient of g.
        _launch_flat(ctx.kernels.backward, ctx.kernels.constexprs, e, dh, e, g, dg, dg, de, STORE_H=False)
        return de, dg, None


def autograd_op(kernels: GatedKernels, e: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    validate(False, e=e, g=g)
    return GatedFunction.apply(e, g, kernels)
