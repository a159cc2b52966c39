"""RoPE with several tokens a program, and K's heads in programs of their own, against the shipped kernel (GPU).

The shipped rotation (kernels/rope.py) gives each program one token and GROUP_SIZE heads: 8 head
rows of 256 bytes (bf16, head_dim 128) lying a whole head apart in a contiguous (batch, heads, seq,
head_dim) Q, plus K's heads in the first group's programs, which so do twice the others' work, their
K loads waiting behind their Q stores. At the benchmark's shape that is 262144 programs of one warp.
Plain RoPE's forward+backward has measured 1.02-1.03x compile's GPU time on the H100 and 1.12x its
floor on the H200. The variant here (``_rope_tokens_kernel``) rotates a block of TOKENS consecutive
tokens by GROUP heads, so each head's TOKENS rows are one contiguous run of memory and a program's
table rows serve all its heads; with SPLIT_K, K's heads get programs of their own, so no program
rotates both. Its roundings are the shipped kernel's, product by product: the results are the same
bits (checked before any timing, and on a CPU by ``--check``).

Timed as the benchmark times the rotation's forward+backward, without autograd: Q and K cloned, the
forward launch in place, the backward launch into new tensors, CUDA graphs replayed in turns with
torch.compile's forward+backward (oracle.bench.interleaved_graph_ms), at Llama-3-8B's shape.

    python scripts/rope_tokens_ab.py                 # on the GPU machine
    python scripts/rope_tokens_ab.py --check         # any machine: each variant against the shipped bits
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# name: (tokens a program, heads a program, K in programs of its own)
VARIANTS = {
    "t1 g8": (1, 8, False),
    "t1 g8 split": (1, 8, True),
    "t2 g8": (2, 8, False),
    "t2 g8 split": (2, 8, True),
    "t4 g8": (4, 8, False),
    "t4 g8 split": (4, 8, True),
    "t4 g4 split": (4, 4, True),
    "t8 g4 split": (8, 4, True),
    "t8 g8 split": (8, 8, True),
    "t16 g2 split": (16, 2, True),
}


@triton.jit
def _rotate_block(In_ptr, In_sb, In_sh, In_ss, In_sd, Out_ptr, Out_sb, Out_sh, Out_ss, Out_sd,
                  b, tokens, heads, n_heads, cols, table_mask, half_dim, c1, c2, sa, sb, COMPUTE: tl.constexpr):
    """The shipped _rotate_heads on a [heads, tokens, columns] block; the table halves are [tokens, columns]."""
    dtype: tl.constexpr = Out_ptr.dtype.element_ty
    mask = (heads < n_heads)[:, None, None] & table_mask[None, :, :]
    row_in = In_ptr + b * In_sb + heads[:, None, None] * In_sh + tokens[None, :, None] * In_ss
    x1 = tl.load(row_in + cols[None, None, :] * In_sd, mask=mask, other=0.0).to(COMPUTE)
    x2 = tl.load(row_in + (cols[None, None, :] + half_dim) * In_sd, mask=mask, other=0.0).to(COMPUTE)
    y1 = (x1 * c1[None, :, :]).to(dtype).to(COMPUTE) + (x2 * sa[None, :, :]).to(dtype).to(COMPUTE)
    y2 = (x2 * c2[None, :, :]).to(dtype).to(COMPUTE) + (x1 * sb[None, :, :]).to(dtype).to(COMPUTE)
    row_out = Out_ptr + b * Out_sb + heads[:, None, None] * Out_sh + tokens[None, :, None] * Out_ss
    tl.store(row_out + cols[None, None, :] * Out_sd, y1, mask=mask)
    tl.store(row_out + (cols[None, None, :] + half_dim) * Out_sd, y2, mask=mask)


@triton.jit(debug=True)  # the shipped kernel's range assertion, as shipped
def _rope_tokens_kernel(
    Qin_ptr, Qin_sb, Qin_sh, Qin_ss, Qin_sd, Qout_ptr, Qout_sb, Qout_sh, Qout_ss, Qout_sd,
    Kin_ptr, Kin_sb, Kin_sh, Kin_ss, Kin_sd, Kout_ptr, Kout_sb, Kout_sh, Kout_ss, Kout_sd,
    cos_ptr, cos_row_stride, cos_col_stride, sin_ptr, sin_row_stride, sin_col_stride,
    pos_ptr, pos_b_stride, pos_s_stride,
    max_pos, seq_len, n_heads, n_kv_heads, half_dim,
    HAS_POSITIONS: tl.constexpr, BACKWARD_PASS: tl.constexpr, COMPUTE: tl.constexpr,
    GROUP: tl.constexpr, TOKENS: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    blocks = tl.cdiv(seq_len, TOKENS)
    block = tl.program_id(0).to(tl.int64)
    b = block // blocks
    tokens = (block % blocks) * TOKENS + tl.arange(0, TOKENS).to(tl.int64)
    token_mask = tokens < seq_len
    cols = tl.arange(0, BLOCK_HALF).to(tl.int64)
    col_mask = cols < half_dim
    if HAS_POSITIONS:
        pos = tl.load(pos_ptr + b * pos_b_stride + tokens * pos_s_stride, mask=token_mask, other=0).to(tl.int64)
        inside = (pos >= 0) & (pos < max_pos)
        tl.device_assert(inside | ~token_mask, "position_ids outside the table's rows")
        pos = tl.where(inside, pos, 0)
        token_mask = token_mask & inside
    else:
        pos = tokens
    table_mask = token_mask[:, None] & col_mask[None, :]
    cos_row = cos_ptr + pos[:, None] * cos_row_stride
    sin_row = sin_ptr + pos[:, None] * sin_row_stride
    dtype: tl.constexpr = Qout_ptr.dtype.element_ty
    c1 = tl.load(cos_row + cols[None, :] * cos_col_stride, mask=table_mask, other=0.0).to(dtype).to(COMPUTE)
    c2 = tl.load(cos_row + (cols[None, :] + half_dim) * cos_col_stride, mask=table_mask, other=0.0
                 ).to(dtype).to(COMPUTE)
    s1 = tl.load(sin_row + cols[None, :] * sin_col_stride, mask=table_mask, other=0.0).to(dtype).to(COMPUTE)
    s2 = tl.load(sin_row + (cols[None, :] + half_dim) * sin_col_stride, mask=table_mask, other=0.0
                 ).to(dtype).to(COMPUTE)
    if BACKWARD_PASS:
        sa = s2
        sb = -s1
    else:
        sa = -s1
        sb = s2
    group = tl.program_id(1).to(tl.int64)
    if SPLIT_K:
        q_groups = tl.cdiv(n_heads, GROUP)
        if group < q_groups:
            heads = group * GROUP + tl.arange(0, GROUP)
            _rotate_block(Qin_ptr, Qin_sb, Qin_sh, Qin_ss, Qin_sd, Qout_ptr, Qout_sb, Qout_sh, Qout_ss, Qout_sd,
                          b, tokens, heads, n_heads, cols, table_mask, half_dim, c1, c2, sa, sb, COMPUTE)
        else:
            heads = (group - q_groups) * GROUP + tl.arange(0, GROUP)
            _rotate_block(Kin_ptr, Kin_sb, Kin_sh, Kin_ss, Kin_sd, Kout_ptr, Kout_sb, Kout_sh, Kout_ss, Kout_sd,
                          b, tokens, heads, n_kv_heads, cols, table_mask, half_dim, c1, c2, sa, sb, COMPUTE)
    else:
        heads = group * GROUP + tl.arange(0, GROUP)
        _rotate_block(Qin_ptr, Qin_sb, Qin_sh, Qin_ss, Qin_sd, Qout_ptr, Qout_sb, Qout_sh, Qout_ss, Qout_sd,
                      b, tokens, heads, n_heads, cols, table_mask, half_dim, c1, c2, sa, sb, COMPUTE)
        _rotate_block(Kin_ptr, Kin_sb, Kin_sh, Kin_ss, Kin_sd, Kout_ptr, Kout_sb, Kout_sh, Kout_ss, Kout_sd,
                      b, tokens, heads, n_kv_heads, cols, table_mask, half_dim, c1, c2, sa, sb, COMPUTE)


def launch_variant(variant, Q_in, Q_out, K_in, K_out, cos, sin, position_ids, backward: bool) -> None:
    """kernels/rope.py's _launch, for the variant (tokens, group, split_k)."""
    from kernels import _checks
    from kernels._launch import TL_COMPUTE, cdiv, next_power_of_2

    tokens, group, split_k = variant
    batch, n_heads, seq, head_dim = Q_out.shape
    n_kv_heads = K_out.shape[1]
    block_half = next_power_of_2(head_dim // 2)
    pos = position_ids if position_ids is not None else cos
    pos_strides = position_ids.stride() if position_ids is not None else (0, 0)
    groups = cdiv(n_heads, group) + (cdiv(n_kv_heads, group) if split_k else 0)
    _rope_tokens_kernel[(batch * cdiv(seq, tokens), groups)](
        Q_in, *Q_in.stride(), Q_out, *Q_out.stride(), K_in, *K_in.stride(), K_out, *K_out.stride(),
        cos, *cos.stride(), sin, *sin.stride(), pos, *pos_strides,
        cos.shape[0], seq, n_heads, n_kv_heads, head_dim // 2,
        HAS_POSITIONS=position_ids is not None, BACKWARD_PASS=backward,
        COMPUTE=TL_COMPUTE[_checks.compute_dtype(Q_out)], GROUP=group, TOKENS=tokens, SPLIT_K=split_k,
        BLOCK_HALF=block_half, num_warps=max(1, min(8, group * tokens * block_half // 512)),
        enable_fp_fusion=False,
    )


def rotations(dtype, device: str, packed: bool, launches, batch: int, heads: int, kv_heads: int, seq: int,
              head_dim: int):
    """{name: callable returning (Q, K, dQ, dK)}: the clone, the forward in place and the backward into new
    tensors, for the shipped launch and each of ``launches`` ({name: a launch like kernels/rope.py's _launch})."""
    import torch

    from oracle.ops.rope import packed_positions, rotary_table

    launch_shipped = importlib.import_module("kernels.rope")._launch
    gen = torch.Generator().manual_seed(0)
    Q0 = torch.randn(batch, heads, seq, head_dim, generator=gen, dtype=dtype).to(device)
    K0 = torch.randn(batch, kv_heads, seq, head_dim, generator=gen, dtype=dtype).to(device)
    dQ, dK = torch.randn_like(Q0), torch.randn_like(K0)
    cos, sin = rotary_table(seq, head_dim, 500000.0, device=device)
    positions = packed_positions(batch, seq, torch.Generator().manual_seed(0)).to(device) if packed else None

    def fwd_bwd(launch):
        return forward_backward(launch, Q0, K0, dQ, dK, cos, sin, positions)

    return {"shipped": fwd_bwd(launch_shipped)} | {name: fwd_bwd(launch) for name, launch in launches.items()}


def forward_backward(launch, Q0, K0, dQ, dK, cos, sin, positions):
    """A callable returning (Q, K, dQ', dK'): Q0 and K0 cloned, ``launch`` rotating them in place, then dQ and
    dK back into new tensors (the benchmark's forward+backward, without autograd)."""
    import torch

    def call():
        Q, K = Q0.clone(), K0.clone()
        launch(Q, Q, K, K, cos, sin, positions, False)
        dQ_out, dK_out = torch.empty_like(dQ), torch.empty_like(dK)
        launch(dQ, dQ_out, dK, dK_out, cos, sin, positions, True)
        return Q, K, dQ_out, dK_out
    return call


def require_same_bits(calls) -> None:
    """Every variant's four outputs equal the shipped launch's, bit for bit."""
    import torch

    shipped = calls["shipped"]()
    for name, call in calls.items():
        if not all(torch.equal(a, b) for a, b in zip(shipped, call())):
            raise SystemExit(f"{name}: not the shipped bits")


def variants_main(description: str, variants: dict, launch_variant, check_shape: dict) -> None:
    """The RoPE A/B scripts' command line (rope_group_ab.check_or_time): ``--check`` runs every variant
    (``launch_variant(variant, *launch's arguments)``) once on the CPU at ``check_shape`` against the shipped
    bits, plain and packed, bf16 and fp32; without it, on the GPU at Llama-3-8B's shape, the bits checked
    first, every variant against the benchmark's kernels and compile, CUDA graphs in turns."""
    import torch

    from scripts.rope_group_ab import check_or_time

    launches = {name: lambda *args, variant=variant: launch_variant(variant, *args)
                for name, variant in variants.items()}

    def check() -> None:
        for packed in (False, True):
            for dtype in (torch.bfloat16, torch.float32):
                require_same_bits(rotations(dtype, "cpu", packed, launches, **check_shape))
        print(f"{len(variants)} variants: the shipped bits, plain and packed, bf16 and fp32")

    def time_on_gpu(dtypes: list[str]) -> None:
        from oracle import bench
        from oracle.ops import rope as rope_op
        from scripts.rope_group_ab import print_times

        copy_tbps = bench.copy_bandwidth_tbps()
        print(f"{torch.cuda.get_device_name()}, copy bandwidth {copy_tbps:.2f} TB/s", flush=True)
        for dtype in (getattr(torch, name) for name in dtypes):
            for packed in (False, True):
                peers = {name: make for name, make in rope_op._bench_peers(False).items()
                         if name in ("kernels", "compile")}
                work = rope_op.rope_workload(peers, dtype, packed=packed)
                calls = rotations(dtype, "cuda", packed, launches, batch=4, heads=32, kv_heads=8, seq=4096,
                                  head_dim=128)
                require_same_bits(calls)
                fns = {"compile": work.forward_backward["compile"],
                       "kernels (bench)": work.forward_backward["kernels"]}
                times = bench.interleaved_graph_ms(fns | calls)
                print_times(times, work.fwd_bwd_bytes / (copy_tbps * 1e9), "compile",
                            f"{work.variant:6s} {str(dtype).removeprefix('torch.'):8s}")

    check_or_time(description, check, time_on_gpu, "every variant once on the CPU, against the shipped bits")


if __name__ == "__main__":
    # seq not a multiple of any TOKENS, heads not of GROUP 8: every mask is exercised
    variants_main(__doc__.splitlines()[0], VARIANTS, launch_variant,
                  dict(batch=2, heads=12, kv_heads=3, seq=19, head_dim=10))
