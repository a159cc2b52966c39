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

Launch paths, chosen per width from measurements (kernels/_rms_norm_configs.py, the table in
rms_norm_configs.json, written by scripts/tune_rms_norm.py on the H200):

    forward   "rows":   several whole rows per program where rows are narrow (16 rows of 128).
              "looped": rows too wide for one block (32768 and up) are swept twice in chunks by
                        persistent programs, the second sweep reading the row back from L2.
              "overlapped": the looped forward's two sweeps of neighbouring rows in one loop, so a
                        program's loads from HBM never pause between rows (Note [Two rows a step]).
              "parts":  programs share a row, each holding its columns from load to store, and
                        exchange their shares of the sum of squares (Note [A row shared by programs]).
    backward  "rows":   persistent programs over contiguous row ranges, several rows per step.
              "split":  for the widest rows, each row's sum(g * normed) first, then a 2-D grid of
                        (row range, column chunk) programs writes dX and sums dW. With one row range
                        the sums wait in dX's last bytes, written by a last launch (Note [The row
                        sums at dX's end]).

dW is summed in fp32: each program accumulates its rows per row lane and column, reduces the lanes
once, and writes one partial row; a second small kernel sums the partials in a fixed order and casts
once to W's dtype. Where one row range holds every row, its partial row is dW, rounded once as it is
stored. Every order is fixed by the shapes alone: same inputs on the same device, same bits.
However few programs a setting asks for, none sums more than DW_STEPS steps of its rows per lane (Note
[dW's serial sums]).
Where the partial rows would add more than 1% to dX's memory, they live in the dX memory of each
program's last rows, whose dX a third launch writes (Note [dW's partial rows inside dX]).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import triton
import triton.language as tl

from . import _checks
from ._launch import TL_COMPUTE, cdiv, device_index, next_power_of_2, program_slots
from ._launcher import launch
from ._layout import rows_addressable
from ._library import calls, custom_op, tracing
from ._rms_norm_configs import Config, lookup
from ._runtime import interpreted, launching

MAX_COLUMNS = 65536  # the contract's widest row (every path could go wider; the specs test up to here)
PATIENCE = 1 << 16  # polls before a program of the parts forward sums its row's other shares itself
DW_STEPS = 128  # the most rows a backward program's dW lane adds one after another (Note [dW's serial sums])
LEND_ABOVE = 100  # partial rows lent dX's memory when they would add more than 1/LEND_ABOVE to dX's bytes


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
    n_rows, n_cols, L1, L2,
    eps_hi,  # eps rounded to fp32 ...
    eps_lo,  # ... and what that rounding lost, added back when computing in fp64
    GEMMA: tl.constexpr,
    COMPUTE: tl.constexpr,  # tl.float32, or tl.float64 for float64 inputs
    ROWS: tl.constexpr,  # whole rows per program, as one 2-D block
    BLOCK_SIZE: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_mask = rows < n_rows
    cols = tl.arange(0, BLOCK_SIZE).to(tl.int64)  # 64-bit addressing (also skips the interpreter's int32 overflow checks)
    col_mask = cols < n_cols
    mask = row_mask[:, None] & col_mask[None, :]

    # Load the rows and the weight, upcast: no arithmetic ever happens in bf16/fp16.
    x_start = _row_offsets(rows, L1, L2, X_s0, X_s1, X_s2)
    x = tl.load(X_ptr + x_start[:, None] + cols[None, :] * X_col_stride, mask=mask, other=0.0).to(COMPUTE)
    w = tl.load(W_ptr + cols * W_col_stride, mask=col_mask, other=0.0).to(COMPUTE)

    # Row statistic; padding lanes hold 0 and add nothing to the sum.
    inv_var = _inv_rms(tl.sum(x * x, axis=1), n_cols, eps_hi, eps_lo, COMPUTE)
    tl.store(inv_var_ptr + rows, inv_var, mask=row_mask)

    y = _scaled(x * inv_var[:, None], w[None, :], X_ptr.dtype.element_ty, GEMMA, COMPUTE)
    tl.store(Y_ptr + rows[:, None] * n_cols + cols[None, :], y, mask=mask)


@triton.jit
def _rms_norm_forward_looped_kernel(
    Y_ptr, X_ptr, X_s0, X_s1, X_s2, X_col_stride, W_ptr, W_col_stride, inv_var_ptr,  # as above
    n_rows, n_cols, L1, L2, eps_hi, eps_lo,
    GEMMA: tl.constexpr,
    COMPUTE: tl.constexpr,
    ROWS: tl.constexpr,  # rows swept together (each chunk of W is loaded once for all of them)
    CHUNK: tl.constexpr,  # columns per step
    NUM_STAGES: tl.constexpr,  # steps whose loads are in flight at once
):
    # Persistent: few rows are in flight at once, so the second sweep finds its rows in L2. The first
    # sweep asks L2 to keep the row, the second to drop it and Y's stores first: 76% of copy bandwidth
    # at 65536 columns on the H200 against 72% without (scripts/rms_norm_l2_hints.py).
    for group in tl.range(tl.program_id(0), tl.cdiv(n_rows, ROWS), tl.num_programs(0)):
        rows = tl.cast(group, tl.int64) * ROWS + tl.arange(0, ROWS)
        row_mask = rows < n_rows
        x_rows = X_ptr + _row_offsets(rows, L1, L2, X_s0, X_s1, X_s2)[:, None]
        squares = tl.zeros([ROWS, CHUNK], dtype=COMPUTE)
        for start in tl.range(0, n_cols, CHUNK, num_stages=NUM_STAGES):
            cols = start + tl.arange(0, CHUNK).to(tl.int64)
            mask = row_mask[:, None] & (cols < n_cols)[None, :]
            x = tl.load(x_rows + cols[None, :] * X_col_stride, mask=mask, other=0.0,
                        eviction_policy="evict_last").to(COMPUTE)
            squares += x * x
        inv_var = _inv_rms(tl.sum(squares, axis=1), n_cols, eps_hi, eps_lo, COMPUTE)
        tl.store(inv_var_ptr + rows, inv_var, mask=row_mask)
        for start in tl.range(0, n_cols, CHUNK, num_stages=NUM_STAGES):
            cols = start + tl.arange(0, CHUNK).to(tl.int64)
            col_mask = cols < n_cols
            mask = row_mask[:, None] & col_mask[None, :]
            x = tl.load(x_rows + cols[None, :] * X_col_stride, mask=mask, other=0.0,
                        eviction_policy="evict_first").to(COMPUTE)
            w = tl.load(W_ptr + cols * W_col_stride, mask=col_mask, other=0.0).to(COMPUTE)
            y = _scaled(x * inv_var[:, None], w[None, :], X_ptr.dtype.element_ty, GEMMA, COMPUTE)
            tl.store(Y_ptr + rows[:, None] * n_cols + cols[None, :], y, mask=mask, eviction_policy="evict_first")


# Note [Two rows a step]
# The looped forward's programs ask HBM for nothing during a row's second sweep, and at 65536 columns
# an SM holds one or two of them: its loads come in bursts (77-81% of copy bandwidth on the H100 and
# the H200). The overlapped forward fuses each row's second sweep with the first sweep of the
# program's next row: step c loads chunk c of the next row (from HBM, for its sum of squares) beside
# chunk c of the current row (from L2, for Y). Only a program's first row's first sweep and its last
# row's second sweep run alone. The chunks are summed in the looped kernel's order and layout (one
# row, [1, CHUNK]), so at the same chunk and warps both give the same bits.
@triton.jit
def _row_chunk_of_x(x_row, X_col_stride, start, n_cols, CHUNK: tl.constexpr, POLICY: tl.constexpr,
                    COMPUTE: tl.constexpr):
    """Columns start .. start + CHUNK of a one-row block, upcast, with their columns and mask."""
    cols = start + tl.arange(0, CHUNK).to(tl.int64)
    col_mask = cols < n_cols
    x = tl.load(x_row[:, None] + cols[None, :] * X_col_stride, mask=col_mask[None, :], other=0.0,
                eviction_policy=POLICY).to(COMPUTE)
    return x, cols, col_mask


@triton.jit
def _write_row_chunk(Y_ptr, row, x, cols, col_mask, W_ptr, W_col_stride, inv_var, n_cols,
                     x_dtype: tl.constexpr, GEMMA: tl.constexpr, COMPUTE: tl.constexpr):
    w = tl.load(W_ptr + cols * W_col_stride, mask=col_mask, other=0.0).to(COMPUTE)
    y = _scaled(x * inv_var[:, None], w[None, :], x_dtype, GEMMA, COMPUTE)
    tl.store(Y_ptr + row[:, None] * n_cols + cols[None, :], y, mask=col_mask[None, :], eviction_policy="evict_first")


@triton.jit
def _rms_norm_forward_overlapped_kernel(
    Y_ptr, X_ptr, X_s0, X_s1, X_s2, X_col_stride, W_ptr, W_col_stride, inv_var_ptr,  # as above
    n_rows, n_cols, L1, L2, eps_hi, eps_lo,
    GEMMA: tl.constexpr,
    COMPUTE: tl.constexpr,
    CHUNK: tl.constexpr,  # columns per step
):
    x_dtype: tl.constexpr = X_ptr.dtype.element_ty
    row = tl.program_id(0).to(tl.int64) + tl.arange(0, 1)  # the grid has no more programs than rows
    x_row = X_ptr + _row_offsets(row, L1, L2, X_s0, X_s1, X_s2)
    squares = tl.zeros([1, CHUNK], dtype=COMPUTE)
    for start in tl.range(0, n_cols, CHUNK):
        x, _, _ = _row_chunk_of_x(x_row, X_col_stride, start, n_cols, CHUNK, "evict_last", COMPUTE)
        squares += x * x
    inv_var = _inv_rms(tl.sum(squares, axis=1), n_cols, eps_hi, eps_lo, COMPUTE)  # the program's first row
    tl.store(inv_var_ptr + row, inv_var)
    for following in tl.range(tl.program_id(0) + tl.num_programs(0), n_rows, tl.num_programs(0)):
        next_row = tl.cast(following, tl.int64) + tl.arange(0, 1)
        next_x_row = X_ptr + _row_offsets(next_row, L1, L2, X_s0, X_s1, X_s2)
        squares = tl.zeros([1, CHUNK], dtype=COMPUTE)
        for start in tl.range(0, n_cols, CHUNK):
            ahead, _, _ = _row_chunk_of_x(next_x_row, X_col_stride, start, n_cols, CHUNK, "evict_last", COMPUTE)
            x, cols, col_mask = _row_chunk_of_x(x_row, X_col_stride, start, n_cols, CHUNK, "evict_first", COMPUTE)
            _write_row_chunk(Y_ptr, row, x, cols, col_mask, W_ptr, W_col_stride, inv_var, n_cols,
                             x_dtype, GEMMA, COMPUTE)
            squares += ahead * ahead
        inv_var = _inv_rms(tl.sum(squares, axis=1), n_cols, eps_hi, eps_lo, COMPUTE)
        tl.store(inv_var_ptr + next_row, inv_var)
        row, x_row = next_row, next_x_row
    for start in tl.range(0, n_cols, CHUNK):
        x, cols, col_mask = _row_chunk_of_x(x_row, X_col_stride, start, n_cols, CHUNK, "evict_first", COMPUTE)
        _write_row_chunk(Y_ptr, row, x, cols, col_mask, W_ptr, W_col_stride, inv_var, n_cols, x_dtype, GEMMA, COMPUTE)


# Note [A row shared by programs]
# At 65536 columns a row does not fit one program's registers, and the looped forward reads it twice
# (its second sweep mostly from L2: 76-79% of copy on the H200). Here PARTS programs share a row, each
# holding CHUNK of its columns from the load to the store, so the row is read from HBM once. Each
# publishes its share of the sum of squares in a word of a zeroed buffer (the value's bits with the
# sign bit set: a sum of squares never sets it, so a published +0.0 differs from the empty word, and
# one atomic word needs no ordering against another), polls all the row's words in one vector atomic
# until every share is there, and adds the PARTS shares in one fixed tree. A program that polled
# PATIENCE times in vain (a partner not resident yet: the GPU runs a persistent grid's programs
# together only where they fit; Triton's interpreter runs them one after another) sums the missing
# shares itself from X, with the same code as their owners: a share's value does not depend on who
# computed it, so the bits do not depend on timing.
@triton.jit
def _part_columns(part, n_cols, CHUNK: tl.constexpr):
    cols = part * CHUNK + tl.arange(0, CHUNK).to(tl.int64)
    return cols, cols < n_cols


@triton.jit
def _share_of_squares(x_row, X_col_stride, part, n_cols, CHUNK: tl.constexpr, COMPUTE: tl.constexpr):
    cols, col_mask = _part_columns(part, n_cols, CHUNK)
    x = tl.load(x_row + cols * X_col_stride, mask=col_mask, other=0.0).to(COMPUTE)
    return tl.sum(x * x), x


@triton.jit
def _rms_norm_forward_parts_kernel(
    Y_ptr, X_ptr, X_s0, X_s1, X_s2, X_col_stride, W_ptr, W_col_stride, inv_var_ptr,  # as above
    n_rows, n_cols, L1, L2, eps_hi, eps_lo,
    words_ptr,  # (n_rows, PARTS) zeroed, int32 (int64 for fp64): each share's bits once published
    GEMMA: tl.constexpr,
    COMPUTE: tl.constexpr,
    PARTS: tl.constexpr,  # programs per row (the grid is a multiple of it)
    LANES: tl.constexpr,  # PARTS rounded up to a power of two: one lane a share
    CHUNK: tl.constexpr,  # columns per program
    PATIENCE: tl.constexpr,  # polls for the other shares before summing them from X
):
    part = tl.program_id(0) % PARTS
    WORD: tl.constexpr = tl.int64 if COMPUTE == tl.float64 else tl.int32
    SIGN: tl.constexpr = -(2**63) if COMPUTE == tl.float64 else -(2**31)
    lanes = tl.arange(0, LANES)
    live = lanes < PARTS
    nothing = tl.zeros([LANES], WORD)
    for r in tl.range(tl.program_id(0) // PARTS, n_rows, tl.num_programs(0) // PARTS):
        row = tl.cast(r, tl.int64)
        x_row = X_ptr + _row_offsets(row, L1, L2, X_s0, X_s1, X_s2)
        own, x = _share_of_squares(x_row, X_col_stride, part, n_cols, CHUNK, COMPUTE)
        words = words_ptr + row * PARTS
        tl.atomic_xchg(words + part, own.to(WORD, bitcast=True) | SIGN)
        seen = nothing  # no word read yet: one read, then up to PATIENCE more
        polls = tl.full((), 0, tl.int32)
        while (tl.max((seen == 0).to(tl.int32)) > 0) & (polls <= PATIENCE):
            # every word in one vector atomic: the shares' round trips overlap instead of following one
            # another (a word holds its share's bits, so no order against other memory is needed)
            seen = tl.where(live, tl.atomic_add(words + lanes, nothing, mask=live, sem="relaxed"), SIGN)
            polls += 1
        shares = (seen & ~SIGN).to(COMPUTE, bitcast=True)  # an absent lane reads as a published +0.0
        if tl.max((seen == 0).to(tl.int32)) > 0:
            for j in tl.range(0, PARTS):  # not unrolled: j is a run-time value as `part` is, so a share
                if tl.sum(tl.where(lanes == j, seen, 0)) == 0:  # summed here is laid out as its owner's was
                    share, _ = _share_of_squares(x_row, X_col_stride, j, n_cols, CHUNK, COMPUTE)
                    shares = tl.where(lanes == j, share, shares)
        total = tl.sum(shares)
        inv_var = _inv_rms(total, n_cols, eps_hi, eps_lo, COMPUTE)
        if part == 0:
            tl.store(inv_var_ptr + row, inv_var)
        cols, col_mask = _part_columns(part, n_cols, CHUNK)
        w = tl.load(W_ptr + cols * W_col_stride, mask=col_mask, other=0.0).to(COMPUTE)
        y = _scaled(x * inv_var, w, X_ptr.dtype.element_ty, GEMMA, COMPUTE)
        tl.store(Y_ptr + row * n_cols + cols, y, mask=col_mask)


@triton.jit
def _inv_rms(sum_of_squares, n_cols, eps_hi, eps_lo, COMPUTE: tl.constexpr):
    var = sum_of_squares / n_cols
    if COMPUTE == tl.float64:
        var = var + eps_lo
    return tl.rsqrt(var + eps_hi)


@triton.jit
def _scaled(normed, w, x_dtype: tl.constexpr, GEMMA: tl.constexpr, COMPUTE: tl.constexpr):
    """The output in HF's cast order: Gemma scales by (1 + w) in fp32; Llama rounds normed to x's
    dtype first, then multiplies by w."""
    if GEMMA:
        return normed * (1.0 + w)
    return normed.to(x_dtype).to(COMPUTE) * w


@triton.jit
def _rms_norm_row_dot_kernel(
    mean_ptr,  # (n_rows,) COMPUTE: sum(g * normed) / n_cols per row, for the "split" backward
    dX_ptr, dX_s0, dX_s1, dX_s2, dX_col_stride,  # FIXUP only
    dY_ptr, dY_s0, dY_s1, dY_s2, dY_col_stride,
    X_ptr, X_s0, X_s1, X_s2, X_col_stride,
    W_ptr, W_col_stride,
    inv_var_ptr,
    n_rows, n_cols, L1, L2,
    rows_per_program, reserved,  # FIXUP only: the split backward's row ranges and their reserved rows
    GEMMA: tl.constexpr,
    COMPUTE: tl.constexpr,
    CHUNK: tl.constexpr,
    FIXUP: tl.constexpr,  # one reserved row per program: its sum, then its dX (no mean buffer)
):
    if FIXUP:
        i = tl.program_id(0).to(tl.int64)
        row = tl.minimum((i // reserved + 1) * rows_per_program, n_rows) - reserved + i % reserved
    else:
        row = tl.program_id(0).to(tl.int64)
    x_row = X_ptr + _row_offsets(row, L1, L2, X_s0, X_s1, X_s2)
    dy_row = dY_ptr + _row_offsets(row, L1, L2, dY_s0, dY_s1, dY_s2)
    inv_var = tl.load(inv_var_ptr + row)
    x_dtype = X_ptr.dtype.element_ty
    acc = tl.zeros([CHUNK], dtype=COMPUTE)
    for start in tl.range(0, n_cols, CHUNK):
        normed, g = _row_chunk(x_row, X_col_stride, dy_row, dY_col_stride, W_ptr, W_col_stride, inv_var, start,
                               n_cols, x_dtype, GEMMA, COMPUTE, CHUNK)
        acc += g * normed
    mean_g_normed = tl.sum(acc, axis=0) / n_cols
    if not FIXUP:
        tl.store(mean_ptr + row, mean_g_normed)
    else:  # the split backward's closed form, as its 2-D programs compute it
        dx_row = dX_ptr + _row_offsets(row, L1, L2, dX_s0, dX_s1, dX_s2)
        for start in tl.range(0, n_cols, CHUNK):
            normed, g = _row_chunk(x_row, X_col_stride, dy_row, dY_col_stride, W_ptr, W_col_stride, inv_var, start,
                                   n_cols, x_dtype, GEMMA, COMPUTE, CHUNK)
            cols = start + tl.arange(0, CHUNK).to(tl.int64)
            tl.store(dx_row + cols * dX_col_stride, inv_var * (g - normed * mean_g_normed), mask=cols < n_cols)


@triton.jit
def _row_chunk(x_row, X_col_stride, dy_row, dY_col_stride, W_ptr, W_col_stride, inv_var, start, n_cols,
               x_dtype: tl.constexpr, GEMMA: tl.constexpr, COMPUTE: tl.constexpr, CHUNK: tl.constexpr):
    """(normed, g) over columns [start, start + CHUNK) of one row, 0 past its end."""
    cols = start + tl.arange(0, CHUNK).to(tl.int64)
    mask = cols < n_cols
    x = tl.load(x_row + cols * X_col_stride, mask=mask, other=0.0).to(COMPUTE)
    dy = tl.load(dy_row + cols * dY_col_stride, mask=mask, other=0.0).to(COMPUTE)
    w = tl.load(W_ptr + cols * W_col_stride, mask=mask, other=0.0).to(COMPUTE)
    if GEMMA:
        w = 1.0 + w
    return x * inv_var, _normed_gradient(dy, w, x_dtype, GEMMA, COMPUTE)


# Note [The row sums at dX's end]
# The split backward reads each row's sum(g * normed) / n_cols, computed first, in every column chunk.
# Where one row range holds every row, its program stores dW itself and nothing else is allocated,
# so those n_rows sums would be the one buffer beyond what torch.compile holds (its saved rsqrt and
# dW, like the kernels' inv_var and dW). They are kept in dX's last bytes instead, which the 2-D
# launch leaves unwritten; afterwards one program reads the last row's sum from there, waits until
# every thread of it has, and writes the dX those bytes were lent from, with the same arithmetic as
# the 2-D programs: the bits are those of a buffer of their own. It needs dX contiguous, aligned
# for the sums, apart from dY (whose rows are read until the end), and the sums within its last row.
@triton.jit
def _rms_norm_tail_kernel(
    dX_ptr,  # contiguous: its last bytes hold mean_ptr's sums until this program writes them
    dY_ptr, dY_s0, dY_s1, dY_s2, dY_col_stride,
    X_ptr, X_s0, X_s1, X_s2, X_col_stride,
    W_ptr, W_col_stride,
    inv_var_ptr,
    mean_ptr,  # (n_rows,) COMPUTE, inside dX's memory
    n_rows, n_cols, L1, L2,
    first_col,  # the last row's first column whose dX memory holds a sum
    GEMMA: tl.constexpr,
    COMPUTE: tl.constexpr,
    CHUNK: tl.constexpr,
):
    row = tl.cast(n_rows - 1, tl.int64)
    x_row = X_ptr + _row_offsets(row, L1, L2, X_s0, X_s1, X_s2)
    dy_row = dY_ptr + _row_offsets(row, L1, L2, dY_s0, dY_s1, dY_s2)
    inv_var = tl.load(inv_var_ptr + row)
    mean_g_normed = tl.load(mean_ptr + row)
    tl.debug_barrier()  # every thread has read the sum before any overwrites its memory
    for start in tl.range(first_col, n_cols, CHUNK):
        normed, g = _row_chunk(x_row, X_col_stride, dy_row, dY_col_stride, W_ptr, W_col_stride, inv_var, start,
                               n_cols, X_ptr.dtype.element_ty, GEMMA, COMPUTE, CHUNK)
        cols = start + tl.arange(0, CHUNK).to(tl.int64)
        tl.store(dX_ptr + row * n_cols + cols, inv_var * (g - normed * mean_g_normed), mask=cols < n_cols)


@triton.jit
def _normed_gradient(dy, w, x_dtype: tl.constexpr, GEMMA: tl.constexpr, COMPUTE: tl.constexpr):
    """g, the gradient reaching ``normed`` (Gemma's w is already 1 + W): HF's autograd rounds Llama's
    to x's dtype."""
    if GEMMA:
        return dy * w
    return (dy * w).to(x_dtype).to(COMPUTE)


@triton.jit
def _rms_norm_backward_kernel(
    dX_ptr, dX_s0, dX_s1, dX_s2, dX_col_stride,  # input gradient (may be dY's own buffer, opt-in)
    dY_ptr, dY_s0, dY_s1, dY_s2, dY_col_stride,  # incoming gradient, any layout (stride 0 too)
    X_ptr, X_s0, X_s1, X_s2, X_col_stride,  # forward input
    W_ptr, W_col_stride,
    inv_var_ptr,  # saved by forward
    mean_ptr,  # SPLIT only: each row's sum(g * normed) / n_cols, from _rms_norm_row_dot_kernel
    dW_partial_ptr,  # COMPUTE: one partial row per program, this program's sum of dY * normed (_partial_start);
    # or, where one program's rows are all the rows, dW itself (W's dtype: the store rounds once)
    n_rows, n_cols, L1, L2,
    rows_per_program,  # each program owns rows [pid * rows_per_program, ... + rows_per_program)
    reserved,  # the last rows of each program's range whose dX memory holds its partial row (0: a buffer of its own)
    dx_stop,  # TAIL only: dX's elements from here on hold every row's mean (Note [The row sums at dX's end])
    GEMMA: tl.constexpr,
    COMPUTE: tl.constexpr,
    FIXUP: tl.constexpr,  # this launch writes only the reserved rows' dX, once dW has been summed
    TAIL: tl.constexpr,  # SPLIT's row sums are dX's last bytes: no dX written from dx_stop on
    DW: tl.constexpr,  # dW wanted: each program sums its rows' share and writes its partial row
    SPLIT: tl.constexpr,  # columns split over axis 1 of the grid, BLOCK_SIZE each ("split" path)
    ROWS: tl.constexpr,  # rows handled per loop step, as one 2-D block
    BLOCK_SIZE: tl.constexpr,  # the whole row, or one chunk of it (SPLIT)
    NUM_STAGES: tl.constexpr,  # loop iterations whose loads are in flight at once (software pipelining)
):
    pid = tl.program_id(0).to(tl.int64)
    first_row = pid * rows_per_program
    end_row = tl.minimum(first_row + rows_per_program, n_rows)
    dx_end = end_row - reserved  # the main launch writes dX up to here, the fix-up from here
    if FIXUP:
        first_row = dx_end
    cols = tl.program_id(1).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)  # 64-bit addressing
    col_mask = cols < n_cols
    x_dtype = X_ptr.dtype.element_ty

    w = tl.load(W_ptr + cols * W_col_stride, mask=col_mask, other=0.0).to(COMPUTE)
    if GEMMA:
        w = 1.0 + w
    # dW is accumulated per (row lane, column) and reduced over the lanes once at the end: a
    # reduction across warps on every step cost narrow rows a third of their time (H200).
    dw = tl.zeros([ROWS, BLOCK_SIZE], dtype=COMPUTE)

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
        g = _normed_gradient(dy, w[None, :], x_dtype, GEMMA, COMPUTE)
        if DW and not FIXUP:
            if GEMMA:
                dw += dy * normed
            else:
                dw += dy * normed.to(x_dtype).to(COMPUTE)

        # Compute dx (closed form) and write it.
        if SPLIT:
            mean_g_normed = tl.load(mean_ptr + rows, mask=row_mask, other=0.0)
        else:
            mean_g_normed = tl.sum(g * normed, axis=1) / n_cols
        dx = inv_var * (g - normed * mean_g_normed[:, None])
        dx_start = _row_offsets(rows, L1, L2, dX_s0, dX_s1, dX_s2)
        if not FIXUP:
            mask &= (rows < dx_end)[:, None]  # the reserved rows' dX memory holds the partial row
        if TAIL:
            mask &= (rows[:, None] * n_cols + cols[None, :]) < dx_stop
        tl.store(dX_ptr + dx_start[:, None] + cols[None, :] * dX_col_stride, dx, mask=mask)

    if DW and not FIXUP:
        partial = _partial_start(pid, rows_per_program, n_rows, n_cols, reserved,
                                 dX_ptr.dtype.element_ty.primitive_bitwidth // 8, COMPUTE.primitive_bitwidth // 8)
        tl.store(dW_partial_ptr + partial + cols, tl.sum(dw, axis=0), mask=col_mask)


@triton.jit
def _partial_start(pid, rows_per_program, n_rows, n_cols, reserved, DX_BYTES: tl.constexpr,
                   COMPUTE_BYTES: tl.constexpr):
    """Where program ``pid``'s partial row of dW starts, in COMPUTE elements: row pid of a buffer of
    its own, or (reserved > 0) the first COMPUTE-aligned element of its reserved rows in dX (contiguous,
    its start aligned: Note [dW's partial rows inside dX])."""
    dx_end = tl.minimum(pid * rows_per_program + rows_per_program, n_rows) - reserved
    in_dx = tl.cdiv(dx_end * n_cols * DX_BYTES, COMPUTE_BYTES)
    return tl.where(reserved == 0, pid * n_cols, in_dx)


@triton.jit
def _sum_partials_kernel(
    dW_ptr,  # (n_cols,) in W's dtype
    partial_ptr,  # COMPUTE: one partial row per backward program, where _partial_start says
    n_partials, n_cols, n_rows, rows_per_program, reserved,  # as the backward was launched
    DX_BYTES: tl.constexpr,  # the size of dX's elements (where reserved rows hold the partials)
    PARTIALS: tl.constexpr,  # partial rows per step, reduced as one 2-D block
    BLOCK_SIZE: tl.constexpr,  # columns per program
):
    cols = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    col_mask = cols < n_cols
    # Steps and the tree inside each step are fixed by the shapes alone: same inputs, same bits.
    acc = tl.zeros([BLOCK_SIZE], dtype=partial_ptr.dtype.element_ty)
    for start in range(0, n_partials, PARTIALS):
        rows = (start + tl.arange(0, PARTIALS)).to(tl.int64)
        mask = (rows < n_partials)[:, None] & col_mask[None, :]
        starts = _partial_start(rows, rows_per_program, n_rows, n_cols, reserved, DX_BYTES,
                                partial_ptr.dtype.element_ty.primitive_bitwidth // 8)
        acc += tl.sum(tl.load(partial_ptr + starts[:, None] + cols[None, :], mask=mask, other=0.0), axis=0)
    tl.store(dW_ptr + cols, acc, mask=col_mask)


@functools.lru_cache(maxsize=64)  # on every call's path; a model has one or two eps
def _split_eps(eps: float) -> tuple[float, float]:
    """eps as an exactly-fp32 part plus the remainder (Triton passes float scalars as fp32)."""
    hi = float(np.float32(eps))
    return hi, eps - hi


def _stages(step_bytes: int, most: int = 3) -> int:
    """Loop iterations in flight (software pipelining of a step's loads through shared memory): up
    to ``most`` (the launch table's ``stages``), fewer where that many steps' tiles would not fit in
    ~128 KiB (float32 and float64 inputs). The tiles' shared memory is taken from L1: a whole-row
    backward step of 16384 columns left its spills no L1 to hit (ncu on the H200: 0.04% against
    48% for the same spills without pipelining, scripts/rms_norm_backward_ab.py)."""
    for stages in range(most, 1, -1):
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
    if X.shape[-1] > MAX_COLUMNS:
        raise ValueError(f"{X.shape[-1]} columns exceed the kernels' maximum of {MAX_COLUMNS}")
    _checks.require_bool("gemma", gemma)
    _checks.require_bool("write_dx_into_dy", write_dx_into_dy)
    return _checks.require_small_nonnegative("eps", eps)


def _forward_outputs(X: torch.Tensor, W: torch.Tensor, gemma: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Y (contiguous; Llama's dtype follows promotion of X and W, Gemma's is X's) and inv_var (one per
    row, in the compute dtype), unwritten: the real forward fills them, the fake returns them."""
    out_dtype = X.dtype if gemma else torch.promote_types(X.dtype, W.dtype)
    compute = torch.float64 if torch.float64 in (X.dtype, W.dtype) else torch.float32
    n_rows = math.prod(X.shape[:-1])
    return (torch.empty_like(X, dtype=out_dtype, memory_format=torch.contiguous_format),
            X.new_empty(n_rows, dtype=compute))


def forward(X: torch.Tensor, W: torch.Tensor, eps: float, gemma: bool,
            config: Config | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(Y, inv_var) for validated inputs; ``config`` overrides the measured setting (the tuner's)."""
    n_cols = X.shape[-1]
    Y, inv_var = _forward_outputs(X, W, gemma)
    compute = inv_var.dtype
    n_rows = inv_var.numel()
    if n_rows == 0:
        return Y, inv_var
    layout, (X_rows,) = rows_addressable(X)
    slots = program_slots(device_index(X))
    config = config or lookup("forward", n_cols, n_rows, slots, gemma)
    eps_hi, eps_lo = _split_eps(eps)
    args = (Y, X_rows, *layout.strides[0], W, W.stride(0), inv_var, n_rows, n_cols, layout.lead[1], layout.lead[2],
            eps_hi, eps_lo)
    with launching():
        if config.path == "parts":
            parts = cdiv(n_cols, config.chunk)
            words = torch.zeros(n_rows, parts, device=X.device,
                                dtype=torch.int64 if compute == torch.float64 else torch.int32)
            launch(
                _rms_norm_forward_parts_kernel,
                (parts * max(1, min(n_rows, config.programs_per_sm * slots // parts)),),
                *args, words, GEMMA=gemma, COMPUTE=TL_COMPUTE[compute], PARTS=parts, LANES=next_power_of_2(parts),
                CHUNK=config.chunk,
                PATIENCE=min(PATIENCE, 1) if interpreted() else PATIENCE, num_warps=config.warps)
        elif config.path == "overlapped":
            launch(
                _rms_norm_forward_overlapped_kernel, (min(n_rows, config.programs_per_sm * slots),),
                *args, GEMMA=gemma, COMPUTE=TL_COMPUTE[compute], CHUNK=config.chunk, num_warps=config.warps)
        elif config.path == "looped":
            launch(
                _rms_norm_forward_looped_kernel, (min(cdiv(n_rows, config.rows), config.programs_per_sm * slots),),
                *args, GEMMA=gemma, COMPUTE=TL_COMPUTE[compute], ROWS=config.rows, CHUNK=config.chunk,
                NUM_STAGES=_stages(config.rows * config.chunk * X.element_size(), config.stages),
                num_warps=config.warps)
        else:
            launch(
                _rms_norm_forward_kernel, (cdiv(n_rows, config.rows),),
                *args, GEMMA=gemma, COMPUTE=TL_COMPUTE[compute], ROWS=config.rows,
                BLOCK_SIZE=next_power_of_2(n_cols), num_warps=config.warps)
    return Y, inv_var


def backward(dY: torch.Tensor, X: torch.Tensor, W: torch.Tensor, inv_var: torch.Tensor, gemma: bool,
             dX: torch.Tensor, needs_dW: bool, config: Config | None = None) -> torch.Tensor | None:
    """Writes dX (any buffer of X's shape that owns its elements; dY's own, opt-in) and returns dW
    (None unless ``needs_dW``); ``config`` overrides the measured setting (the tuner's)."""
    n_cols = X.shape[-1]
    n_rows = inv_var.numel()
    compute = inv_var.dtype
    # dX is contiguous or dY itself, so only X or dY can ever need the contiguous fallback.
    layout, (dX_rows, dY_rows, X_rows) = rows_addressable(dX, dY, X)
    slots = program_slots(device_index(X))
    config = config or lookup("backward", n_cols, n_rows, slots, gemma)
    split = config.path == "split"
    block = config.chunk if split else next_power_of_2(n_cols)
    chunks = cdiv(n_cols, block)
    rows_per_program = _rows_per_program(n_rows, chunks, config, slots, needs_dW)
    programs = cdiv(n_rows, rows_per_program)
    dW, tail = None, None
    if needs_dW and programs == 1:  # one row range: its partial row is dW itself (Note [dW's partial rows inside dX])
        reserved, dW = 0, torch.empty_like(W, memory_format=torch.contiguous_format)
        dW_partial = dW
        tail = _mean_tail(dX, dY, n_rows, n_cols, compute) if split else None
    elif needs_dW:
        reserved = _reserved_rows(dX, dY, n_rows, n_cols, programs, rows_per_program, compute)
        dW_partial = _partials_in(dX, compute) if reserved else X.new_empty((programs, n_cols), dtype=compute)
    else:  # no partial rows: nothing to hold, sum or fix up
        reserved, dW_partial = 0, inv_var  # (unread)
    mean = inv_var  # read only when split
    dY_strides, X_strides = layout.strides[1], layout.strides[2]
    args = (dX_rows, *layout.strides[0], dY_rows, *dY_strides, X_rows, *X_strides, W, W.stride(0), inv_var)
    shape = (n_rows, n_cols, layout.lead[1], layout.lead[2], rows_per_program, reserved)
    settings = dict(GEMMA=gemma, COMPUTE=TL_COMPUTE[compute], DW=needs_dW, SPLIT=split, ROWS=config.rows,
                    BLOCK_SIZE=block,
                    NUM_STAGES=_stages(config.rows * block * (X.element_size() + dY.element_size()), config.stages),
                    num_warps=config.warps)
    row_dot_args = (*args, *shape)
    row_dot_settings = dict(GEMMA=gemma, COMPUTE=TL_COMPUTE[compute], CHUNK=block, num_warps=config.warps)
    with launching():
        if split:
            mean = torch.empty_like(inv_var) if tail is None else _partials_in(dX, compute)[-n_rows:]
            launch(_rms_norm_row_dot_kernel, (n_rows,), mean, *row_dot_args, FIXUP=False, **row_dot_settings)
        launch(_rms_norm_backward_kernel, (programs, chunks), *args, mean, dW_partial, *shape, tail or 0,
               FIXUP=False, TAIL=tail is not None, **settings)
        if tail is not None:  # Note [The row sums at dX's end]
            launch(_rms_norm_tail_kernel, (1,), dX_rows, dY_rows, *dY_strides, X_rows, *X_strides, W, W.stride(0),
                   inv_var, mean, n_rows, n_cols, layout.lead[1], layout.lead[2], tail - (n_rows - 1) * n_cols,
                   GEMMA=gemma, COMPUTE=TL_COMPUTE[compute], CHUNK=block, num_warps=config.warps)
        mean = None  # the split path's row sums: freed before the partials' dW is allocated (the fix-up sums again)
        if needs_dW and programs > 1:
            dW = torch.empty_like(W, memory_format=torch.contiguous_format)
            sum_partials(dW, dW_partial, programs, n_rows, rows_per_program, reserved, dX.element_size())
        if reserved and split:  # (the fix-ups' mean_ptr is unread: inv_var stands in)
            launch(_rms_norm_row_dot_kernel, (programs * reserved,), inv_var, *row_dot_args, FIXUP=True,
                   **row_dot_settings)
        elif reserved:
            launch(_rms_norm_backward_kernel, (programs, chunks), *args, inv_var, dW_partial, *shape, 0, FIXUP=True,
                   TAIL=False, **settings)
    return dW


def _rows_per_program(n_rows: int, chunks: int, config: Config, slots: int, needs_dW: bool) -> int:
    """The backward's row range per program: the setting's programs per SM fill the device, and where
    dW is summed no lane adds more than DW_STEPS rows. Note [dW's serial sums]

        Each program adds its rows' dY * normed into a [ROWS, BLOCK] fp32 accumulator one step after
        another, so the typical error of a partial row grows with the square root of its steps. The
        table picks settings for speed at 2^26 elements, where no program takes more than about 90
        steps; the same setting at 16384 x 65536 gave the split path 3 programs a chunk, 1366 steps
        each, and the H200's gate found fp32 dW 1.61x less precise than with the baseline's 497 steps
        (Llama and Gemma alike, as the square root says). Bounding the steps adds programs, and
        partial rows (at most 1/64 of dX's bytes), only at row counts far beyond the measured shape.
    """
    programs = min(n_rows, cdiv(config.programs_per_sm * slots, chunks))
    rows_per_program = cdiv(n_rows, programs)
    return min(rows_per_program, DW_STEPS * config.rows) if needs_dW else rows_per_program


def sum_partials(dW: torch.Tensor, partials: torch.Tensor, programs: int, n_rows: int, rows_per_program: int,
                 reserved: int, dx_bytes: int, columns: int | None = None) -> None:
    """dW = the sum of the backward programs' partial rows, where _partial_start puts them (a launch of its
    own: scripts/backward_floor.py times it alone), ``columns`` a program (default: _sum_columns)."""
    n_cols = dW.numel()
    columns = _sum_columns(n_cols) if columns is None else columns
    if columns < 1 or columns & (columns - 1):
        raise ValueError(f"sum_partials: columns a program must be a power of two, got {columns}")
    launch(_sum_partials_kernel, (cdiv(n_cols, columns),), dW, partials, programs, n_cols, n_rows, rows_per_program,
           reserved, DX_BYTES=dx_bytes, PARTIALS=32, BLOCK_SIZE=columns)


def _sum_columns(n_cols: int) -> int:
    """Columns per program of the partials' sum. Up to 4096 columns, 64 a program left most SMs idle (4
    programs at 256 columns): 16 took the H100's sum from 10.7-11.3 to 7.8-8.7 us, the same bits up to
    2048 (scripts/rms_norm_dw_sum_ab.py). Wider rows keep 64, which fills the device already (not
    measured there)."""
    return 16 if n_cols <= 4096 else 64


def _reserved_rows(dX: torch.Tensor, dY: torch.Tensor, n_rows: int, n_cols: int, programs: int,
                   rows_per_program: int, compute: torch.dtype) -> int:
    """How many of each program's last rows lend their dX memory to its partial row of dW (0: the
    partials get a buffer of their own). Note [dW's partial rows inside dX]

        The partials are programs x n_cols in fp32: 4 to 8.6 MiB beside a 128 MiB dX from 8192
        columns on the H200, where torch.compile holds nothing but its outputs. So when they would
        add more than 1% to dX, each program writes its partial row into the dX memory of its own
        last rows, and leaves those rows' dX for a second launch of the same kernel (FIXUP) after
        the partials are summed: those rows are read twice, the same share of the rows as the
        memory saved. The sums, and so the bits of dX and dW, are the same either way. It needs dX
        contiguous and COMPUTE-aligned, the rows it lends (rounded to whole COMPUTE elements) in
        every program, and dX apart from dY: the fix-up reads those rows' dY again. On the split
        path the fix-up is one program per reserved row that sums the row again, so the buffer of
        every row's sum is freed before dW is allocated: it would be the one allocation beyond what
        torch.compile holds. Where one program's range holds every row (a chunk of columns per
        program, as at 65536 columns), its partial row is dW itself: nothing to lend or sum. Where
        W needs no gradient there are no partial rows (DW=False): nothing to hold, sum or fix up.
    """
    compute_bytes, dx_bytes = compute.itemsize, dX.element_size()
    if programs * n_cols * compute_bytes * LEND_ABOVE <= dX.numel() * dx_bytes:
        return 0
    if not _can_lend(dX, dY, compute):
        return 0
    # rows for n_cols COMPUTE elements from the first aligned byte: one more where a row may start mid element
    reserved = cdiv(compute_bytes, dx_bytes) + ((n_cols * dx_bytes) % compute_bytes != 0)
    fewest_rows = min(rows_per_program, n_rows - (programs - 1) * rows_per_program)
    return reserved if fewest_rows >= reserved else 0


def _mean_tail(dX: torch.Tensor, dY: torch.Tensor, n_rows: int, n_cols: int, compute: torch.dtype) -> int | None:
    """The first element of dX whose memory holds the split path's row sums, its last n_rows COMPUTE
    elements (None: they get a buffer of their own). Note [The row sums at dX's end]"""
    if not _can_lend(dX, dY, compute):
        return None
    first = (_partials_in(dX, compute).numel() - n_rows) * compute.itemsize // dX.element_size()
    return first if first >= (n_rows - 1) * n_cols else None


def _can_lend(dX: torch.Tensor, dY: torch.Tensor, compute: torch.dtype) -> bool:
    """dX's memory can hold COMPUTE values until a later launch writes dX there: contiguous, aligned
    for them, and apart from dY, which that launch still reads."""
    return dX.is_contiguous() and dX.data_ptr() % compute.itemsize == 0 and not _checks.overlaps(dX, dY)


def _partials_in(dX: torch.Tensor, compute: torch.dtype) -> torch.Tensor:
    """dX's memory as a flat COMPUTE tensor (contiguous and aligned: _can_lend)."""
    flat = dX.view(-1).view(torch.uint8)
    return flat[:flat.numel() // compute.itemsize * compute.itemsize].view(compute)


# --- the custom ops (kernels/_library.py) --------------------------------------------------------


@custom_op("rms_norm")
def _rms_norm_op(X: torch.Tensor, W: torch.Tensor, eps: float, gemma: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(Y, inv_var): inv_var is what backward needs, an output so that autograd can save it."""
    return forward(X, W, eps, gemma)


@custom_op("rms_norm_backward")
def _rms_norm_backward_op(dY: torch.Tensor, X: torch.Tensor, W: torch.Tensor, inv_var: torch.Tensor, gemma: bool,
                          needs_dW: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(dX, dW) in new tensors; dW is empty (0 elements) unless ``needs_dW``: an op returns tensors."""
    dX, dW = _backward_outputs(X, W, needs_dW)
    if inv_var.numel() == 0:  # no rows: nothing to launch, and a dW of zeros
        return dX, dW.zero_()
    dW_sum = backward(dY, X, W, inv_var, gemma, dX, needs_dW)
    return dX, dW if dW_sum is None else dW_sum


def _backward_outputs(X: torch.Tensor, W: torch.Tensor, needs_dW: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty_like(X, memory_format=torch.contiguous_format),
            W.new_empty(X.shape[-1] if needs_dW else 0))


@_rms_norm_op.register_fake
def _(X, W, eps, gemma):
    return _forward_outputs(X, W, gemma)


@_rms_norm_backward_op.register_fake
def _(dY, X, W, inv_var, gemma, needs_dW):
    return _backward_outputs(X, W, needs_dW)


def _setup_context(ctx, inputs, output):
    X, W, eps, gemma = inputs
    _, inv_var = output
    ctx.mark_non_differentiable(inv_var)
    ctx.save_for_backward(X, W, inv_var)
    ctx.gemma = gemma


def _backward_formula(ctx, dY, _inv_var_grad):
    X, W, inv_var = ctx.saved_tensors
    needs_dW = ctx.needs_input_grad[1]
    dX, dW = _rms_norm_backward_op(dY, X, W, inv_var, ctx.gemma, needs_dW)
    return dX, dW if needs_dW else None, None, None


_rms_norm_op.register_autograd(_backward_formula, setup_context=_setup_context)


# --- eager mode ---------------------------------------------------------------------------------


class RMSNormFunction(torch.autograd.Function):
    """rms_norm in eager mode (kernels/_library.py, Note [Eager autograd skips the dispatcher]): the
    same forward and backward as the ops, and the opt-in write of dX into the incoming gradient.

    Note [write_dx_into_dy is eager only]
        That mode cannot be a custom op. The buffer is a gradient autograd hands backward, and the
        op would have to mutate it and return it as dX: a custom op may not return an alias of its
        input, and an op that mutates may not have an autograd formula (torch refuses both). Under
        torch.compile the gradient is a tangent that AOTAutograd owns, and Inductor reuses dead
        buffers on its own, which is the memory this mode saves. So the mode runs this Function in
        eager mode even inside a compiled region (``torch.compiler.disable``: one graph break per
        call instead of a failed trace).
    """

    @staticmethod
    def forward(ctx, X, W, eps, gemma, write_dx_into_dy):
        Y, inv_var = forward(X, W, eps, gemma)
        ctx.save_for_backward(X, W, inv_var)
        ctx.gemma = gemma
        ctx.write_dx_into_dy = write_dx_into_dy
        return Y

    @staticmethod
    def backward(ctx, dY):
        X, W, inv_var = ctx.saved_tensors
        if inv_var.numel() == 0:
            return torch.zeros_like(X), torch.zeros_like(W), None, None, None
        in_place = ctx.write_dx_into_dy and _can_overwrite(dY, X, W)
        dX = dY if in_place else torch.empty_like(X, memory_format=torch.contiguous_format)
        dW = backward(dY, X, W, inv_var, ctx.gemma, dX, ctx.needs_input_grad[1])
        return dX, dW, None, None, None


@torch.compiler.disable
def _rms_norm_writing_dx_into_dy(X, W, eps, gemma):
    return RMSNormFunction.apply(X, W, eps, gemma, True)


def _can_overwrite(dY: torch.Tensor, X: torch.Tensor, W: torch.Tensor) -> bool:
    """dY's buffer can take dX only if it has X's dtype, owns each of its elements exactly once, and
    shares no memory with X or W, which other programs may still be reading."""
    return dY.dtype == X.dtype and dY.shape == X.shape and dY.is_contiguous() and \
        not _checks.overlaps(dY, X) and not _checks.overlaps(dY, W)


@calls(_rms_norm_op)
def rms_norm(X: torch.Tensor, W: torch.Tensor, eps: float, gemma: bool = False, *,
             write_dx_into_dy: bool = False) -> torch.Tensor:
    """RMSNorm over the last dimension of X, as HF's LlamaRMSNorm (or GemmaRMSNorm with ``gemma=True``).

    X: (..., n_cols) in any layout, n_cols <= 65536; W: (n_cols,) with X's dtype or float32.
    Differentiable in X and W. Llama's output dtype follows type promotion of W and X, as in HF;
    Gemma's is X's. The op ``kernel_oracle::rms_norm`` (its backward ``rms_norm_backward``), so
    torch.compile keeps it in its graph.

    ``write_dx_into_dy=True`` lets backward write dX into the incoming gradient's buffer, saving
    one activation. UNSAFE when that gradient is shared: a residual add hands the same gradient
    tensor to both branches, and the other branch then reads dX instead. Only for callers that own
    the gradient buffer. Ignored when dY cannot hold dX (other dtype, non-contiguous, expanded, or
    sharing memory with X or W). Eager only: under torch.compile it is a graph break (Note
    [write_dx_into_dy is eager only]).

    ``eps``: a real number in [0, 3.4e38]; ``gemma`` and ``write_dx_into_dy``: bools (TypeError otherwise).
    """
    eps = _validate(X, W, eps, gemma, write_dx_into_dy)
    if write_dx_into_dy:
        return _rms_norm_writing_dx_into_dy(X, W, eps, gemma)
    if tracing():
        return _rms_norm_op(X, W, eps, gemma)[0]
    if torch.is_grad_enabled() and (X.requires_grad or W.requires_grad):
        return RMSNormFunction.apply(X, W, eps, gemma, False)
    return forward(X, W, eps, gemma)[0]  # nothing to differentiate: no autograd node to build
