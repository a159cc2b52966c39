"""Plumbing shared by the gated element-wise activations, h = act(e) * g (SwiGLU, GeGLU).

An activation module writes two @triton.jit kernels with these signatures (extra constexprs after
BLOCK_SIZE pick a variant, e.g. GeLU's approximation):

    forward(h_ptr, e_ptr, g_ptr, n_elements, COMPUTE, BLOCK_SIZE, WIDE, EVEN, ...)
        h = act(e) * g
    backward(DW_ptr, e_ptr, g_ptr, h_ptr, df_ptr, de_ptr, n_elements, STORE_H, COMPUTE, BLOCK_SIZE,
             WIDE, EVEN, ...)
        df = DW * act(e), de = DW * g * act'(e), and h (if STORE_H); outputs may be the inputs' buffers

and bundles them as ``GatedKernels``, with their launch settings. This module launches them: a
flat 1-D grid of BLOCK_SIZE elements per program, offsets 64-bit only where 32 bits would overflow
(``flat_launch``: tensors beyond 2**31 elements work), COMPUTE fp32 (fp64 for fp64 inputs). It
provides what every such activation's custom ops (kernels/_library.py) are
made of, and the checks their wrappers run first:

- ``forward`` / ``backward``: the autograd op's two ops (a new h; new de and dg, any layout), with
  ``register_autograd_op`` giving them their fakes and the autograd formula; ``differentiable``
  calls the op under torch.compile and the same two functions through ``GatedFunction`` in eager
  mode (kernels/_library.py, Note [Eager autograd skips the dispatcher]);
- ``raw_backward``: h, df, de written INTO DW, e, g, the buffers refused when they share memory
  (the op's schema marks all three mutated, which bumps their version counters, so autograd raises
  if anything had saved them); ``register_raw_ops`` gives the raw forward and backward their fakes;
- ``validate``, ``require_outside_autograd`` (a raw forward refuses inputs that require grad while
  grad mode is on) and ``require_writable`` (a raw backward refuses to overwrite a leaf that
  requires grad, as torch's in-place ops do): docs/design.md §2.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from . import _checks
from ._launch import TL_COMPUTE, cdiv
from ._launcher import launch
from ._library import tracing
from ._runtime import interpreted, launching

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
def flat_block(n_elements, BLOCK_SIZE: tl.constexpr, WIDE: tl.constexpr, EVEN: tl.constexpr):
    """This program's element offsets and the mask of those inside the tensor (see flat_launch)."""
    if WIDE:
        start = tl.program_id(0).to(tl.int64) * BLOCK_SIZE
    else:
        start = tl.program_id(0) * BLOCK_SIZE
    offsets = start + tl.arange(0, BLOCK_SIZE)
    if EVEN:
        mask = tl.full([BLOCK_SIZE], True, tl.int1)  # a constant mask: the compiler drops it
    else:
        mask = offsets < n_elements
    return offsets, mask


def flat_launch(n: int, block_size: int) -> dict[str, bool]:
    """The constexprs that specialise flat_block to n elements, as torch.compile's kernels specialise
    on their static sizes: 32-bit offsets (WIDE=False) while every block, rounded up, ends below
    2**31, and no bounds test where blocks tile n exactly (EVEN). The kernels are memory-bound, but
    GeLU's backward spends most of its instructions on arithmetic; the two cut it from 331 to 311
    SASS instructions (sm_90, Triton 3.9)."""
    return {"WIDE": n > 2**31 - block_size, "EVEN": n % block_size == 0}


@dataclass(frozen=True)
class GatedKernels:
    """One activation's forward and backward kernels, the constexprs that select its variant, and
    their launch: 8 elements per thread by default, one 16-byte access per tensor in 16-bit dtypes
    (scripts/tune.py elementwise measures the settings against each other on a GPU)."""

    forward: triton.JITFunction
    backward: triton.JITFunction
    constexprs: dict[str, object] = field(default_factory=dict)
    block_size: int = 1024  # elements per program
    num_warps: int = 4


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


def _launch_flat(kernels: GatedKernels, kernel: triton.JITFunction, e: torch.Tensor, *pointers,
                 **launch_constexprs) -> None:
    """One flat launch of kernel (kernels' forward or backward) over e's elements, computing in e's
    compute dtype; none for an empty e."""
    n = e.numel()
    if n == 0:
        return
    block = kernels.block_size
    with launching():
        launch(kernel, (cdiv(n, block),), *pointers, n, **launch_constexprs, **kernels.constexprs,
               COMPUTE=TL_COMPUTE[_checks.compute_dtype(e)], BLOCK_SIZE=block, **flat_launch(n, block),
               num_warps=kernels.num_warps)


def _flat_walk(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tensors as the kernels walk them: as they are when a flat walk over storage visits
    matching elements of each, else contiguous copies. The fakes call it too (on fake tensors), so
    the fake outputs have the real ones' strides."""
    return tensors if _same_dense_layout(*tensors) else tuple(t.contiguous() for t in tensors)


def forward(kernels: GatedKernels, e: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """A new h (laid out like e where e and g line up, else contiguous)."""
    e, g = _flat_walk(e, g)
    h = torch.empty_like(e)  # keeps e's (dense) strides, so the flat walk lines up
    _launch_flat(kernels, kernels.forward, e, h, e, g)
    return h


def backward(kernels: GatedKernels, dh: torch.Tensor, e: torch.Tensor, g: torch.Tensor):
    """(de, dg), new tensors: the incoming gradient and the saved inputs are only read."""
    dh, e, g = _flat_walk(dh, e, g)
    de, dg = torch.empty_like(e), torch.empty_like(g)
    # h_ptr is never written (STORE_H=False); dg receives df, the gradient of g.
    _launch_flat(kernels, kernels.backward, e, dh, e, g, dg, dg, de, STORE_H=False)
    return de, dg


def raw_backward(kernels: GatedKernels, DW: torch.Tensor, e: torch.Tensor, g: torch.Tensor) -> None:
    """h into DW, df into e, de into g. Buffers that share memory are refused here, in the op, where
    their addresses are real (Note [What the wrapper checks, and what the op checks]): one element
    would receive two of the outputs."""
    _checks.require_unaliased({"DW": DW, "e": e, "g": g}, {})
    if e.numel():
        _launch_flat(kernels, kernels.backward, e, DW, e, g, DW, e, g, STORE_H=True)


# --- fakes and autograd formulas of the ops -------------------------------------------------------


def _forward_fake(e: torch.Tensor, g: torch.Tensor, *options) -> torch.Tensor:
    e, g = _flat_walk(e, g)
    return torch.empty_like(e)


def _backward_fake(dh: torch.Tensor, e: torch.Tensor, g: torch.Tensor, *options):
    dh, e, g = _flat_walk(dh, e, g)
    return torch.empty_like(e), torch.empty_like(g)


def _writes_in_place_fake(DW: torch.Tensor, e: torch.Tensor, g: torch.Tensor) -> None:
    return None  # the outputs are the mutated buffers themselves: nothing new to describe


def register_autograd_op(op, backward_op) -> None:
    """``op(e, g, *options) -> h`` and ``backward_op(dh, e, g, *options) -> (de, dg)``: their fakes,
    and op's autograd formula, which saves e and g and calls backward_op (an op too, so that
    AOTAutograd traces the backward as one node instead of into the launch)."""
    op.register_fake(_forward_fake)
    backward_op.register_fake(_backward_fake)

    def setup_context(ctx, inputs, output):
        e, g, *options = inputs
        ctx.save_for_backward(e, g)
        ctx.options = tuple(options)

    def backward_formula(ctx, dh):
        e, g = ctx.saved_tensors
        de, dg = backward_op(dh, e, g, *ctx.options)
        return (de, dg, *(None for _ in ctx.options))

    op.register_autograd(backward_formula, setup_context=setup_context)


def register_raw_ops(forward_op, backward_op) -> None:
    """The raw kernels' fakes. They get no autograd formula: they are outside autograd by contract,
    and their wrappers refuse what would need one (``require_outside_autograd``)."""
    forward_op.register_fake(_forward_fake)
    backward_op.register_fake(_writes_in_place_fake)


class GatedFunction(torch.autograd.Function):
    """The autograd op in eager mode (kernels/_library.py, Note [Eager autograd skips the dispatcher]):
    the same forward and backward as the ops, without the dispatcher's Python layers."""

    @staticmethod
    def forward(ctx, e, g, kernels: GatedKernels):
        ctx.save_for_backward(e, g)
        ctx.kernels = kernels
        return forward(kernels, e, g)

    @staticmethod
    def backward(ctx, dh):
        e, g = ctx.saved_tensors
        de, dg = backward(ctx.kernels, dh, e, g)
        return de, dg, None


def differentiable(op, kernels: GatedKernels, e: torch.Tensor, g: torch.Tensor, *options) -> torch.Tensor:
    """h, recorded by autograd: the custom op where torch.compile traces, ``GatedFunction`` in eager mode."""
    return op(e, g, *options) if tracing() else GatedFunction.apply(e, g, kernels)


# --- the wrappers' checks (docs/design.md §2) ------------------------------------------------------


def require_outside_autograd(kernel: str, differentiable: str, **tensors: torch.Tensor) -> None:
    """A raw forward's result has no graph: with grad mode on, an input that requires grad would
    silently receive no gradient through it. Refused as torch refuses what it cannot differentiate
    (``out=`` ops, ``numpy()``): a RuntimeError naming the way out."""
    if not torch.is_grad_enabled():
        return
    wanting = [name for name, t in tensors.items() if t.requires_grad]
    if wanting:
        names = " and ".join(wanting)
        raise RuntimeError(
            f"{kernel} is a raw kernel outside autograd, and {names} require{'s' if len(wanting) == 1 else ''} grad: "
            f"its result would have no graph, so {names} would silently get no gradient through it. Call it "
            f"under torch.no_grad() (or on {wanting[0]}.detach()) where that is meant, or use {differentiable}, "
            "which is differentiable")


def require_writable(kernel: str, **buffers: torch.Tensor) -> None:
    """A raw backward overwrites its buffers outside autograd. With grad mode on, torch's in-place
    ops refuse a leaf that requires grad, or a view of one (its .grad would belong to values that
    are gone); so does this, with torch's error class and words. A non-leaf is allowed, as torch
    allows it: the op's version bump makes anything that saved it raise at backward."""
    if not torch.is_grad_enabled():
        return
    for name, t in buffers.items():
        if not t.requires_grad:
            continue
        if t.is_leaf:
            what = "a leaf Variable"
        elif t._is_view() and t._base.is_leaf:
            what = "a view of a leaf Variable"
        else:
            continue
        raise RuntimeError(f"{kernel} writes its results into {name} in place, but {name} is {what} that requires "
                           f"grad (torch's in-place ops refuse it too: {what} that requires grad is being used in "
                           f"an in-place operation). Pass {name}.detach().clone(), or call it under torch.no_grad()")
