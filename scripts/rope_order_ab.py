"""RoPE's programs in another order, so the table rows one position needs are read while still in L2 (GPU).

The shipped rotation (kernels/rope.py) launches a (batch * seq, head groups) grid: the GPU runs the
first coordinate fastest, so it walks batch 0's tokens, then batch 1's, each for the first group of
heads, and only then the second group. A plain rotation's token reads its own row of the float32
table (1 KiB of cos and sin), and the same row is wanted again by the same position in every other
batch and every other head group: a whole batch of Q and K (about 40 MiB at Llama-3-8B's shape), or
the whole pass, later, by which time L2 has let it go. Packed positions restart at each document, so
their rows stay in L2; that is the guess for why the packed rotation runs 3% faster than the plain
one through the same code (``scripts/rope_positions_ab.py``). The variants here launch one program a
(token, group) on a 1-D grid and decode it in another order:

    shipped order    groups outer, then batch, then positions (the shipped grid's order, for control)
    batch inner      groups outer, then positions, then batch: a position's batches run together
    groups inner     positions, then batch, then groups: all 16 programs of one position run together
    groups inner, K apart    the same, K's heads in programs of their own (5 groups of 8 at GQA 32/8)

Every variant gives the shipped bits (checked before timing, and on a CPU by ``--check``). On the H200
every other order was slower than the shipped one, plain and packed (docs/performance.md, the
eighteenth session): the guess was wrong. Timed as
``scripts/rope_tokens_ab.py`` times (the clone, the forward in place, the backward into new tensors,
CUDA graphs in turns with torch.compile's forward+backward), plain and packed, at Llama-3-8B's shape.

    python scripts/rope_order_ab.py                 # on the GPU machine
    python scripts/rope_order_ab.py --check         # any machine: each variant against the shipped bits
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

_rope = importlib.import_module("kernels.rope")  # the module; the package's rope is the function
_rotate_heads = _rope._rotate_heads
GROUP = _rope.GROUP_SIZE  # heads a program, as shipped
# name: (order, K in programs of its own); order 0 shipped, 1 batch inner, 2 groups inner
VARIANTS = {
    "shipped order": (0, False),
    "batch inner": (1, False),
    "groups inner": (2, False),
    "groups inner, K apart": (2, True),
}


@triton.jit
def table_row(b, s, cols, cos_ptr, cos_row_stride, cos_col_stride, sin_ptr, sin_row_stride, sin_col_stride,
              pos_ptr, pos_b_stride, pos_s_stride, max_pos, half_dim, dtype: tl.constexpr,
              HAS_POSITIONS: tl.constexpr, BACKWARD_PASS: tl.constexpr, COMPUTE: tl.constexpr,
              POLICY: tl.constexpr):
    """The shipped kernel's table row for token (b, s), its loads and casts: (the columns' mask, c1, c2, sa, sb).
    POLICY: the table loads' L2 eviction hint ("" as shipped; scripts/rope_eviction_ab.py tries others)."""
    col_mask = cols < half_dim
    if HAS_POSITIONS:
        pos = tl.load(pos_ptr + b * pos_b_stride + s * pos_s_stride).to(tl.int64)
        inside = (pos >= 0) & (pos < max_pos)
        tl.device_assert(inside, "position_ids outside the table's rows")
        pos = tl.where(inside, pos, 0)
        col_mask = cols < tl.where(inside, half_dim, 0)
    else:
        pos = s
    cos_row = cos_ptr + pos * cos_row_stride
    sin_row = sin_ptr + pos * sin_row_stride
    second = cols + half_dim
    c1 = tl.load(cos_row + cols * cos_col_stride, mask=col_mask, other=0.0, eviction_policy=POLICY)
    c2 = tl.load(cos_row + second * cos_col_stride, mask=col_mask, other=0.0, eviction_policy=POLICY)
    s1 = tl.load(sin_row + cols * sin_col_stride, mask=col_mask, other=0.0, eviction_policy=POLICY)
    s2 = tl.load(sin_row + second * sin_col_stride, mask=col_mask, other=0.0, eviction_policy=POLICY)
    c1, c2 = c1.to(dtype).to(COMPUTE), c2.to(dtype).to(COMPUTE)  # rounded to the model dtype, as shipped
    s1, s2 = s1.to(dtype).to(COMPUTE), s2.to(dtype).to(COMPUTE)
    if BACKWARD_PASS:
        return col_mask, c1, c2, s2, -s1
    else:
        return col_mask, c1, c2, -s1, s2


@triton.jit(debug=True)  # the shipped kernel's range assertion, as shipped
def _rope_order_kernel(
    Qin_ptr, Qin_sb, Qin_sh, Qin_ss, Qin_sd, Qout_ptr, Qout_sb, Qout_sh, Qout_ss, Qout_sd,
    Kin_ptr, Kin_sb, Kin_sh, Kin_ss, Kin_sd, Kout_ptr, Kout_sb, Kout_sh, Kout_ss, Kout_sd,
    cos_ptr, cos_row_stride, cos_col_stride, sin_ptr, sin_row_stride, sin_col_stride,
    pos_ptr, pos_b_stride, pos_s_stride,
    max_pos, batch, seq_len, n_heads, n_kv_heads, half_dim, n_groups,
    HAS_POSITIONS: tl.constexpr, BACKWARD_PASS: tl.constexpr, COMPUTE: tl.constexpr,
    ORDER: tl.constexpr, SPLIT_K: tl.constexpr, GROUP_SIZE: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    tokens = batch * seq_len
    if ORDER == 0:
        group = pid // tokens
        b = (pid % tokens) // seq_len
        s = pid % seq_len
    elif ORDER == 1:
        group = pid // tokens
        s = (pid % tokens) // batch
        b = pid % batch
    else:
        group = pid % n_groups
        s = (pid // n_groups) // batch
        b = (pid // n_groups) % batch
    cols = tl.arange(0, BLOCK_HALF).to(tl.int64)
    col_mask, c1, c2, sa, sb = table_row(
        b, s, cols, cos_ptr, cos_row_stride, cos_col_stride, sin_ptr, sin_row_stride, sin_col_stride,
        pos_ptr, pos_b_stride, pos_s_stride, max_pos, half_dim, Qout_ptr.dtype.element_ty,
        HAS_POSITIONS, BACKWARD_PASS, COMPUTE, "")
    q_groups = tl.cdiv(n_heads, GROUP_SIZE)
    if SPLIT_K:
        if group < q_groups:
            heads = group * GROUP_SIZE + tl.arange(0, GROUP_SIZE)
            _rotate_heads(Qin_ptr, Qin_sb, Qin_sh, Qin_ss, Qin_sd, Qout_ptr, Qout_sb, Qout_sh, Qout_ss, Qout_sd,
                          b, s, heads, n_heads, cols, col_mask, half_dim, c1, c2, sa, sb, COMPUTE)
        else:
            heads = (group - q_groups) * GROUP_SIZE + tl.arange(0, GROUP_SIZE)
            _rotate_heads(Kin_ptr, Kin_sb, Kin_sh, Kin_ss, Kin_sd, Kout_ptr, Kout_sb, Kout_sh, Kout_ss, Kout_sd,
                          b, s, heads, n_kv_heads, cols, col_mask, half_dim, c1, c2, sa, sb, COMPUTE)
    else:
        heads = group * GROUP_SIZE + tl.arange(0, GROUP_SIZE)
        _rotate_heads(Qin_ptr, Qin_sb, Qin_sh, Qin_ss, Qin_sd, Qout_ptr, Qout_sb, Qout_sh, Qout_ss, Qout_sd,
                      b, s, heads, n_heads, cols, col_mask, half_dim, c1, c2, sa, sb, COMPUTE)
        _rotate_heads(Kin_ptr, Kin_sb, Kin_sh, Kin_ss, Kin_sd, Kout_ptr, Kout_sb, Kout_sh, Kout_ss, Kout_sd,
                      b, s, heads, n_kv_heads, cols, col_mask, half_dim, c1, c2, sa, sb, COMPUTE)


def launch_variant(variant, Q_in, Q_out, K_in, K_out, cos, sin, position_ids, backward: bool) -> None:
    """kernels/rope.py's _launch on a 1-D grid decoded in the variant's order."""
    from kernels import _checks
    from kernels._launch import TL_COMPUTE, cdiv, next_power_of_2
    from kernels.rope import rope_warps

    order, split_k = variant
    batch, n_heads, seq, head_dim = Q_out.shape
    n_kv_heads = K_out.shape[1]
    block_half = next_power_of_2(head_dim // 2)
    pos = position_ids if position_ids is not None else cos
    pos_strides = position_ids.stride() if position_ids is not None else (0, 0)
    n_groups = cdiv(n_heads, GROUP) + (cdiv(n_kv_heads, GROUP) if split_k else 0)
    _rope_order_kernel[(batch * seq * n_groups,)](
        Q_in, *Q_in.stride(), Q_out, *Q_out.stride(), K_in, *K_in.stride(), K_out, *K_out.stride(),
        cos, *cos.stride(), sin, *sin.stride(), pos, *pos_strides,
        cos.shape[0], batch, seq, n_heads, n_kv_heads, head_dim // 2, n_groups,
        HAS_POSITIONS=position_ids is not None, BACKWARD_PASS=backward,
        COMPUTE=TL_COMPUTE[_checks.compute_dtype(Q_out)], ORDER=order, SPLIT_K=split_k, GROUP_SIZE=GROUP,
        BLOCK_HALF=block_half, num_warps=rope_warps(block_half), enable_fp_fusion=False,
    )


if __name__ == "__main__":
    from scripts.rope_tokens_ab import variants_main

    # heads not a multiple of GROUP, K's fewer: every mask and both K layouts exercised
    variants_main(__doc__.splitlines()[0], VARIANTS, launch_variant,
                  dict(batch=3, heads=12, kv_heads=3, seq=7, head_dim=10))
