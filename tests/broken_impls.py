"""Deliberately broken implementations: the harness must catch each one (and pass the correct ones).

Each is an implementation object in the docs/design.md §2 sense, loadable as
``--impl tests.broken_impls:NAME``. Every bug here is one that real kernels have shipped with.
"""

from __future__ import annotations

import math
import signal
import time
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn.functional as F

import kernels  # before triton: it picks the interpreter on a machine without a GPU
import triton
import triton.language as tl
from oracle.declare.registry import SPECS
from oracle.ops import rms_norm as norm_ops, rope as rope_ops, swiglu as swiglu_ops

# --- the differential verdict ----------------------------------------------------------------------


def _rms_norm_skipping_last_row(X, W, eps, gemma=False):
    Y = norm_ops.rms_norm(X, W, eps, gemma)
    out = torch.empty(Y.shape, dtype=Y.dtype, device=Y.device)  # poisoned with NaN by the harness
    out[..., :-1, :] = Y[..., :-1, :]
    return out + 0 * Y  # keep Y's graph so backward still reaches X and W


# The forward skips the last row (an off-by-one grid); a one-row X loses its only row.
skips_last_row = SimpleNamespace(rms_norm=_rms_norm_skipping_last_row)

# RMSNorm that ignores eps: right for ordinary rows, wrong where eps matters (tiny or zero rows).
ignores_eps = SimpleNamespace(rms_norm=lambda X, W, eps, gemma=False: norm_ops.rms_norm(X, W, 0.0, gemma))


class _RopeWrongSignBackward(torch.autograd.Function):
    """RoPE whose backward rotates the gradient the wrong way (sin not negated)."""

    @staticmethod
    def forward(ctx, Q, K, cos, sin, position_ids):
        ctx.save_for_backward(cos, sin, position_ids)
        return rope_ops.rope(Q, K, cos, sin, position_ids)

    @staticmethod
    def backward(ctx, dQ, dK):
        cos, sin, position_ids = ctx.saved_tensors
        return (*rope_ops.rope(dQ, dK, cos, sin, position_ids), None, None, None)


wrong_sign = SimpleNamespace(rope=lambda Q, K, cos, sin, position_ids=None:
                             _RopeWrongSignBackward.apply(Q, K, cos, sin, position_ids))


class _SwigluMissingFactor(torch.autograd.Function):
    """SwiGLU whose de forgets the (1 + e * (1 - sigmoid(e))) factor of silu's derivative."""

    @staticmethod
    def forward(ctx, e, g):
        ctx.save_for_backward(e, g)
        return swiglu_ops.swiglu(e, g)

    @staticmethod
    def backward(ctx, dh):
        e, g = ctx.saved_tensors
        return dh * g * torch.sigmoid(e), dh * torch.nn.functional.silu(e)


swiglu_wrong_derivative = SimpleNamespace(swiglu=lambda e, g: _SwigluMissingFactor.apply(e, g))


def _backward_returning_new_tensors(DW, e, g):
    return swiglu_ops.swiglu_lora_backward(DW, e, g)  # right values, but DW, e, g do not hold them


raw_backward_not_in_place = SimpleNamespace(swiglu_DWf_DW_dfg_kernel=_backward_returning_new_tensors,
                                            CLOBBERS={"swiglu_DWf_DW_dfg_kernel": {"DW", "e", "g"}})

# Not a bug: the same fresh tensors with nothing declared in CLOBBERS is a valid raw backward.
raw_backward_fresh_tensors = SimpleNamespace(swiglu_DWf_DW_dfg_kernel=_backward_returning_new_tensors)

only_swiglu = SimpleNamespace(swiglu=kernels.swiglu)

# Misnamed: "rmsnorm" is not the contract's "rms_norm" (the pytest plugin fails the session, naming it).
misnamed_rms_norm = SimpleNamespace(rmsnorm=kernels.rms_norm, rope=kernels.rope)

# A partial implementation that says what it lacks, and why.
declares_what_it_lacks = SimpleNamespace(rope=kernels.rope, CLOBBERS={"rope": kernels.CLOBBERS["rope"]},
                                         LACKING={op: "not written yet" for op in SPECS if op != "rope"})


class _RmsNormFailingInFloat64(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X, W, eps, gemma):
        return kernels.rms_norm(X, W, eps, gemma).detach()

    @staticmethod
    def backward(ctx, dY):
        raise TypeError("accumulator dtype mismatch")


# A backward that raises a TypeError mentioning "dtype": a failure, never a skip of gradcheck.
backward_type_error = SimpleNamespace(rms_norm=lambda X, W, eps, gemma=False:
                                      _RmsNormFailingInFloat64.apply(X, W, eps, gemma))
# The same, declared: the implementation has no float64 path for rms_norm; only then is it skipped.
declares_no_float64 = SimpleNamespace(rms_norm=backward_type_error.rms_norm, NO_FLOAT64={"rms_norm"})


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
        return swiglu_ops.swiglu(e.detach(), g.detach())

    @staticmethod
    def backward(ctx, dh):
        e, g = ctx.saved_tensors
        h, dg, de = swiglu_ops.swiglu_lora_backward(dh, e, g)
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
        return norm_ops.rms_norm(X.detach(), W.detach(), eps, gemma)

    @staticmethod
    def backward(ctx, dY):
        X, W = ctx.saved_tensors
        as_if_dense = dY.as_strided(dY.shape, torch.empty(dY.shape).stride())
        with torch.enable_grad():
            x, w = X.detach().requires_grad_(), W.detach().requires_grad_()
            dX, dW = torch.autograd.grad(norm_ops.rms_norm(x, w, ctx.eps, ctx.gemma), (x, w), as_if_dense)
        return dX, dW, None, None


assumes_dense_gradient = SimpleNamespace(rms_norm=lambda X, W, eps, gemma=False:
                                         _RmsNormOneStride.apply(X, W, eps, gemma))


def _rope_ignoring_strides(Q, K, cos, sin, position_ids=None):
    """Rotates in place as if Q and K were contiguous: from a fused QKV it writes over K and V."""
    q_out, k_out = rope_ops.rope(Q.detach(), K.detach(), cos, sin, position_ids)
    for target, value in ((Q, q_out), (K, k_out)):
        dense = torch.empty(0, dtype=target.dtype, device=target.device)
        dense.set_(target.untyped_storage(), target.storage_offset(), target.shape)
        dense.copy_(value)
    return rope_ops.rope(Q, K, cos, sin, position_ids)


ignores_strides = SimpleNamespace(rope=_rope_ignoring_strides, CLOBBERS={"rope": {"Q", "K"}})


def _fg_writing_past_the_end(e, g):
    h = torch.empty_like(e)
    h.copy_(swiglu_ops.swiglu(e, g))
    torch.as_strided(h, (h.numel() + 1,), (1,))[-1] = 0.0  # one element past the end
    return h


writes_past_the_end = SimpleNamespace(swiglu_fg_kernel=_fg_writing_past_the_end)


def _fg_leaving_last_unwritten(e, g):
    h = torch.empty(e.shape, dtype=e.dtype, device=e.device)
    flat_h, flat = h.view(-1), swiglu_ops.swiglu(e, g).reshape(-1)
    flat_h[:-1] = flat[:-1]
    return h


leaves_last_unwritten = SimpleNamespace(swiglu_fg_kernel=_fg_leaving_last_unwritten)


def _rope_in_place_untracked(Q, K, cos, sin, position_ids=None):
    """Rotates Q and K in place behind autograd's back (no mark_dirty, no version bump)."""
    q_out, k_out = rope_ops.rope(Q, K, cos, sin, position_ids)
    Q.data.copy_(q_out.detach())
    K.data.copy_(k_out.detach())
    return q_out, k_out


untracked_in_place = SimpleNamespace(rope=_rope_in_place_untracked, CLOBBERS={"rope": {"Q", "K"}})


def _raw_backward_untracked(DW, e, g):
    h, df, de = swiglu_ops.swiglu_lora_backward(DW, e, g)
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

        os.kill(os.getpid(), signal.SIGSEGV)
    return kernels.rms_norm(X, W, eps, gemma)


crashes_on_wide_rows = SimpleNamespace(rms_norm=_rms_norm_crashing_on_wide_rows)


def _rms_norm_hanging_on_wide_rows(X, W, eps, gemma=False):
    """Never returns on rows wider than 1000 (a loop in Python, as the interpreter runs kernels)."""
    while X.shape[-1] > 1000:
        time.sleep(0.01)
    return kernels.rms_norm(X, W, eps, gemma)


hangs_on_wide_rows = SimpleNamespace(rms_norm=_rms_norm_hanging_on_wide_rows)


def _rms_norm_stuck_on_wide_rows(X, W, eps, gemma=False):
    """Never returns on rows wider than 1000, deaf to signals (as a wait on a spinning GPU kernel)."""
    if X.shape[-1] > 1000:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(3600)
    return kernels.rms_norm(X, W, eps, gemma)


stuck_on_wide_rows = SimpleNamespace(rms_norm=_rms_norm_stuck_on_wide_rows)


@triton.jit
def _zero_kernel(ptr, start, count, BLOCK: tl.constexpr):
    offsets = start + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(ptr + offsets, tl.zeros((BLOCK,), dtype=ptr.dtype.element_ty), mask=offsets < start + count)


def _rope_running_past_the_last_head_group(Q, K, cos, sin, position_ids=None, group=8):
    """Right values, then a head loop that runs one whole group of heads past the last one: a raw
    store of group x seq x head_dim elements beyond the end of Q's memory (no bounds checks on the
    CPU interpreter: unguarded, that corrupts the host heap)."""
    Q, K = kernels.rope(Q, K, cos, sin, position_ids)
    span = 1 + sum((size - 1) * stride for size, stride in zip(Q.shape, Q.stride()))
    count = group * Q.shape[2] * Q.shape[3]
    _zero_kernel[(triton.cdiv(count, 256),)](Q, span, count, BLOCK=256)
    return Q, K


rope_overruns_head_group = SimpleNamespace(rope=_rope_running_past_the_last_head_group, CLOBBERS=kernels.CLOBBERS)


# --- the catalogue: realistic numerical bugs, one op each -----------------------------------------
#
# Each object below breaks exactly one op of the contract and only numerically: no writes into its
# inputs (the raw backwards write only into the DW, e, g they declare in CLOBBERS, as the contract
# has them), no outputs aliasing inputs otherwise, HF's output dtypes and shapes, autograd intact.
# CATALOGUE (at the end of the file) says which op, in which dtypes, and when each one shows.


def _rms_norm_epilogue(X, W, normed, gemma):
    """HF's last step around an fp32 ``normed``: Llama rounds then scales by W, Gemma scales by 1 + W."""
    if gemma:
        return (normed * (1.0 + W.float())).to(X.dtype)
    return W * normed.to(X.dtype)


def _rms_norm_with(normalise):
    """An rms_norm whose fp32 normalisation of X is ``normalise(h, eps)``; autograd gives the backward."""
    def rms_norm(X, W, eps, gemma=False):
        return _rms_norm_epilogue(X, W, normalise(X.float(), eps), gemma)

    return rms_norm


def _compute_of(X):
    """float32, or float64 for float64 inputs, as the contract computes: a bug below breaks one thing,
    and a float64 input computed in float32 would be a second (the float64 check sees it)."""
    return torch.float64 if X.dtype == torch.float64 else torch.float32


class _RmsNormHandBackward(torch.autograd.Function):
    """HF's forward, and a backward ``backward_fn(X, W, dY, eps, gemma) -> (dX, dW)`` written by hand."""

    @staticmethod
    def forward(ctx, X, W, eps, gemma, backward_fn):
        ctx.save_for_backward(X, W)
        ctx.eps, ctx.gemma, ctx.backward_fn = eps, gemma, backward_fn
        return norm_ops.rms_norm(X, W, eps, gemma, compute=_compute_of(X))

    @staticmethod
    def backward(ctx, dY):
        X, W = ctx.saved_tensors
        dX, dW = ctx.backward_fn(X, W, dY, ctx.eps, ctx.gemma)
        return dX, dW, None, None, None


def _rms_norm_with_backward(backward_fn):
    return lambda X, W, eps, gemma=False: _RmsNormHandBackward.apply(X, W, eps, gemma, backward_fn)


def _rms_norm_backward_terms(X, W, dY, eps, gemma):
    """The fp32 rows (fp64 for fp64 inputs) a closed-form RMSNorm backward works on: (r, normed,
    g = dL/dnormed, dW per row)."""
    n, compute = X.shape[-1], _compute_of(X)
    h, dy = X.reshape(-1, n).to(compute), dY.reshape(-1, n).to(compute)
    r = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    normed = h * r
    if gemma:
        return r, normed, dy * (1.0 + W.to(compute)), dy * normed
    # Llama scales the rounded normed by W, so its gradient reaches normed rounded to X's dtype.
    return r, normed, (dy * W.to(compute)).to(X.dtype).to(compute), dy * normed.to(X.dtype).to(compute)


def _rms_norm_gradients(X, W, dX_rows, dW):
    return dX_rows.to(X.dtype).reshape(X.shape), dW.to(W.dtype)


def _projection(g, normed, row_sum=lambda terms: terms.sum(-1, keepdim=True)):
    """The term the closed-form dX subtracts: normed * mean(g * normed), the mean's sum by ``row_sum``."""
    return normed * (row_sum(g * normed) / normed.shape[-1])


def _sum_accumulated_in(dtype):
    """A row sum kept in a running accumulator of ``dtype``: products rounded to dtype, then added one
    column at a time, the accumulator rounded to dtype after every addition."""
    def row_sum(terms):
        terms = terms.to(dtype)
        total = torch.zeros(terms.shape[:-1] + (1,), dtype=dtype, device=terms.device)
        for column in range(terms.shape[-1]):
            total = total + terms[..., column:column + 1]
        return total.float()

    return row_sum


# RMSNorm entirely in the input dtype (no fp32 upcast); Llama and Gemma. Wrong in float16/bfloat16.
def _rms_norm_in_input_dtype(X, W, eps, gemma=False):
    normed = X * torch.rsqrt(X.pow(2).mean(-1, keepdim=True) + eps)
    if gemma:
        return normed * (1.0 + W.to(X.dtype))
    return W * normed


rms_norm_no_upcast = SimpleNamespace(rms_norm=_rms_norm_in_input_dtype)


# Backward's row reduction sum(g * normed) accumulated in the input dtype. Wrong in float16/bfloat16.
def _rms_norm_backward_low_precision_sum(X, W, dY, eps, gemma):
    r, normed, g, dW_rows = _rms_norm_backward_terms(X, W, dY, eps, gemma)
    dX = r * (g - _projection(g, normed, _sum_accumulated_in(X.dtype)))
    return _rms_norm_gradients(X, W, dX, dW_rows.sum(0))


rms_norm_bf16_backward_sum = SimpleNamespace(rms_norm=_rms_norm_with_backward(_rms_norm_backward_low_precision_sum))


# eps added to the root instead of under it: x / (sqrt(mean(x^2)) + eps). Wrong in every dtype where
# eps matters (tiny rows; zero rows in backward). vector_norm's gradient at a zero row is 0, not NaN.
def _normalise_eps_outside_root(h, eps):
    rms = torch.linalg.vector_norm(h, dim=-1, keepdim=True) / math.sqrt(h.shape[-1])
    return h / (rms + eps)


rms_norm_eps_outside = SimpleNamespace(rms_norm=_rms_norm_with(_normalise_eps_outside_root))


# Backward's dX drops the projection term: dX = r * g. Wrong in every dtype.
def _rms_norm_backward_without_projection(X, W, dY, eps, gemma):
    r, normed, g, dW_rows = _rms_norm_backward_terms(X, W, dY, eps, gemma)
    return _rms_norm_gradients(X, W, r * g, dW_rows.sum(0))


rms_norm_dx_missing_projection = SimpleNamespace(
    rms_norm=_rms_norm_with_backward(_rms_norm_backward_without_projection))


# dW's row sum leaves out the last row once there are more than 64 rows (a tail tile dropped); dX right.
# Wrong in every dtype, for more than 64 rows.
def _rms_norm_backward_dw_without_last_row(X, W, dY, eps, gemma):
    r, normed, g, dW_rows = _rms_norm_backward_terms(X, W, dY, eps, gemma)
    summed = dW_rows[:-1] if dW_rows.shape[0] > 64 else dW_rows
    return _rms_norm_gradients(X, W, r * (g - _projection(g, normed)), summed.sum(0))


rms_norm_dw_drops_tail_row = SimpleNamespace(rms_norm=_rms_norm_with_backward(_rms_norm_backward_dw_without_last_row))


# The mean of squares divides by the block size (next power of two >= n_cols), padding counted.
# Wrong in every dtype when n_cols is not a power of two.
def _normalise_over_block(h, eps):
    block = 1 << (h.shape[-1] - 1).bit_length()
    return h * torch.rsqrt(h.pow(2).sum(-1, keepdim=True) / block + eps)


rms_norm_divides_by_block = SimpleNamespace(rms_norm=_rms_norm_with(_normalise_over_block))


# Gemma scales by W instead of 1 + W (the offset forgotten); Llama right. Wrong in every dtype, Gemma only.
def _rms_norm_gemma_scaling_by_w(X, W, eps, gemma=False):
    if not gemma:
        return norm_ops.rms_norm(X, W, eps)
    h = X.float()
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * W.float()).to(X.dtype)


rms_norm_gemma_without_offset = SimpleNamespace(rms_norm=_rms_norm_gemma_scaling_by_w)


# Programs of 4 consecutive rows never reset the sum-of-squares accumulator between their rows: row k
# of a program uses the squares of its rows 0..k. Wrong in every dtype, for 2 rows or more.
def _sum_of_squares_carried_per_program(h, rows_per_program=4):
    n = h.shape[-1]
    per_row = h.reshape(-1, n).pow(2).sum(-1)
    rows = per_row.shape[0]
    padded = F.pad(per_row, (0, (-rows) % rows_per_program))
    carried = padded.reshape(-1, rows_per_program).cumsum(-1).reshape(-1)[:rows]
    return carried.reshape(h.shape[:-1] + (1,))


def _normalise_with_carried_state(h, eps):
    return h * torch.rsqrt(_sum_of_squares_carried_per_program(h) / h.shape[-1] + eps)


rms_norm_state_per_program = SimpleNamespace(rms_norm=_rms_norm_with(_normalise_with_carried_state))


# A Llama kernel that rounds a float32 W to X's dtype before scaling (output cast back to HF's dtype).
# Wrong in float16/bfloat16, only with a float32 W; Gemma right.
def _rms_norm_rounding_fp32_weight(X, W, eps, gemma=False):
    if gemma:
        return norm_ops.rms_norm(X, W, eps, gemma)
    return norm_ops.rms_norm(X, W.to(X.dtype), eps).to(torch.promote_types(X.dtype, W.dtype))


rms_norm_rounds_fp32_weight = SimpleNamespace(rms_norm=_rms_norm_rounding_fp32_weight)


# Llama's normed times W in float32, rounded once, where HF rounds normed to X's dtype and multiplies in
# it (Gemma right): as precise as HF, not HF's rounding steps. A kernel that promises HF's cast order
# (kernels' EXACT: Y keeps HF's rounding steps) breaks its promise in float16 and bfloat16; in float32
# the two orders are one.
def _rms_norm_scaling_before_rounding(X, W, eps, gemma=False):
    if gemma:
        return norm_ops.rms_norm(X, W, eps, gemma)
    compute = torch.float64 if torch.float64 in (X.dtype, W.dtype) else torch.float32
    h = X.to(compute)
    normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * W.to(compute)).to(torch.promote_types(X.dtype, W.dtype))


rms_norm_scales_before_rounding = SimpleNamespace(rms_norm=_rms_norm_scaling_before_rounding, EXACT=kernels.EXACT)


# --- RoPE bugs


def _positions(Q, position_ids):
    """position_ids, or the default arange(seq) for every batch row."""
    if position_ids is None:
        return torch.arange(Q.shape[2], device=Q.device).expand(Q.shape[0], -1)
    return position_ids


# Tokens at index 48 and beyond take token 47's position (a clamped position index). Wrong in every
# dtype when seq > 48.
def _rope_clamping_token_index(Q, K, cos, sin, position_ids=None, last_token=47):
    positions = _positions(Q, position_ids)
    seq = positions.shape[1]
    if seq > last_token + 1:
        tail = positions[:, last_token:last_token + 1].expand(-1, seq - last_token - 1)
        positions = torch.cat((positions[:, :last_token + 1], tail), dim=1)
    return rope_ops.rope(Q, K, cos, sin, positions)


rope_wrong_position_past_48 = SimpleNamespace(rope=_rope_clamping_token_index)


# Every batch row uses batch row 0's position_ids (per-row positions ignored). Wrong in every dtype
# with packed position_ids that differ between rows (batch > 1).
def _rope_first_row_positions(Q, K, cos, sin, position_ids=None):
    if position_ids is not None:
        position_ids = position_ids[:1].expand_as(position_ids)
    return rope_ops.rope(Q, K, cos, sin, position_ids)


rope_first_row_positions = SimpleNamespace(rope=_rope_first_row_positions)


def _rotate_interleaved_pairs(x):
    """GPT-J's rotation: each pair (x[2i], x[2i+1]) becomes (-x[2i+1], x[2i])."""
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


# GPT-J-style RoPE (interleaved pairs) where HF rotates the two halves. Wrong in every dtype.
def _rope_interleaved(Q, K, cos, sin, position_ids=None):
    c, s = rope_ops.table_rows(Q, cos, sin, position_ids)
    half = c.shape[-1] // 2
    c = c[..., :half].repeat_interleave(2, dim=-1).unsqueeze(1)
    s = s[..., :half].repeat_interleave(2, dim=-1).unsqueeze(1)
    return tuple(x * c + _rotate_interleaved_pairs(x) * s for x in (Q, K))


rope_interleaved_pairs = SimpleNamespace(rope=_rope_interleaved)


# The loop over groups of 4 Q heads stops before a partial last group: those heads come back
# unrotated. Wrong in every dtype when n_heads % 4 != 0.
def _rope_skipping_partial_head_group(Q, K, cos, sin, position_ids=None, group=4):
    Q_out, K_out = rope_ops.rope(Q, K, cos, sin, position_ids)
    rotated = group * (Q.shape[1] // group)
    return torch.cat((Q_out[:, :rotated], Q[:, rotated:]), dim=1), K_out


rope_skips_partial_head_group = SimpleNamespace(rope=_rope_skipping_partial_head_group)


# cos and sin rows pass through float16 before Q's dtype (a half-precision table cache). Wrong in float32.
def _rope_half_precision_table(Q, K, cos, sin, position_ids=None):
    return rope_ops.rope(Q, K, cos.to(torch.float16), sin.to(torch.float16), position_ids)


rope_low_precision_table = SimpleNamespace(rope=_rope_half_precision_table)


# Both products and their sum in float32, rounded once to Q's dtype (a fused multiply-add), where HF
# rounds each product and then the sum: as precise as HF, not HF's bits. A kernel that promises HF's
# cast order (kernels' EXACT) breaks its promise in float16 and bfloat16; in float32 both are HF's.
def _rope_rounding_once(Q, K, cos, sin, position_ids=None):
    c, s = rope_ops.table_rows(Q, cos, sin, position_ids)
    c, s = c.float().unsqueeze(1), s.float().unsqueeze(1)
    return tuple((x.float() * c + rope_ops.rotate_half(x).float() * s).to(x.dtype) for x in (Q, K))


rope_rounds_once = SimpleNamespace(rope=_rope_rounding_once, EXACT=kernels.EXACT)


# --- SwiGLU bugs


def _hf_swiglu_gradients(dh, e, g):
    """(de, dg) by HF's autograd."""
    _, dg, de = swiglu_ops.swiglu_lora_backward(dh, e, g)
    return de, dg


class _SwigluHandWritten(torch.autograd.Function):
    """SwiGLU from ``forward_fn(e, g) -> h`` and ``backward_fn(dh, e, g) -> (de, dg)``."""

    @staticmethod
    def forward(ctx, e, g, forward_fn, backward_fn):
        ctx.save_for_backward(e, g)
        ctx.backward_fn = backward_fn
        return forward_fn(e, g)

    @staticmethod
    def backward(ctx, dh):
        e, g = ctx.saved_tensors
        de, dg = ctx.backward_fn(dh, e, g)
        return de, dg, None, None


def _swiglu_from(forward_fn=swiglu_ops.swiglu, backward_fn=_hf_swiglu_gradients):
    return lambda e, g: _SwigluHandWritten.apply(e, g, forward_fn, backward_fn)


def _silu_rounded(e):
    """f = silu(e) computed in fp32 and rounded to e's dtype, as HF's F.silu."""
    return F.silu(e.float()).to(e.dtype)


def _de_with_low_precision_sigmoid(dh, e, g):
    """de = dh * g * se * (1 + e * (1 - se)) with se = sigmoid(e) and every step in e's dtype."""
    se = torch.sigmoid(e)
    return dh * g * se * (1 + e * (1 - se))


# h zeroed wherever |h| < 0.1 (small outputs flushed); backward HF's. Wrong in every dtype.
def _swiglu_flushing_small(e, g, threshold=0.1):
    h = swiglu_ops.swiglu(e, g)
    return torch.where(h.abs() < threshold, torch.zeros_like(h), h)


swiglu_flushes_small = SimpleNamespace(swiglu=_swiglu_from(forward_fn=_swiglu_flushing_small))


# Backward computes sigmoid(e) and de's chain in the input dtype instead of fp32. Wrong in float16/bfloat16.
def _swiglu_gradients_low_precision_sigmoid(dh, e, g):
    return _de_with_low_precision_sigmoid(dh, e, g), dh * _silu_rounded(e)


swiglu_sigmoid_low_precision_backward = SimpleNamespace(
    swiglu=_swiglu_from(backward_fn=_swiglu_gradients_low_precision_sigmoid))


# silu as e * sigmoid(e) entirely in the input dtype (no fp32 upcast), autograd's backward of that.
# Wrong in float16/bfloat16.
def _swiglu_in_input_dtype(e, g):
    return e * torch.sigmoid(e) * g


swiglu_silu_low_precision_forward = SimpleNamespace(swiglu=_swiglu_in_input_dtype)


# silu(e) kept in float32 and multiplied by g there, rounded once, where HF rounds silu(e) to e's dtype
# first: as precise as HF, not HF's rounding steps. Under the kernels' promise (EXACT: h keeps HF's
# rounding steps) it fails in float16 and bfloat16; in float32 it is HF's own graph.
def _swiglu_silu_in_float32(e, g):
    compute = torch.float64 if e.dtype == torch.float64 else torch.float32
    return (F.silu(e.to(compute)) * g.to(compute)).to(e.dtype)


swiglu_keeps_silu_in_fp32 = SimpleNamespace(swiglu=_swiglu_silu_in_float32, EXACT=kernels.EXACT)


# de's silu derivative with a flipped sign: se * (1 - e * (1 - se)) for se * (1 + e * (1 - se)).
# Wrong in every dtype.
def _swiglu_gradients_sign_flipped(dh, e, g):
    se = torch.sigmoid(e.float())
    de = (dh * g).float() * se * (1 - e.float() * (1 - se))
    return de.to(e.dtype), dh * _silu_rounded(e)


swiglu_de_sign_flipped = SimpleNamespace(swiglu=_swiglu_from(backward_fn=_swiglu_gradients_sign_flipped))


# Raw forward leaves the last partial block of 1024 elements zero once numel > 4096 (a tail tile
# dropped). Wrong in every dtype when numel > 4096 and numel % 1024 != 0.
def _fg_dropping_tail_block(e, g, block=1024, threshold=4096):
    flat = swiglu_ops.swiglu(e, g).detach().reshape(-1)
    n = flat.numel()
    written = n - n % block if n > threshold else n
    h = torch.zeros(e.shape, dtype=e.dtype, device=e.device)
    h.view(-1)[:written] = flat[:written]
    return h


swiglu_fg_tail_block = SimpleNamespace(swiglu_fg_kernel=_fg_dropping_tail_block)


# Raw forward with sigmoid as exp(e) / (1 + exp(e)) in fp32: inf / inf = NaN once e > 88.
# Wrong in every dtype, with large values.
def _fg_naive_sigmoid(e, g):
    x = e.detach().float()
    f = (x * torch.exp(x) / (1 + torch.exp(x))).to(e.dtype)
    return f * g.detach()


swiglu_fg_naive_sigmoid = SimpleNamespace(swiglu_fg_kernel=_fg_naive_sigmoid)


_RAW_BACKWARD_CLOBBERS = {"swiglu_DWf_DW_dfg_kernel": {"DW", "e", "g"}}


def _written_into_buffers(DW, e, g, h, df, de):
    """The raw backward's contract: h, df, de written into DW, e, g (declared in CLOBBERS), which it returns."""
    with torch.no_grad():
        DW.copy_(h)
        e.copy_(df)
        g.copy_(de)
    return DW, e, g


# Raw backward with sigmoid(e) and de's chain in the input dtype. Wrong in float16/bfloat16 (de only).
def _raw_backward_low_precision_sigmoid(DW, e, g):
    f = _silu_rounded(e)
    return _written_into_buffers(DW, e, g, f * g, DW * f, _de_with_low_precision_sigmoid(DW, e, g))


swiglu_raw_backward_low_precision_sigmoid = SimpleNamespace(
    swiglu_DWf_DW_dfg_kernel=_raw_backward_low_precision_sigmoid, CLOBBERS=_RAW_BACKWARD_CLOBBERS)


# Raw backward stores de where df belongs and df where de belongs (the two gradients swapped).
# Wrong in every dtype.
def _raw_backward_swapping_gradients(DW, e, g):
    h, df, de = swiglu_ops.swiglu_lora_backward(DW, e, g)
    return _written_into_buffers(DW, e, g, h, de, df)


swiglu_backward_swapped = SimpleNamespace(swiglu_DWf_DW_dfg_kernel=_raw_backward_swapping_gradients,
                                          CLOBBERS=_RAW_BACKWARD_CLOBBERS)


# --- the registry ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bug:
    name: str  # the attribute in this module, loadable as --impl tests.broken_impls:NAME
    op: str  # the contract op it breaks
    dtypes: tuple[str, ...]  # dtypes where it is a bug: a subset of ("float32", "float16", "bfloat16")
    models: str  # one line: the real kernel bug it models
    needs: str = ""  # the condition under which it shows, if any
    # dtypes where the loss is real but too small to be seen on every size: neither caught nor
    # declared harmless (the tests leave them out), with the reason in ``needs``
    borderline: tuple[str, ...] = ()


# --- GeGLU ----------------------------------------------------------------------------------------


def _geglu_other_approximation(e, g, approximate="tanh"):
    """The exact erf GeLU where the model asked for the tanh one, and the reverse (a config's
    hidden_activation read wrong)."""
    return F.gelu(e, approximate="none" if approximate == "tanh" else "tanh") * g


geglu_wrong_approximation = SimpleNamespace(geglu=_geglu_other_approximation)


def _geglu_in_input_dtype(e, g, approximate="tanh"):
    """GeLU's formula evaluated in the input dtype, every step rounded: no fp32 upcast (in float32,
    the input dtype is the compute dtype: HF's own GeLU)."""
    if e.dtype in (torch.float32, torch.float64):
        return F.gelu(e, approximate=approximate) * g
    if approximate == "tanh":
        f = 0.5 * e * (1 + torch.tanh(math.sqrt(2 / math.pi) * (e + 0.044715 * e * e * e)))
    else:
        f = 0.5 * e * (1 + torch.erf(e / math.sqrt(2)))
    return f * g


geglu_no_upcast = SimpleNamespace(geglu=_geglu_in_input_dtype)


_EVERY_DTYPE = ("float32", "float16", "bfloat16")
_LOW_PRECISION = ("float16", "bfloat16")

CATALOGUE: tuple[Bug, ...] = (
    Bug("rms_norm_no_upcast", "rms_norm", _LOW_PRECISION,
        "variance, rsqrt and scaling computed in the input dtype, no fp32 upcast",
        "clearest with large values in float16 (x^2 overflows)"),
    Bug("rms_norm_bf16_backward_sum", "rms_norm", _LOW_PRECISION,
        "backward's row reduction sum(g * normed) accumulated in the input dtype"),
    Bug("rms_norm_eps_outside", "rms_norm", _EVERY_DTYPE,
        "eps added to the root, x / (sqrt(mean(x^2)) + eps), instead of under it",
        "tiny values or zero rows (eps dominates); float32 shows it on ordinary values too"),
    Bug("rms_norm_dx_missing_projection", "rms_norm", _EVERY_DTYPE,
        "backward's dX drops the projection term: dX = r * g"),
    Bug("rms_norm_dw_drops_tail_row", "rms_norm", _EVERY_DTYPE,
        "dW's sum over rows leaves out the last row (a dropped tail tile)", "more than 64 rows"),
    Bug("rms_norm_divides_by_block", "rms_norm", _EVERY_DTYPE,
        "mean of squares divided by the padded block size (next power of two) instead of n_cols",
        "n_cols not a power of two"),
    Bug("rms_norm_gemma_without_offset", "rms_norm", _EVERY_DTYPE,
        "Gemma's scale W used where it should be 1 + W", "gemma variant"),
    Bug("rms_norm_state_per_program", "rms_norm", _EVERY_DTYPE,
        "sum-of-squares accumulator not reset between the 4 rows a program handles", "2 rows or more"),
    Bug("rms_norm_rounds_fp32_weight", "rms_norm", _LOW_PRECISION,
        "a float32 W rounded to X's dtype before scaling (Llama)", "float32 W, llama variant"),
    Bug("rms_norm_scales_before_rounding", "rms_norm", _LOW_PRECISION,
        "normed times W in float32, rounded once, where HF rounds normed first (Llama): HF's precision, not "
        "HF's rounding steps, in a kernel that promises them (EXACT)", "llama variant"),
    Bug("rope_wrong_position_past_48", "rope", _EVERY_DTYPE,
        "token index clamped: tokens from 48 on take token 47's position", "seq > 48"),
    Bug("rope_first_row_positions", "rope", _EVERY_DTYPE,
        "per-row position_ids ignored: every batch row uses row 0's positions",
        "packed position_ids, batch > 1, rows differ"),
    Bug("rope_interleaved_pairs", "rope", _EVERY_DTYPE,
        "GPT-J interleaved-pair rotation instead of HF's rotate_half"),
    Bug("rope_skips_partial_head_group", "rope", _EVERY_DTYPE,
        "head-group loop stops early: Q heads past the last full group of 4 left unrotated",
        "n_heads % 4 != 0"),
    Bug("rope_low_precision_table", "rope", ("float32",),
        "cos and sin rows cached in float16 before the cast to Q's dtype",
        "in bfloat16 the table is rounded twice (fp32 -> fp16 -> bf16): one bf16 step on ~0.1% more elements, "
        "seen by the distribution judgement only at millions of elements (H200)", borderline=("bfloat16",)),
    Bug("rope_rounds_once", "rope", _LOW_PRECISION,
        "products and their sum rounded once (fused in float32) where HF rounds each: HF's precision, not "
        "HF's bits, in a kernel that promises HF's cast order (EXACT)"),
    Bug("swiglu_flushes_small", "swiglu", _EVERY_DTYPE,
        "forward flushes outputs with |h| < 0.1 to zero"),
    Bug("swiglu_sigmoid_low_precision_backward", "swiglu", _LOW_PRECISION,
        "backward's sigmoid(e) and silu-derivative chain computed in the input dtype"),
    Bug("swiglu_silu_low_precision_forward", "swiglu", _EVERY_DTYPE,
        "silu as e * sigmoid(e) in the input dtype, no fp32 upcast",
        "in float32 only its autograd shows: de is NaN at e = -inf where silu's own backward is not"),
    Bug("swiglu_keeps_silu_in_fp32", "swiglu", _LOW_PRECISION,
        "silu(e) kept in float32 and times g there, rounded once, where HF rounds silu(e) first: HF's "
        "precision, not HF's rounding steps, in a kernel that promises them (EXACT)"),
    Bug("swiglu_de_sign_flipped", "swiglu", _EVERY_DTYPE,
        "silu derivative mistyped as se * (1 - e * (1 - se))"),
    Bug("swiglu_fg_tail_block", "swiglu_fg_kernel", _EVERY_DTYPE,
        "last partial block of 1024 elements never written (left zero)",
        "numel > 4096 and numel % 1024 != 0"),
    Bug("swiglu_fg_naive_sigmoid", "swiglu_fg_kernel", _EVERY_DTYPE,
        "sigmoid as exp(e) / (1 + exp(e)): inf / inf = NaN", "large values (e > 88)"),
    Bug("swiglu_raw_backward_low_precision_sigmoid", "swiglu_DWf_DW_dfg_kernel", _LOW_PRECISION,
        "raw backward computes sigmoid(e) and de's chain in the input dtype"),
    Bug("swiglu_backward_swapped", "swiglu_DWf_DW_dfg_kernel", _EVERY_DTYPE,
        "raw backward stores de in e's buffer and df in g's: the two gradients swapped"),
    Bug("geglu_wrong_approximation", "geglu", _EVERY_DTYPE,
        "the exact erf GeLU where the tanh one was asked, and the reverse (hidden_activation read wrong)"),
    Bug("geglu_no_upcast", "geglu", _LOW_PRECISION, "GeLU's formula evaluated in the input dtype, no fp32 upcast"),
)


# --- run-to-run nondeterminism: what atomics do to a GPU sum ---------------------------------------

_calls = {"dW": 0}


def _rms_norm_backward_dw_in_shifting_order(X, W, dY, eps, gemma):
    """dW's rows added one at a time, starting at a row that moves on with every call (as atomics
    arrive in another order on every run); each order as accurate as any other."""
    r, normed, g, dW_rows = _rms_norm_backward_terms(X, W, dY, eps, gemma)
    dX = r * (g - _projection(g, normed))
    _calls["dW"] += 1
    order = torch.roll(torch.arange(dW_rows.shape[0]), _calls["dW"])
    dW = torch.zeros_like(dW_rows[0])
    for row in order.tolist():
        dW = dW + dW_rows[row]
    return _rms_norm_gradients(X, W, dX, dW)


nondeterministic_dw = SimpleNamespace(rms_norm=_rms_norm_with_backward(_rms_norm_backward_dw_in_shifting_order))


# --- only at production scale: not in CATALOGUE, whose bugs the default grids must catch ----------

class _KernelsRmsNormTilesAddedInBf16(torch.autograd.Function):
    """The repository's kernels, except that past ``past`` rows dW is summed by tiles of ``tile``
    rows and the tiles' partial sums are added up in bfloat16: a large-input path whose partial
    sums lost their fp32 accumulator. Identical to the kernels below that row count, so only the
    scale grid can see it (tests/test_scale.py)."""

    @staticmethod
    def forward(ctx, X, W, eps, gemma, past, tile):
        ctx.save_for_backward(X, W)
        ctx.eps, ctx.gemma, ctx.past, ctx.tile = eps, gemma, past, tile
        return kernels.rms_norm(X, W, eps, gemma)

    @staticmethod
    def backward(ctx, dY):
        X, W = ctx.saved_tensors
        with torch.enable_grad():  # the kernels' own backward, through a fresh graph
            x, w = X.detach().requires_grad_(), W.detach().requires_grad_()
            dX, dW = torch.autograd.grad(kernels.rms_norm(x, w, ctx.eps, ctx.gemma), (x, w), dY)
        n = X.shape[-1]
        rows_x, rows_dy = X.reshape(-1, n), dY.reshape(-1, n)
        if rows_x.shape[0] > ctx.past:
            dW = torch.zeros(n, dtype=torch.bfloat16, device=X.device)
            for start in range(0, rows_x.shape[0], ctx.tile):
                part = slice(start, start + ctx.tile)
                *_, dW_rows = _rms_norm_backward_terms(rows_x[part], W, rows_dy[part], ctx.eps, ctx.gemma)
                dW = (dW.float() + dW_rows.sum(0)).to(torch.bfloat16)
            dW = dW.to(W.dtype)
        return dX, dW, None, None, None, None


def rms_norm_bf16_partials_past(past: int, tile: int):
    return lambda X, W, eps, gemma=False: _KernelsRmsNormTilesAddedInBf16.apply(X, W, eps, gemma, past, tile)


# Past 64k rows (the scale grid has 128k), tiles of 4096 rows: 32 partial sums rounded to bf16.
rms_norm_bf16_partials_past_64k_rows = SimpleNamespace(rms_norm=rms_norm_bf16_partials_past(65536, 4096))


# --- inside torch.compile (oracle/checks/compile.py) -------------------------------------------------
#
# Each breaks only what torch.compile sees: in eager mode every one of them gives the kernels' bits.


@torch.library.custom_op("oracle_tests::raw_backward_declaring_DW_only", mutates_args=("DW",))
def _raw_backward_declaring_DW_only(DW: torch.Tensor, e: torch.Tensor, g: torch.Tensor) -> None:
    """The raw SwiGLU backward as a custom op whose schema marks only DW mutated, while it writes df
    and de into e and g too (a mutates_args that lists the first buffer and forgets the others)."""
    h, df, de = kernels.swiglu_DWf_DW_dfg_kernel(DW.clone(), e.clone(), g.clone())  # the right values
    DW.copy_(h)
    e.copy_(df)
    g.copy_(de)


@_raw_backward_declaring_DW_only.register_fake
def _(DW, e, g):
    return None


def _raw_backward_through_the_op(DW, e, g):
    _raw_backward_declaring_DW_only(DW, e, g)
    return DW, e, g


_raw_backward_through_the_op.custom_op = _raw_backward_declaring_DW_only

# CLOBBERS says what the kernel writes; the op's schema says less.
schema_omits_a_mutation = SimpleNamespace(swiglu_DWf_DW_dfg_kernel=_raw_backward_through_the_op,
                                          CLOBBERS={"swiglu_DWf_DW_dfg_kernel": {"DW", "e", "g"}}, COMPILES=True)


def _rope_checking_positions_on_the_host(Q, K, cos, sin, position_ids=None):
    """The kernels' RoPE behind a range check that reads the largest position to the host: right in
    eager mode, a graph break under torch.compile (a data-dependent Python branch)."""
    if position_ids is not None and int(position_ids.max()) >= cos.shape[0]:
        raise ValueError("position_ids outside the table")
    return kernels.rope(Q, K, cos, sin, position_ids)


# Declares that rope compiles, yet its host read breaks the graph.
graph_break_declaring_compiles = SimpleNamespace(rope=_rope_checking_positions_on_the_host,
                                                 CLOBBERS={"rope": {"Q", "K"}}, COMPILES={"rope"})


def _swiglu_with_a_compile_fallback(e, g):
    """The kernels in eager mode; under torch.compile a "compile-friendly" torch formula that rounds
    silu(e) * g once, where HF (and the kernel) round silu(e) first."""
    if torch.compiler.is_compiling():
        return (F.silu(e.float()) * g.float()).to(e.dtype)
    return kernels.swiglu(e, g)


compiled_differs_from_eager = SimpleNamespace(swiglu=_swiglu_with_a_compile_fallback, COMPILES={"swiglu"})


def _rms_norm_crashing_on_the_widest_rows(X, W, eps, gemma=False):
    """Kills its process on rows wider than 4097 (the quick grid's 65536 columns): one crash in a
    sweep, its worker replaced once (tests/test_report.py); right otherwise."""
    if X.shape[-1] > 4097:
        import os

        os.kill(os.getpid(), signal.SIGSEGV)
    return kernels.rms_norm(X, W, eps, gemma)


crashes_on_the_widest_rows = SimpleNamespace(rms_norm=_rms_norm_crashing_on_the_widest_rows)


def _rms_norm_in_the_inputs_dtype(X, W, eps, gemma=False):
    return norm_ops.rms_norm(X, W.to(X.dtype), eps, gemma)  # a float32 weight gives Y in X's dtype, not float32


# Not an aliasing bug: the output's dtype differs from HF's (HF promotes to the float32 weight's), and the
# verdict says so; the gradient handed back is then rounded to that dtype, which is no corruption.
output_in_the_inputs_dtype = SimpleNamespace(rms_norm=_rms_norm_in_the_inputs_dtype)
