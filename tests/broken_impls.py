"""Deliberately broken implementations: the harness must catch each one (and pass the correct ones).

Each is an implementation object in the design.md §2 sense, loadable as
``--impl tests.broken_impls:NAME``. Every bug here is one that real kernels have shipped with.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

import kernels
from oracle import reference as R

# --- the differential verdict ----------------------------------------------------------------------


def _rms_norm_skipping_last_row(X, W, eps, gemma=False):
    Y = R.rms_norm(X, W, eps, gemma)
    out = torch.empty(Y.shape, dtype=Y.dtype, device=Y.device)  # poisoned with NaN by the harness
    out[..., :-1, :] = Y[..., :-1, :]
    return out + 0 * Y  # keep Y's graph so backward still reaches X and W


# The forward skips the last row (an off-by-one grid); a one-row X loses its only row.
skips_last_row = SimpleNamespace(rms_norm=_rms_norm_skipping_last_row)

# RMSNorm that ignores eps: right for ordinary rows, wrong where eps matters (tiny or zero rows).
ignores_eps = SimpleNamespace(rms_norm=lambda X, W, eps, gemma=False: R.rms_norm(X, W, 0.0, gemma))


class _RopeWrongSignBackward(torch.autograd.Function):
    """RoPE whose backward rotates the gradient the wrong way (sin not negated)."""

    @staticmethod
    def forward(ctx, Q, K, cos, sin, position_ids):
        ctx.save_for_backward(cos, sin, position_ids)
        return R.rope(Q, K, cos, sin, position_ids)

    @staticmethod
    def backward(ctx, dQ, dK):
        cos, sin, position_ids = ctx.saved_tensors
        return (*R.rope(dQ, dK, cos, sin, position_ids), None, None, None)


wrong_sign = SimpleNamespace(rope=lambda Q, K, cos, sin, position_ids=None:
                             _RopeWrongSignBackward.apply(Q, K, cos, sin, position_ids))


class _SwigluMissingFactor(torch.autograd.Function):
    """SwiGLU whose de forgets the (1 + e * (1 - sigmoid(e))) factor of silu's derivative."""

    @staticmethod
    def forward(ctx, e, g):
        ctx.save_for_backward(e, g)
        return R.swiglu(e, g)

    @staticmethod
    def backward(ctx, dh):
        e, g = ctx.saved_tensors
        return dh * g * torch.sigmoid(e), dh * torch.nn.functional.silu(e)


swiglu_wrong_derivative = SimpleNamespace(swiglu=lambda e, g: _SwigluMissingFactor.apply(e, g))


def _backward_returning_new_tensors(DW, e, g):
    return R.swiglu_lora_backward(DW, e, g)  # right values, but DW, e, g do not hold them


raw_backward_not_in_place = SimpleNamespace(swiglu_DWf_DW_dfg_kernel=_backward_returning_new_tensors,
                                            CLOBBERS={"swiglu_DWf_DW_dfg_kernel": {"DW", "e", "g"}})

only_swiglu = SimpleNamespace(swiglu=kernels.swiglu)


# --- aliasing checks ------------------------------------------------------------------------------


def _rms_norm_touching_input(X, W, eps, gemma=False):
    Y = kernels.rms_norm(X, W, eps, gemma)
    X.data[..., 0] += 1.0  # scribbles on an input it does not declare in CLOBBERS
    return Y


modifies_undeclared_input = SimpleNamespace(rms_norm=_rms_norm_touching_input)

# The kernels' own opt-in mode: backward writes dX into dY. Unsafe when dY is shared (a residual).
kernels_writing_dx_into_dy = SimpleNamespace(
    rms_norm=lambda X, W, eps, gemma=False: kernels.rms_norm(X, W, eps, gemma, write_dx_into_dy=True))


class _SwigluOverwritingSaved(torch.autograd.Function):
    """Backward writes de, dg into the saved e, g (Liger-Kernel's memory saving), so a second
    backward, or anyone else holding e or g, reads gradients instead of activations."""

    @staticmethod
    def forward(ctx, e, g):
        ctx.save_for_backward(e, g)
        return R.swiglu(e.detach(), g.detach())

    @staticmethod
    def backward(ctx, dh):
        e, g = ctx.saved_tensors
        h, dg, de = R.swiglu_lora_backward(dh, e, g)
        e.data.copy_(de)
        g.data.copy_(dg)
        return e.data, g.data


overwrites_saved_inputs = SimpleNamespace(swiglu=lambda e, g: _SwigluOverwritingSaved.apply(e, g))


class _RmsNormOneStride(torch.autograd.Function):
    """Backward reads dY with X's (dense) strides, the Triton tutorial's one-stride-for-all bug:
    right for a dense gradient, out of bounds for .sum()'s stride-0 one."""

    @staticmethod
    def forward(ctx, X, W, eps, gemma):
        ctx.save_for_backward(X, W)
        ctx.eps, ctx.gemma = eps, gemma
        return R.rms_norm(X.detach(), W.detach(), eps, gemma)

    @staticmethod
    def backward(ctx, dY):
        X, W = ctx.saved_tensors
        as_if_dense = dY.as_strided(dY.shape, torch.empty(dY.shape).stride())
        with torch.enable_grad():
            x, w = X.detach().requires_grad_(), W.detach().requires_grad_()
            dX, dW = torch.autograd.grad(R.rms_norm(x, w, ctx.eps, ctx.gemma), (x, w), as_if_dense)
        return dX, dW, None, None


assumes_dense_gradient = SimpleNamespace(rms_norm=lambda X, W, eps, gemma=False:
                                         _RmsNormOneStride.apply(X, W, eps, gemma))


def _rope_ignoring_strides(Q, K, cos, sin, position_ids=None):
    """Rotates in place as if Q and K were contiguous: from a fused QKV it writes over K and V."""
    q_out, k_out = R.rope(Q.detach(), K.detach(), cos, sin, position_ids)
    for target, value in ((Q, q_out), (K, k_out)):
        dense = torch.empty(0, dtype=target.dtype, device=target.device)
        dense.set_(target.untyped_storage(), target.storage_offset(), target.shape)
        dense.copy_(value)
    return R.rope(Q, K, cos, sin, position_ids)


ignores_strides = SimpleNamespace(rope=_rope_ignoring_strides, CLOBBERS={"rope": {"Q", "K"}})


def _fg_writing_past_the_end(e, g):
    h = torch.empty_like(e)
    h.copy_(R.swiglu(e, g))
    torch.as_strided(h, (h.numel() + 1,), (1,))[-1] = 0.0  # one element past the end
    return h


writes_past_the_end = SimpleNamespace(swiglu_fg_kernel=_fg_writing_past_the_end)


def _fg_leaving_last_unwritten(e, g):
    h = torch.empty(e.shape, dtype=e.dtype, device=e.device)
    flat_h, flat = h.view(-1), R.swiglu(e, g).reshape(-1)
    flat_h[:-1] = flat[:-1]
    return h


leaves_last_unwritten = SimpleNamespace(swiglu_fg_kernel=_fg_leaving_last_unwritten)


def _rope_in_place_untracked(Q, K, cos, sin, position_ids=None):
    """Rotates Q and K in place behind autograd's back (no mark_dirty, no version bump)."""
    q_out, k_out = R.rope(Q, K, cos, sin, position_ids)
    Q.data.copy_(q_out.detach())
    K.data.copy_(k_out.detach())
    return q_out, k_out


untracked_in_place = SimpleNamespace(rope=_rope_in_place_untracked, CLOBBERS={"rope": {"Q", "K"}})


def _raw_backward_untracked(DW, e, g):
    h, df, de = R.swiglu_lora_backward(DW, e, g)
    for buffer, value in ((DW, h), (e, df), (g, de)):
        buffer.data.copy_(value)  # .data: writes without bumping the version counter
    return DW, e, g


raw_backward_untracked = SimpleNamespace(swiglu_DWf_DW_dfg_kernel=_raw_backward_untracked,
                                         CLOBBERS={"swiglu_DWf_DW_dfg_kernel": {"DW", "e", "g"}})


# --- the report's gate ----------------------------------------------------------------------------


def _rms_norm_extra_rounding(X, W, eps, gemma=False):
    """Our kernel plus one extra rounding step: the output passes through bfloat16 once."""
    Y = kernels.rms_norm(X, W, eps, gemma)
    return Y.to(torch.bfloat16).to(Y.dtype) if Y.dtype != torch.bfloat16 else Y


extra_rounding = SimpleNamespace(rms_norm=_rms_norm_extra_rounding, rope=kernels.rope, swiglu=kernels.swiglu,
                                 swiglu_fg_kernel=kernels.swiglu_fg_kernel,
                                 swiglu_DWf_DW_dfg_kernel=kernels.swiglu_DWf_DW_dfg_kernel,
                                 CLOBBERS=kernels.CLOBBERS)


def _rms_norm_crashing_on_wide_rows(X, W, eps, gemma=False):
    """Kills its process on rows wider than 1000 (a segfault, as an out-of-bounds access under the
    interpreter would); right otherwise. The report must record one crash and carry on."""
    if X.shape[-1] > 1000:
        import os
        import signal

        os.kill(os.getpid(), signal.SIGSEGV)
    return kernels.rms_norm(X, W, eps, gemma)


crashes_on_wide_rows = SimpleNamespace(rms_norm=_rms_norm_crashing_on_wide_rows)
