"""RMSNorm (Llama) and its Gemma variant: a Triton forward, a hand-written Triton backward.

Forward, per row of n columns (HF's LlamaRMSNorm / GemmaRMSNorm):

    inv_var = 1 / sqrt(mean(x^2) + eps)                      in fp32 (fp64 for fp64 inputs)
    normed  = x * inv_var
    Llama:  y = W * normed.to(x.dtype)                       rounded to x's dtype first, then times W
    Gemma:  y = (normed * (1 + W)).to(x.dtype)               (1 + W) in fp32, one rounding at the end

Backward, with g the gradient reaching ``normed`` and inv_var saved by forward (no recomputation):

    Llama:  g = (dY * W).to(x.dtype)                         HF's autograd rounds it to x's dtype
    Gemma:  g = dY * (1 + W)
    dX = inv_var * (g - normed * sum(g * normed) / n)        the closed form of d(x * inv_var)/dx
    dW = sum over rows of dY * normed (Llama: normed.to(x.dtype))

dW is summed in fp32 by persistent programs, each owning a fixed, contiguous range of rows, into
one partial row per program; a second small kernel sums the partials in a fixed order and casts
once to W's dtype. Same inputs on the same device, same bits.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from . import _checks
from ._launch import TL_COMPUTE, device_index, program_slots, row_block
from ._layout import rows_addressable
from ._runtime import launching


@triton.jit
def _row_offsets(rows, L1, L2, s0, s1, s2):
    """Address of each row's first element from its (i0, i1, i2) position in the leading dims."""
    i2 = rows % L2
    rest = rows // L2
    return (rest // L1) * s0 + (rest % L1) * s1 + i2 * s2


@triton.jit
def _rms_norm_forward_kernel(
    Y_ptr,  # output (n_rows, n_cols), contiguous
    X_ptr, X_s0, X_s1, X_s2, X_col_stride,  # input rows, addressed through the leading dims
    W_ptr, W_col_stride,  # weight (n_cols,)
    inv_var_ptr,  # (n_rows,) 1/sqrt(mean(x^2) + eps), saved for backward
    n_cols, L1, L2,
    eps_hi,  # eps rounded to fp32 ...
    eps_lo,  # ... and what that rounding lost, added back when computing in fp64
    GEMMA: tl.constexpr,
    COMPUTE: tl.constexpr,  # tl.float32, or tl.float64 for float64 inputs
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE).to(tl.int64)  # 64-bit addressing (also skips the interpreter's int32 overflow checks)
    mask = cols < n_cols
    x_dtype = X_ptr.dtype.element_ty

    # Load the row and the weight, upcast: no arithmetic ever happens in bf16/fp16.
    x_start = _row_offsets(row, L1, L2, X_s0, X_s1, X_s2)
    x = tl.load(X_ptr + x_start + cols * X_col_stride, mask=mask, other=0.0).to(COMPUTE)
    w = tl.load(W_ptr + cols * W_col_stride, mask=mask, other=0.0).to(COMPUTE)

    # Row statistic; padding lanes hold 0 and add nothing to the sum.
    var = tl.sum(x * x, axis=0) / n_cols
    if COMPUTE == tl.float64:
        var = var + eps_lo
    inv_var = tl.rsqrt(var + eps_hi)
    tl.store(inv_var_ptr + row, inv_var)

    # Scale, in HF's cast order.
    normed = x * inv_var
    if GEMMA:
        y = normed * (1.0 + w)
    else:
        y = normed.to(x_dtype).to(COMPUTE) * w
    tl.store(Y_ptr + row * n_cols + cols, y, mask=mask)


@triton.jit
def _rms_norm_backward_kernel(
    dX_ptr, dX_s0, dX_s1, dX_s2, dX_col_stride,  # input gradient (may be dY's own buffer, opt-in)
    dY_ptr, dY_s0, dY_s1, dY_s2, dY_col_stride,  # incoming gradient, any layout (stride 0 too)
    X_ptr, X_s0, X_s1, X_s2, X_col_stride,  # forward input
    W_ptr, W_col_stride,
    inv_var_ptr,  # saved by forward
    dW_partial_ptr,  # (n_programs, n_cols) COMPUTE: this program's sum of dY * normed
    n_rows, n_cols, L1, L2,
    rows_per_program,  # each program owns rows [pid * rows_per_program, ... + rows_per_program)
    GEMMA: tl.constexpr,
    COMPUTE: tl.constexpr,
    ROWS: tl.constexpr,  # rows handled per loop step, as one 2-D block
    BLOCK_SIZE: tl.constexpr,
    NUM_STAGES: tl.constexpr,  # loop iterations whose loads are in flight at once (software pipelining)
):
    pid = tl.program_id(0).to(tl.int64)
    first_row = pid * rows_per_program
    end_row = tl.minimum(first_row + rows_per_program, n_rows)
    cols = tl.arange(0, BLOCK_SIZE).to(tl.int64)  # 64-bit addressing (also skips the interpreter's int32 overflow checks)
    col_mask = cols < n_cols
    x_dtype = X_ptr.dtype.element_ty

    w = tl.load(W_ptr + cols * W_col_stride, mask=col_mask, other=0.0).to(COMPUTE)
    if GEMMA:
        w = 1.0 + w
    dw = tl.zeros([BLOCK_SIZE], dtype=COMPUTE)

    for start in tl.range(first_row, end_row, ROWS, num_stages=NUM_STAGES):
        rows = start + tl.arange(0, ROWS)
        row_mask = rows < end_row
        mask = row_mask[:, None] & col_mask[None, :]

        # Load the rows; masked lanes are 0 so they add nothing to either sum below.
        x_start = _row_offsets(rows, L1, L2, X_s0, X_s1, X_s2)
        x = tl.load(X_ptr + x_start[:, None] + cols[None, :] * X_col_stride, mask=mask, other=0.0).to(COMPUTE)
        dy_start = _row_offsets(rows, L1, L2, dY_s0, dY_s1, dY_s2)
        dy = tl.load(dY_ptr + dy_start[:, None] + cols[None, :] * dY_col_stride, mask=mask, other=0.0).to(COMPUTE)
        inv_var = tl.load(inv_var_ptr + rows, mask=row_mask, other=0.0)[:, None]
        normed = x * inv_var

        # Gradient reaching `normed`, and this step's share of dW, in HF's cast order.
        if GEMMA:
            g = dy * w[None, :]
            dw += tl.sum(dy * normed, axis=0)
        else:
            g = (dy * w[None, :]).to(x_dtype).to(COMPUTE)
            dw += tl.sum(dy * normed.to(x_dtype).to(COMPUTE), axis=0)

        # Compute dx (closed form) and write it.
        mean_g_normed = tl.sum(g * normed, axis=1) / n_cols
        dx = inv_var * (g - normed * mean_g_normed[:, None])
        dx_start = _row_offsets(rows, L1, L2, dX_s0, dX_s1, dX_s2)
        tl.store(dX_ptr + dx_start[:, None] + cols[None, :] * dX_col_stride, dx, mask=mask)

    tl.store(dW_partial_ptr + pid * n_cols + cols, dw, mask=col_mask)


@triton.jit
def _sum_partials_kernel(
    dW_ptr,  # (n_cols,) in W's dtype
    partial_ptr,  # (n_partials, n_cols) COMPUTE: one row per backward program
    n_partials, n_cols,
    PARTIALS: tl.constexpr,  # partial rows per step, reduced as one 2-D block
    BLOCK_SIZE: tl.constexpr,  # columns per program
):
    cols = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    col_mask = cols < n_cols
    # Steps and the tree inside each step are fixed by the shapes alone: same inputs, same bits.
    acc = tl.zeros([BLOCK_SIZE], dtype=partial_ptr.dtype.element_ty)
    for start in range(0, n_partials, PARTIALS):
        rows = start + tl.arange(0, PARTIALS)
        mask = (rows < n_partials)[:, None] & col_mask[None, :]
        acc += tl.sum(tl.load(partial_ptr + rows[:, None] * n_cols + cols[None, :], mask=mask, other=0.0), axis=0)
    tl.store(dW_ptr + cols, acc, mask=col_mask)


def _split_eps(eps: float) -> tuple[float, float]:
    """eps as an exactly-fp32 part plus the remainder (Triton passes float scalars as fp32)."""
    hi = float(np.float32(eps))
    return hi, eps - hi


def _backward_rows_per_step(block: int) -> int:
    # ~8 Ki elements per step (measured on the H200: 2 rows of 4096 beat 1 by a quarter).
    return max(1, min(16, 8192 // block))


def _backward_stages(block: int, rows: int, itemsize: int) -> int:
    """Loop iterations in flight (software pipelining of the X and dY loads through shared memory).
    Three measured best on the H200 for 4096 columns; fewer where three steps' tiles would
    not fit in ~128 KiB of shared memory."""
    step_bytes = 2 * rows * block * itemsize  # X and dY tiles of one step
    for stages in (3, 2):
        if stages * step_bytes <= 128 * 1024:
            return stages
    return 1


def _validate(X: torch.Tensor, W: torch.Tensor, eps: object, gemma: object, write_dx_into_dy: object) -> float:
    _checks.require_float("X", X)
    _checks.require_float("W", W)
    _checks.require_kernel_device(X=X, W=W)
    if W.dtype != X.dtype and W.dtype != torch.float32:
        raise TypeError(f"W must have X's dtype ({X.dtype}) or float32, got {W.dtype}")
    if X.dim() < 1 or X.shape[-1] == 0:
        raise ValueError(f"X must have shape (..., n_cols) with n_cols >= 1, got {tuple(X.shape)}")
    if W.dim() != 1 or W.shape[0] != X.shape[-1]:
        raise ValueError(f"W must have shape (n_cols,) = ({X.shape[-1]},), got {tuple(W.shape)}")
    row_block(X.shape[-1])  # raises for too many columns
    _checks.require_bool("gemma", gemma)
    _checks.require_bool("write_dx_into_dy", write_dx_into_dy)
    return _checks.require_small_nonnegative("eps", eps)


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X, W, eps, gemma, write_dx_into_dy):
        n_cols = X.shape[-1]
        out_dtype = X.dtype if gemma else torch.promote_types(X.dtype, W.dtype)
        compute = _checks.compute_dtype(X, W)
        Y = torch.empty(X.shape, dtype=out_dtype, device=X.device)
        n_rows = Y.numel() // n_cols
        inv_var = torch.empty(n_rows, dtype=compute, device=X.device)
        if n_rows > 0:
            layout, (X_rows,) = rows_addressable(X)
            block, warps = row_block(n_cols)
            eps_hi, eps_lo = _split_eps(eps)
            with launching():
                _rms_norm_forward_kernel[(n_rows,)](
                    Y, X_rows, *layout.strides[0], W, W.stride(0), inv_var,
                    n_cols, layout.lead[1], layout.lead[2], eps_hi, eps_lo,
                    GEMMA=gemma, COMPUTE=TL_COMPUTE[compute], BLOCK_SIZE=block, num_warps=warps,
                )
        ctx.save_for_backward(X, W, inv_var)
        ctx.gemma = gemma
        ctx.write_dx_into_dy = write_dx_into_dy
        return Y

    @staticmethod
    def backward(ctx, dY):
        X, W, inv_var = ctx.saved_tensors
        n_cols = X.shape[-1]
        n_rows = inv_var.numel()
        compute = inv_var.dtype
        if n_rows == 0:
            return torch.zeros_like(X), torch.zeros_like(W), None, None, None
        in_place = ctx.write_dx_into_dy and _can_overwrite(dY, X, W)
        dX = dY if in_place else torch.empty(X.shape, dtype=X.dtype, device=X.device)
        # dX is contiguous, so only X or dY can ever need the contiguous fallback.
        layout, (dX, dY_rows, X_rows) = rows_addressable(dX, dY, X)
        block, warps = row_block(n_cols)
        rows_per_step = _backward_rows_per_step(block)
        n_programs = min(n_rows, program_slots(device_index(X)))
        rows_per_program = triton.cdiv(n_rows, n_programs)
        n_programs = triton.cdiv(n_rows, rows_per_program)
        dW_partial = torch.empty((n_programs, n_cols), dtype=compute, device=X.device)
        with launching():
            _rms_norm_backward_kernel[(n_programs,)](
                dX, *layout.strides[0], dY_rows, *layout.strides[1], X_rows, *layout.strides[2],
                W, W.stride(0), inv_var, dW_partial,
                n_rows, n_cols, layout.lead[1], layout.lead[2], rows_per_program,
                GEMMA=ctx.gemma, COMPUTE=TL_COMPUTE[compute], ROWS=rows_per_step, BLOCK_SIZE=block,
                NUM_STAGES=_backward_stages(block, rows_per_step, max(X.element_size(), dY.element_size())),
                num_warps=warps,
            )
        dW = None
        if ctx.needs_input_grad[1]:
            dW = torch.empty(n_cols, dtype=W.dtype, device=W.device)
            with launching():
                _sum_partials_kernel[(triton.cdiv(n_cols, 64),)](dW, dW_partial, n_programs, n_cols,
                                                                  PARTIALS=32, BLOCK_SIZE=64)
        return dX, dW, None, None, None


def _can_overwrite(dY: torch.Tensor, X: torch.Tensor, W: torch.Tensor) -> bool:
    """dY's buffer can take dX only if it has X's dtype, owns each of its elements exactly once, and
    shares no memory with X or W, which other programs may still be reading."""
    return dY.dtype == X.dtype and dY.shape == X.shape and dY.is_contiguous() and \
        not _checks.overlaps(dY, X) and not _checks.overlaps(dY, W)


@torch.compiler.disable
def rms_norm(X: torch.Tensor, W: torch.Tensor, eps: float, gemma: bool = False, *,
             write_dx_into_dy: bool = False) -> torch.Tensor:
    """RMSNorm over the last dimension of X, as HF's LlamaRMSNorm (or GemmaRMSNorm with ``gemma=True``).

    X: (..., n_cols) in any layout, n_cols <= 65536; W: (n_cols,) with X's dtype or float32.
    Differentiable in X and W. Llama's output dtype follows type promotion of W and X, as in HF;
    Gemma's is X's.

    ``write_dx_into_dy=True`` lets backward write dX into the incoming gradient's buffer, saving
    one activation. UNSAFE when that gradient is shared: a residual add hands the same gradient
    tensor to both branches, and the other branch then reads dX instead. Only for callers that own
    the gradient buffer. Ignored when dY cannot hold dX (other dtype, non-contiguous, expanded, or
    sharing memory with X or W).

    ``eps``: a real number in [0, 3.4e38]; ``gemma`` and ``write_dx_into_dy``: bools (TypeError otherwise).
    """
    eps = _validate(X, W, eps, gemma, write_dx_into_dy)
    return RMSNormFunction.apply(X, W, eps, gemma, write_dx_into_dy)
