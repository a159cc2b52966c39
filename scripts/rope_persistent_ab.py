"""RoPE with persistent programs, a few an SM, each looping over (token, group) items in the shipped order (GPU).

The shipped rotation (kernels/rope.py) launches one program of one warp per token and group of 8
heads: 524288 programs at Llama-3-8B's shape (batch 4, seq 4096, 32 heads), each loading 2 KiB of Q
(plus 512 B of K in the first group's) and its 1 KiB table row, then storing. Plain RoPE's
forward+backward ties with torch.compile's (0.99-1.00x on the H200, 1.12x the floor its bytes set at
the copy's speed), and programs in any other order were slower (``scripts/rope_order_ab.py``). Here
PER_SM programs an SM each walk the items p, p + programs, ... in the shipped order (a batch's tokens,
then the next batch's, group after group), so consecutive programs still hold neighbouring rows;
with ``tl.range``'s NUM_STAGES the next item's loads can be issued before this item's stores. What
it can win: the cost of starting half a million programs, and the pause between a program's loads
and the next program's.

Every variant gives the shipped bits (checked before timing, and on a CPU by ``--check``); timed as
``scripts/rope_tokens_ab.py`` times, plain and packed.

    python scripts/rope_persistent_ab.py            # on the GPU machine
    python scripts/rope_persistent_ab.py --check    # any machine: each variant against the shipped bits
"""

from __future__ import annotations

import sys
from pathlib import Path

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.rope_order_ab import GROUP, _rotate_heads, table_row  # noqa: E402 - after the path

# name: (programs an SM, software-pipelining stages of the item loop)
VARIANTS = {f"{per_sm} an SM, {stages} stage{'s' if stages > 1 else ''}": (per_sm, stages)
            for per_sm in (8, 16, 32) for stages in (1, 2)}


@triton.jit(debug=True)  # the shipped kernel's range assertion, as shipped
def _rope_persistent_kernel(
    Qin_ptr, Qin_sb, Qin_sh, Qin_ss, Qin_sd, Qout_ptr, Qout_sb, Qout_sh, Qout_ss, Qout_sd,
    Kin_ptr, Kin_sb, Kin_sh, Kin_ss, Kin_sd, Kout_ptr, Kout_sb, Kout_sh, Kout_ss, Kout_sd,
    cos_ptr, cos_row_stride, cos_col_stride, sin_ptr, sin_row_stride, sin_col_stride,
    pos_ptr, pos_b_stride, pos_s_stride,
    max_pos, seq_len, n_heads, n_kv_heads, half_dim, n_items,
    HAS_POSITIONS: tl.constexpr, BACKWARD_PASS: tl.constexpr, COMPUTE: tl.constexpr,
    GROUP_SIZE: tl.constexpr, BLOCK_HALF: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    tokens = n_items // tl.cdiv(n_heads, GROUP_SIZE)
    cols = tl.arange(0, BLOCK_HALF).to(tl.int64)
    for item in tl.range(tl.program_id(0).to(tl.int64), n_items, tl.num_programs(0), num_stages=NUM_STAGES):
        token = item % tokens  # the shipped grid's order: tokens fastest, then groups
        b = token // seq_len
        s = token % seq_len
        heads = (item // tokens) * GROUP_SIZE + tl.arange(0, GROUP_SIZE)
        col_mask, c1, c2, sa, sb = table_row(
            b, s, cols, cos_ptr, cos_row_stride, cos_col_stride, sin_ptr, sin_row_stride, sin_col_stride,
            pos_ptr, pos_b_stride, pos_s_stride, max_pos, half_dim, Qout_ptr.dtype.element_ty,
            HAS_POSITIONS, BACKWARD_PASS, COMPUTE, "")
        _rotate_heads(Qin_ptr, Qin_sb, Qin_sh, Qin_ss, Qin_sd, Qout_ptr, Qout_sb, Qout_sh, Qout_ss, Qout_sd,
                      b, s, heads, n_heads, cols, col_mask, half_dim, c1, c2, sa, sb, COMPUTE)
        _rotate_heads(Kin_ptr, Kin_sb, Kin_sh, Kin_ss, Kin_sd, Kout_ptr, Kout_sb, Kout_sh, Kout_ss, Kout_sd,
                      b, s, heads, n_kv_heads, cols, col_mask, half_dim, c1, c2, sa, sb, COMPUTE)


def launch_variant(variant, Q_in, Q_out, K_in, K_out, cos, sin, position_ids, backward: bool) -> None:
    """kernels/rope.py's _launch with PER_SM persistent programs an SM."""
    from kernels import _checks
    from kernels._launch import TL_COMPUTE, cdiv, device_index, next_power_of_2, program_slots
    from kernels.rope import rope_warps

    per_sm, stages = variant
    batch, n_heads, seq, head_dim = Q_out.shape
    block_half = next_power_of_2(head_dim // 2)
    pos = position_ids if position_ids is not None else cos
    pos_strides = position_ids.stride() if position_ids is not None else (0, 0)
    n_items = batch * seq * cdiv(n_heads, GROUP)
    programs = min(n_items, per_sm * program_slots(device_index(Q_out)))  # 4 slots on a CPU: the loop runs
    _rope_persistent_kernel[(programs,)](
        Q_in, *Q_in.stride(), Q_out, *Q_out.stride(), K_in, *K_in.stride(), K_out, *K_out.stride(),
        cos, *cos.stride(), sin, *sin.stride(), pos, *pos_strides,
        cos.shape[0], seq, n_heads, K_out.shape[1], head_dim // 2, n_items,
        HAS_POSITIONS=position_ids is not None, BACKWARD_PASS=backward,
        COMPUTE=TL_COMPUTE[_checks.compute_dtype(Q_out)], GROUP_SIZE=GROUP, BLOCK_HALF=block_half,
        NUM_STAGES=stages, num_warps=rope_warps(block_half), enable_fp_fusion=False,
    )


if __name__ == "__main__":
    from scripts.rope_tokens_ab import variants_main

    # heads not a multiple of GROUP, K's fewer, more items than programs: every mask and the loop
    variants_main(__doc__.splitlines()[0], VARIANTS, launch_variant,
                  dict(batch=3, heads=12, kv_heads=3, seq=7, head_dim=10))
