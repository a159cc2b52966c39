"""RoPE with L2 eviction hints: the table's rows kept, Q's and K's streams let go first (GPU).

Plain RoPE's forward+backward is slower than packed RoPE's through the same code, by the position
values alone (``scripts/rope_positions_ab.py``): a plain token reads its own table row (1 KiB in
float32, once for each of its four programs, which run far apart in time), a packed token mostly
rows that other tokens just read. Between two reads of one row, megabytes of Q and K stream through
L2, so a plain row may have been pushed out and come again from HBM. Here the kernel is the shipped
one with cache hints: the table's loads ``evict_last`` (kept in L2 before other lines), Q's and K's
loads and the stores ``evict_first`` (each is touched once), alone and together. On an H100 the
table's hint changed nothing and the stores' hint alone won 0.8-1.4%, plain and packed; kernels/rope.py
now stores so, and its launch (this script's "shipped") is the "stores first" row.

Every variant gives the shipped bits (checked before timing, and on a CPU by ``--check``); timed as
``scripts/rope_tokens_ab.py`` times, plain and packed.

    python scripts/rope_eviction_ab.py            # on the GPU machine
    python scripts/rope_eviction_ab.py --check    # any machine: each variant against the shipped bits
"""

from __future__ import annotations

import sys
from pathlib import Path

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.rope_order_ab import GROUP, table_row  # noqa: E402 - after the path

LAST, FIRST, NONE = "evict_last", "evict_first", ""
# name: (the table's loads, Q's and K's loads, the stores)
VARIANTS = {
    "table kept": (LAST, NONE, NONE),
    "Q/K loads first": (NONE, FIRST, NONE),
    "stores first": (NONE, NONE, FIRST),
    "table kept, loads first": (LAST, FIRST, NONE),
    "table kept, stores first": (LAST, NONE, FIRST),
    "table kept, rest first": (LAST, FIRST, FIRST),
}


@triton.jit
def _rotate_heads_hinted(
    In_ptr, In_sb, In_sh, In_ss, In_sd, Out_ptr, Out_sb, Out_sh, Out_ss, Out_sd,
    b, s, heads, n_heads, cols, col_mask, half_dim, c1, c2, sa, sb,
    COMPUTE: tl.constexpr, LOAD_POLICY: tl.constexpr, STORE_POLICY: tl.constexpr,
):
    """kernels/rope.py's _rotate_heads with eviction hints on its loads and stores."""
    dtype: tl.constexpr = Out_ptr.dtype.element_ty
    mask = (heads < n_heads)[:, None] & col_mask[None, :]
    row_in = In_ptr + b * In_sb + s * In_ss + heads[:, None] * In_sh
    x1 = tl.load(row_in + cols[None, :] * In_sd, mask=mask, other=0.0, eviction_policy=LOAD_POLICY).to(COMPUTE)
    x2 = tl.load(row_in + (cols[None, :] + half_dim) * In_sd, mask=mask, other=0.0,
                 eviction_policy=LOAD_POLICY).to(COMPUTE)
    y1 = (x1 * c1[None, :]).to(dtype).to(COMPUTE) + (x2 * sa[None, :]).to(dtype).to(COMPUTE)
    y2 = (x2 * c2[None, :]).to(dtype).to(COMPUTE) + (x1 * sb[None, :]).to(dtype).to(COMPUTE)
    row_out = Out_ptr + b * Out_sb + s * Out_ss + heads[:, None] * Out_sh
    tl.store(row_out + cols[None, :] * Out_sd, y1, mask=mask, eviction_policy=STORE_POLICY)
    tl.store(row_out + (cols[None, :] + half_dim) * Out_sd, y2, mask=mask, eviction_policy=STORE_POLICY)


@triton.jit(debug=True)  # the shipped kernel's range assertion, as shipped
def _rope_hinted_kernel(
    Qin_ptr, Qin_sb, Qin_sh, Qin_ss, Qin_sd, Qout_ptr, Qout_sb, Qout_sh, Qout_ss, Qout_sd,
    Kin_ptr, Kin_sb, Kin_sh, Kin_ss, Kin_sd, Kout_ptr, Kout_sb, Kout_sh, Kout_ss, Kout_sd,
    cos_ptr, cos_row_stride, cos_col_stride, sin_ptr, sin_row_stride, sin_col_stride,
    pos_ptr, pos_b_stride, pos_s_stride,
    max_pos, seq_len, n_heads, n_kv_heads, half_dim,
    HAS_POSITIONS: tl.constexpr, BACKWARD_PASS: tl.constexpr, COMPUTE: tl.constexpr,
    GROUP_SIZE: tl.constexpr, BLOCK_HALF: tl.constexpr,
    TABLE_POLICY: tl.constexpr, LOAD_POLICY: tl.constexpr, STORE_POLICY: tl.constexpr,
):
    """kernels/rope.py's _rope_kernel with the three eviction hints (the table row's: table_row's POLICY)."""
    token = tl.program_id(0).to(tl.int64)
    b = token // seq_len
    s = token % seq_len
    heads = tl.program_id(1).to(tl.int64) * GROUP_SIZE + tl.arange(0, GROUP_SIZE)
    cols = tl.arange(0, BLOCK_HALF).to(tl.int64)
    col_mask, c1, c2, sa, sb = table_row(
        b, s, cols, cos_ptr, cos_row_stride, cos_col_stride, sin_ptr, sin_row_stride, sin_col_stride,
        pos_ptr, pos_b_stride, pos_s_stride, max_pos, half_dim, Qout_ptr.dtype.element_ty,
        HAS_POSITIONS, BACKWARD_PASS, COMPUTE, TABLE_POLICY)
    _rotate_heads_hinted(Qin_ptr, Qin_sb, Qin_sh, Qin_ss, Qin_sd, Qout_ptr, Qout_sb, Qout_sh, Qout_ss, Qout_sd,
                         b, s, heads, n_heads, cols, col_mask, half_dim, c1, c2, sa, sb,
                         COMPUTE, LOAD_POLICY, STORE_POLICY)
    _rotate_heads_hinted(Kin_ptr, Kin_sb, Kin_sh, Kin_ss, Kin_sd, Kout_ptr, Kout_sb, Kout_sh, Kout_ss, Kout_sd,
                         b, s, heads, n_kv_heads, cols, col_mask, half_dim, c1, c2, sa, sb,
                         COMPUTE, LOAD_POLICY, STORE_POLICY)


def launch_variant(variant, Q_in, Q_out, K_in, K_out, cos, sin, position_ids, backward: bool) -> None:
    """kernels/rope.py's _launch, the grid and warps as shipped, with the variant's hints."""
    from kernels import _checks
    from kernels._launch import TL_COMPUTE, cdiv, next_power_of_2
    from kernels.rope import rope_warps

    table_policy, load_policy, store_policy = variant
    batch, n_heads, seq, head_dim = Q_out.shape
    block_half = next_power_of_2(head_dim // 2)
    pos = position_ids if position_ids is not None else cos
    pos_strides = position_ids.stride() if position_ids is not None else (0, 0)
    _rope_hinted_kernel[(batch * seq, cdiv(n_heads, GROUP))](
        Q_in, *Q_in.stride(), Q_out, *Q_out.stride(), K_in, *K_in.stride(), K_out, *K_out.stride(),
        cos, *cos.stride(), sin, *sin.stride(), pos, *pos_strides,
        cos.shape[0], seq, n_heads, K_out.shape[1], head_dim // 2,
        HAS_POSITIONS=position_ids is not None, BACKWARD_PASS=backward,
        COMPUTE=TL_COMPUTE[_checks.compute_dtype(Q_out)], GROUP_SIZE=GROUP, BLOCK_HALF=block_half,
        TABLE_POLICY=table_policy, LOAD_POLICY=load_policy, STORE_POLICY=store_policy,
        num_warps=rope_warps(block_half), enable_fp_fusion=False,
    )


if __name__ == "__main__":
    from scripts.rope_tokens_ab import variants_main

    # heads not a multiple of GROUP, K's fewer: every mask
    variants_main(__doc__.splitlines()[0], VARIANTS, launch_variant,
                  dict(batch=2, heads=12, kv_heads=3, seq=7, head_dim=10))
