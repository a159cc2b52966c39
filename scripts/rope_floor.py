"""An experiment: how close plain RoPE's forward+backward can come to the copy's floor at its shape (GPU).

Plain RoPE's forward+backward ties torch.compile's on both cards (0.99x on an H100, 0.99-1.00x on
the H200), both at 1.06-1.07x (H100) and 1.12x (H200) the floor its bytes set at the copy's
bandwidth. A tie that far above the floor misses the performance issue's point 4, unless the
floor itself cannot be reached with these bytes: the copy's bandwidth is measured on one 2 GiB
tensor, while the rotation moves Q and K in place, then dQ and dK into new tensors, two launches
over tensors of 134 and 34 MB. A ladder, each rung doing what the shipped launches do with less
work, every call as the benchmark's (the clone of Q and K, then the forward and the backward):

    clone      Q and K cloned, nothing else (subtracted from every rung below)
    neg        torch's in-place neg_ on Q and K, then neg into new dQ and dK tensors: the same bytes
               as the rotation, four launches of torch's own elementwise kernel
    flat       a Triton kernel streaming Q's and K's storage in 4096-element blocks, one launch a pass:
               the same bytes and launches, no table and no head rows
    rows       the shipped grid, warps and stores, each program loading and storing its head rows
               unchanged: the rotation without its table and arithmetic
    shipped    kernels/rope.py's launches

If ``rows`` and ``shipped`` sit where ``flat`` and ``neg`` do, the rotation is at the floor these
bytes reach in two passes; if ``flat`` is well below, the grid's shape costs the difference.

    python scripts/rope_floor.py             # on the GPU machine: bf16 and fp16, with compile's
    python scripts/rope_floor.py --check     # any machine: the Triton rungs' outputs on a CPU
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FLAT_BLOCK = 4096
rope = importlib.import_module("kernels.rope")  # the module; the package's rope is the function


@triton.jit
def _flat_kernel(Qin_ptr, Qout_ptr, Kin_ptr, Kout_ptr, q_numel, k_numel, BLOCK: tl.constexpr):
    """Q's storage, then K's, BLOCK elements a program, loaded and stored unchanged (contiguous tensors)."""
    q_blocks = tl.cdiv(q_numel, BLOCK)
    block = tl.program_id(0).to(tl.int64)
    if block < q_blocks:
        offsets = block * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < q_numel
        x = tl.load(Qin_ptr + offsets, mask=mask)
        tl.store(Qout_ptr + offsets, x, mask=mask, eviction_policy="evict_first")
    else:
        offsets = (block - q_blocks) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < k_numel
        x = tl.load(Kin_ptr + offsets, mask=mask)
        tl.store(Kout_ptr + offsets, x, mask=mask, eviction_policy="evict_first")


@triton.jit
def _copy_heads(In_ptr, In_sb, In_sh, In_ss, In_sd, Out_ptr, Out_sb, Out_sh, Out_ss, Out_sd,
                b, s, heads, n_heads, cols, col_mask, half_dim):
    """kernels/rope.py's _rotate_heads' loads and stores, the rotation left out."""
    mask = (heads < n_heads)[:, None] & col_mask[None, :]
    row_in = In_ptr + b * In_sb + s * In_ss + heads[:, None] * In_sh
    x1 = tl.load(row_in + cols[None, :] * In_sd, mask=mask, other=0.0)
    x2 = tl.load(row_in + (cols[None, :] + half_dim) * In_sd, mask=mask, other=0.0)
    row_out = Out_ptr + b * Out_sb + s * Out_ss + heads[:, None] * Out_sh
    tl.store(row_out + cols[None, :] * Out_sd, x1, mask=mask, eviction_policy="evict_first")
    tl.store(row_out + (cols[None, :] + half_dim) * Out_sd, x2, mask=mask, eviction_policy="evict_first")


@triton.jit
def _rows_kernel(
    Qin_ptr, Qin_sb, Qin_sh, Qin_ss, Qin_sd, Qout_ptr, Qout_sb, Qout_sh, Qout_ss, Qout_sd,
    Kin_ptr, Kin_sb, Kin_sh, Kin_ss, Kin_sd, Kout_ptr, Kout_sb, Kout_sh, Kout_ss, Kout_sd,
    seq_len, n_heads, n_kv_heads, half_dim, GROUP_SIZE: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    """kernels/rope.py's _rope_kernel's programs (one token, GROUP_SIZE heads of Q and of K), copying."""
    token = tl.program_id(0).to(tl.int64)
    b = token // seq_len
    s = token % seq_len
    heads = tl.program_id(1).to(tl.int64) * GROUP_SIZE + tl.arange(0, GROUP_SIZE)
    cols = tl.arange(0, BLOCK_HALF).to(tl.int64)
    col_mask = cols < half_dim
    _copy_heads(Qin_ptr, Qin_sb, Qin_sh, Qin_ss, Qin_sd, Qout_ptr, Qout_sb, Qout_sh, Qout_ss, Qout_sd,
                b, s, heads, n_heads, cols, col_mask, half_dim)
    _copy_heads(Kin_ptr, Kin_sb, Kin_sh, Kin_ss, Kin_sd, Kout_ptr, Kout_sb, Kout_sh, Kout_ss, Kout_sd,
                b, s, heads, n_kv_heads, cols, col_mask, half_dim)


def launch_flat(Q_in, Q_out, K_in, K_out, cos, sin, position_ids, backward: bool) -> None:
    from kernels._launch import cdiv

    blocks = cdiv(Q_in.numel(), FLAT_BLOCK) + cdiv(K_in.numel(), FLAT_BLOCK)
    _flat_kernel[(blocks,)](Q_in, Q_out, K_in, K_out, Q_in.numel(), K_in.numel(), BLOCK=FLAT_BLOCK, num_warps=8)


def launch_rows(Q_in, Q_out, K_in, K_out, cos, sin, position_ids, backward: bool) -> None:
    """kernels/rope.py's _launch: its grid and warps."""
    from kernels._launch import cdiv, next_power_of_2

    batch, n_heads, seq, head_dim = Q_out.shape
    block_half = next_power_of_2(head_dim // 2)
    _rows_kernel[(batch * seq, cdiv(n_heads, rope.GROUP_SIZE))](
        Q_in, *Q_in.stride(), Q_out, *Q_out.stride(), K_in, *K_in.stride(), K_out, *K_out.stride(),
        seq, n_heads, K_out.shape[1], head_dim // 2, GROUP_SIZE=rope.GROUP_SIZE, BLOCK_HALF=block_half,
        num_warps=rope.rope_warps(block_half))


def launch_neg(Q_in, Q_out, K_in, K_out, cos, sin, position_ids, backward: bool) -> None:
    import torch

    for x_in, x_out in ((Q_in, Q_out), (K_in, K_out)):
        if x_in is x_out:
            x_out.neg_()
        else:
            torch.neg(x_in, out=x_out)


LAUNCHES = {"neg": launch_neg, "flat": launch_flat, "rows": launch_rows}


def calls(dtype, device: str) -> tuple[dict, tuple]:
    """({name: callable returning (Q, K, dQ', dK')}, (Q0, K0, dQ, dK)): every rung's forward+backward as the
    benchmark and scripts/rope_tokens_ab.rotations run it (Q0 and K0 cloned, the forward in place, the backward
    from dQ and dK into new tensors), the shipped launch's, and the clone alone; and the inputs."""
    import torch

    from oracle.ops.rope import rotary_table
    from scripts.rope_tokens_ab import forward_backward

    batch, heads, kv_heads, seq, head_dim = (4, 32, 8, 4096, 128) if device == "cuda" else (2, 12, 3, 7, 10)
    gen = torch.Generator().manual_seed(0)
    Q0, dQ = (torch.randn(batch, heads, seq, head_dim, generator=gen, dtype=dtype).to(device) for _ in range(2))
    K0, dK = (torch.randn(batch, kv_heads, seq, head_dim, generator=gen, dtype=dtype).to(device) for _ in range(2))
    cos, sin = rotary_table(seq, head_dim, 500000.0, device=device)

    def fwd_bwd(launch):
        return forward_backward(launch, Q0, K0, dQ, dK, cos, sin, None)

    rungs = {"clone": lambda: (Q0.clone(), K0.clone())} | {name: fwd_bwd(launch) for name, launch in LAUNCHES.items()}
    return rungs | {"shipped": fwd_bwd(rope._launch)}, (Q0, K0, dQ, dK)


def check() -> None:
    """On a small shape (heads not a multiple of 8: the masks): flat and rows give back their inputs, neg
    negates them, shipped does neither."""
    import torch

    for dtype in (torch.bfloat16, torch.float32):
        rungs, inputs = calls(dtype, "cpu")
        for name, sign in (("flat", 1), ("rows", 1), ("neg", -1)):
            if not all(torch.equal(got, sign * want) for got, want in zip(rungs[name](), inputs)):
                raise SystemExit(f"{name} ({dtype}): not its inputs' values")
        if any(torch.equal(got, want) for got, want in zip(rungs["shipped"](), inputs)):
            raise SystemExit(f"shipped ({dtype}): an output equal to its input")
    print("flat and rows copy, neg negates, bf16 and fp32")


def time_on_gpu(dtypes: list[str]) -> None:
    import torch

    from oracle import bench
    from oracle.ops import rope as rope_op

    copy_tbps = bench.copy_bandwidth_tbps()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"copy bandwidth {copy_tbps:.2f} TB/s", flush=True)
    for dtype in (getattr(torch, name) for name in dtypes):
        peers = {name: make for name, make in rope_op._bench_peers(False).items() if name in ("kernels", "compile")}
        work = rope_op.rope_workload(peers, dtype, packed=False)
        floor_ms = work.fwd_bwd_bytes / (copy_tbps * 1e9)
        fns = {"compile": work.forward_backward["compile"], "kernels (bench)": work.forward_backward["kernels"]}
        times = bench.interleaved_graph_ms(fns | calls(dtype, "cuda")[0])
        clone, label = times["clone"], f"plain {str(dtype).removeprefix('torch.'):8s}"
        print(f"{label} floor {floor_ms:.4f} ms ({work.fwd_bwd_bytes / 1e6:.0f} MB); clone {clone:.4f} ms", flush=True)
        for name, ms in times.items():
            if name != "clone" and ms is not None:
                net = ms - clone
                print(f"{label} {name:16s} {ms:.4f} ms, less the clone {net:.4f} ms: {net / floor_ms:.3f}x the floor, "
                      f"{net / (times['shipped'] - clone):.3f}x shipped", flush=True)


if __name__ == "__main__":
    from scripts.rope_group_ab import check_or_time

    check_or_time(__doc__.splitlines()[0], check, time_on_gpu, "the Triton rungs' outputs on a small shape")
