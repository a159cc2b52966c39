"""Why plain RoPE runs slower than packed RoPE at the benchmark's shape: the position values or the code path (GPU).

In the H100's whole benchmark at the sixteenth session the kernels' plain forward+backward took
0.241 ms and the packed one 0.232, though both move the same bytes through the same kernel and the
packed one loads a position per token besides. Three ways of rotating the same Q and K separate
the two causes:

    plain        no position_ids: the kernel's HAS_POSITIONS=False path, token t at row t % seq
    arange       position_ids equal to those rows: the packed code path with the plain rows
    packed       the benchmark's packed position_ids (restarting at each document)

If ``arange`` times like ``plain``, the position values decide (packed tokens read fewer distinct
table rows, four programs a token, 1 KiB of the fp32 table each); if it times like ``packed``, the
code path does. Each comes with the float32 table (the benchmark's) and with the table in the
model's dtype, and torch.compile's plain forward+backward (the benchmark's callable) is timed in the
same turns (oracle.bench.interleaved_graph_ms). On a CPU, ``--check`` runs each once at a small
shape under Triton's interpreter and checks that plain and arange give the same bits.

    python scripts/rope_positions_ab.py                # on the GPU machine
    python scripts/rope_positions_ab.py --check        # any machine
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def rotations(dtype, device: str, batch: int, heads: int, kv_heads: int, seq: int, head_dim: int):
    """{name: forward+backward callable returning (dQ, dK)} for every way of rotating one Q and K."""
    import torch

    from oracle.bench.workload import checkout_kernels
    from oracle.ops.rope import packed_positions, rotary_table

    rope = checkout_kernels().rope
    gen = torch.Generator().manual_seed(0)
    Q0 = torch.randn(batch, heads, seq, head_dim, generator=gen, dtype=dtype).to(device).requires_grad_()
    K0 = torch.randn(batch, kv_heads, seq, head_dim, generator=gen, dtype=dtype).to(device).requires_grad_()
    dQ, dK = torch.randn_like(Q0), torch.randn_like(K0)
    cos32, sin32 = rotary_table(seq, head_dim, 500000.0, device=device)
    positions = {"plain": None,
                 "arange": torch.arange(seq, device=device).expand(batch, -1),
                 "packed": packed_positions(batch, seq, torch.Generator().manual_seed(0)).to(device)}
    tables = {"fp32 table": (cos32, sin32), "model table": (cos32.to(dtype), sin32.to(dtype))}
    calls = {}
    for (table_name, (cos, sin)), (rows_name, rows) in ((t, r) for t in tables.items() for r in positions.items()):
        def fwd_bwd(cos=cos, sin=sin, rows=rows):
            Q, K = Q0.clone(), K0.clone()
            outs = rope(Q, K, cos, sin, rows)
            return torch.autograd.grad(outs, (Q0, K0), (dQ, dK))
        calls[f"{rows_name}, {table_name}"] = fwd_bwd
    return calls


def check() -> None:
    """Each rotation once on the CPU (Triton's interpreter) at a small shape: plain and arange agree bit
    for bit, and plain and packed (other table rows) do not."""
    import torch

    calls = rotations(torch.bfloat16, "cpu", batch=2, heads=4, kv_heads=2, seq=16, head_dim=8)
    grads = {name: fn() for name, fn in calls.items()}
    for table in ("fp32 table", "model table"):
        plain, arange = grads[f"plain, {table}"], grads[f"arange, {table}"]
        same = all(torch.equal(a, b) for a, b in zip(plain, arange))
        print(f"{table}: plain and arange {'the same bits' if same else 'DIFFER'}")
        packed = grads[f"packed, {table}"]  # other rows of the table: the comparison can tell
        differs = not all(torch.equal(a, b) for a, b in zip(plain, packed))
        print(f"{table}: plain and packed {'differ, as they should' if differs else 'THE SAME'}")
        if not same or not differs:
            raise SystemExit(1)
    print(f"{len(grads)} rotations ran")


def time_on_gpu(dtypes: list[str]) -> None:
    import torch

    from oracle import bench
    from oracle.ops import rope as rope_op
    from scripts.rope_group_ab import print_times

    copy_tbps = bench.copy_bandwidth_tbps()
    print(f"{torch.cuda.get_device_name()}, copy bandwidth {copy_tbps:.2f} TB/s")
    for dtype in (getattr(torch, name) for name in dtypes):
        peers = {name: make for name, make in rope_op._bench_peers(False).items() if name == "compile"}
        work = rope_op.rope_workload(peers, dtype, packed=False)
        fns = rotations(dtype, "cuda", batch=4, heads=32, kv_heads=8, seq=4096, head_dim=128)
        fns["compile, plain"] = work.forward_backward["compile"]
        times = bench.interleaved_graph_ms(fns)
        print_times(times, work.fwd_bwd_bytes / (copy_tbps * 1e9), "compile, plain",
                    f"{str(dtype).removeprefix('torch.'):8s}")


def main() -> None:
    from scripts.rope_group_ab import check_or_time

    check_or_time(__doc__.splitlines()[0], check, time_on_gpu, "run each rotation once on the CPU and compare")


if __name__ == "__main__":
    main()
