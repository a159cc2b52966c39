"""SwiGLU's element-wise middle, h = silu(e) * g, fused forward and backward (the seed's LoRA-MLP kernels).

With se = sigmoid(e) and everything in fp32 (fp64 for fp64 inputs), rounded like HF's eager ops:

    f  = e / (1 + exp(-e))            torch's silu formula, rounded to the dtype
    h  = f * g                        rounded
    df = dh * f                       gradient of g (the up branch), rounded
    de = (dh * g) * se * (1 + e * (1 - se))     gradient of e (the gate branch): dh * g rounded
                                                first, as autograd rounds silu's incoming gradient

Flat kernels over the elements with 64-bit offsets, launched by _elementwise (shared with GeGLU).

``swiglu_fg_kernel(e, g)`` and ``swiglu_DWf_DW_dfg_kernel(DW, e, g)`` are the raw kernels: the
latter writes h, df and de INTO DW, e and g (``CLOBBERS``), saving three allocations in a
hand-written MLP backward. ``swiglu(e, g)`` is the autograd op built on the same kernels; its
backward writes fresh tensors, so neither a second backward nor another user of e, g or dh loses
anything. Each is a wrapper around a ``kernel_oracle`` custom op of the same name (kernels/_library.py),
so torch.compile keeps it in its graph; ``swiglu``'s backward is the op ``swiglu_backward``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _elementwise
from ._elementwise import exp, flat_block
from ._library import calls, custom_op
from ._mlp_patch import GatedMLPPatch


@triton.jit
def _swiglu_forward_kernel(
    h_ptr, e_ptr, g_ptr,  # flat, same layout; h may be a fresh tensor
    n_elements,
    COMPUTE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    WIDE: tl.constexpr,  # 64-bit offsets (_elementwise.flat_launch)
    EVEN: tl.constexpr,  # blocks tile the tensor: no bounds test
):
    offsets, mask = flat_block(n_elements, BLOCK_SIZE, WIDE, EVEN)
    dtype: tl.constexpr = h_ptr.dtype.element_ty

    e = tl.load(e_ptr + offsets, mask=mask, other=0.0).to(COMPUTE)
    g = tl.load(g_ptr + offsets, mask=mask, other=0.0).to(COMPUTE)

    f = (e / (1.0 + exp(-e))).to(dtype).to(COMPUTE)
    tl.store(h_ptr + offsets, f * g, mask=mask)


@triton.jit
def _swiglu_backward_kernel(
    DW_ptr, e_ptr, g_ptr,  # inputs: incoming gradient dh, and the forward inputs
    h_ptr, df_ptr, de_ptr,  # outputs; the raw kernel passes DW, e, g themselves
    n_elements,
    STORE_H: tl.constexpr,  # the raw kernel also recomputes h for the down-projection's weight grad
    COMPUTE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    WIDE: tl.constexpr,  # 64-bit offsets (_elementwise.flat_launch)
    EVEN: tl.constexpr,  # blocks tile the tensor: no bounds test
):
    offsets, mask = flat_block(n_elements, BLOCK_SIZE, WIDE, EVEN)
    dtype: tl.constexpr = e_ptr.dtype.element_ty

    # Load everything before any store: outputs may alias the inputs element for element.
    dw = tl.load(DW_ptr + offsets, mask=mask, other=0.0).to(COMPUTE)
    e = tl.load(e_ptr + offsets, mask=mask, other=0.0).to(COMPUTE)
    g = tl.load(g_ptr + offsets, mask=mask, other=0.0).to(COMPUTE)

    se = 1.0 / (1.0 + exp(-e))
    f = (e / (1.0 + exp(-e))).to(dtype).to(COMPUTE)
    dwg = (dw * g).to(dtype).to(COMPUTE)
    de = dwg * se * (1.0 + e * (1.0 - se))

    if STORE_H:
        tl.store(h_ptr + offsets, f * g, mask=mask)
    tl.store(df_ptr + offsets, dw * f, mask=mask)
    tl.store(de_ptr + offsets, de, mask=mask)


SWIGLU = _elementwise.GatedKernels(_swiglu_forward_kernel, _swiglu_backward_kernel)


# --- the custom ops (kernels/_library.py) and their wrappers ---------------------------------------


@custom_op("swiglu")
def _swiglu_op(e: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return _elementwise.forward(SWIGLU, e, g)


@custom_op("swiglu_backward")
def _swiglu_backward_op(dh: torch.Tensor, e: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _elementwise.backward(SWIGLU, dh, e, g)


@custom_op("swiglu_fg_kernel")
def _fg_op(e: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return _elementwise.forward(SWIGLU, e, g)


@custom_op("swiglu_DWf_DW_dfg_kernel", mutates_args=("DW", "e", "g"))
def _DWf_DW_dfg_op(DW: torch.Tensor, e: torch.Tensor, g: torch.Tensor) -> None:
    _elementwise.raw_backward(SWIGLU, DW, e, g)


_elementwise.register_autograd_op(_swiglu_op, _swiglu_backward_op)
_elementwise.register_raw_ops(_fg_op, _DWf_DW_dfg_op)


@calls(_fg_op)
def swiglu_fg_kernel(e: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Raw forward: a new tensor h = silu(e) * g. e, g: same shape and dtype, contiguous.

    Outside autograd: with grad mode on, e or g requiring grad is refused (RuntimeError), since h
    would have no graph; call it under torch.no_grad(), or use ``swiglu``.
    """
    _elementwise.validate(True, e=e, g=g)
    _elementwise.require_outside_autograd("swiglu_fg_kernel", "kernels.swiglu", e=e, g=g)
    return _fg_op(e, g)


@calls(_DWf_DW_dfg_op)
def swiglu_DWf_DW_dfg_kernel(DW: torch.Tensor, e: torch.Tensor, g: torch.Tensor):
    """Raw backward of a LoRA MLP: writes h into DW, df into e and de into g; returns (DW, e, g).

    DW is the gradient reaching h. All three buffers are overwritten (``CLOBBERS``); their version
    counters are bumped, so autograd raises if anything had saved them for its own backward. They
    must not share memory (ValueError): one element would receive two of the outputs. With grad
    mode on, a leaf that requires grad (or a view of one) is refused, as torch's in-place ops refuse
    it (RuntimeError).
    """
    _elementwise.validate(True, DW=DW, e=e, g=g)
    _elementwise.require_writable("swiglu_DWf_DW_dfg_kernel", DW=DW, e=e, g=g)
    _DWf_DW_dfg_op(DW, e, g)
    return DW, e, g


@calls(_swiglu_op)
def swiglu(e: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """h = silu(e) * g as HF's LlamaMLP computes it; differentiable in e and g; any layout."""
    _elementwise.validate(False, e=e, g=g)
    return _elementwise.differentiable(_swiglu_op, SWIGLU, e, g)


def _silu_options(act_fn: torch.nn.Module) -> dict | None:
    """SwiGLU replaces torch's nn.SiLU and HF's SiLUActivation (ACT2FN["silu"]); it takes no options."""
    return {} if type(act_fn).__name__ in ("SiLU", "SiLUActivation") else None


MLP_PATCH = GatedMLPPatch("swiglu", swiglu, _silu_options)
