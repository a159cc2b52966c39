"""Plain RoPE's forward+backward with its tensors at chosen addresses: does where they lie decide its speed? (GPU)

Two runs of the same shipped launch on one H100 took 0.3587 and 0.3429 ms (forward+backward with the
inputs' copies, bf16), and in the second run the benchmark's own callable took 0.3551 ms beside it,
while compile's and packed RoPE's times moved by 1% at most. Plain RoPE reads table row s for token s,
so its table's addresses and Q's move in step; a fixed offset between them could send both streams
to the same L2 slices or HBM channels. Here every tensor is a view of one byte arena, placed at a
chosen gap after the tensor before it, and the shipped launch is timed per placement (CUDA graphs,
placements in turns), so the spread and which gap moves it can be read off.

    python scripts/rope_placement_ab.py              # on the GPU machine
    python scripts/rope_placement_ab.py --check      # any machine: a placement changes no bit
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

KIB = 1024
# name: {group of tensors: gap in bytes before it} (unnamed groups: no gap). Groups, in arena order:
# "sources" Q0 K0 (copied into) "work" Q K (rotated in place; forward), "incoming" dQ dK,
# "outputs" dQ_out dK_out (backward), "table" cos sin.
GROUPS = ("sources", "work", "incoming", "outputs", "table")
PLACEMENTS = {"no gaps": {}} | \
    {f"{group} +{gap} KiB": {group: gap * KIB} for group, gaps in
     (("table", (1, 4, 32, 256, 1024, 1536, 2560)), ("work", (1, 1028)), ("outputs", (1, 1028)),
      ("incoming", (1, 1028))) for gap in gaps}


def placed_rotation(dtype, device: str, packed: bool, gaps: dict, batch: int, heads: int, kv_heads: int,
                    seq: int, head_dim: int):
    """A callable running the shipped forward (in place on copies of Q0 and K0) and backward (into new
    tensors) on tensors carved from one arena at ``gaps``; returns (Q, K, dQ_out, dK_out)."""
    import torch

    from oracle.ops.rope import packed_positions, rotary_table

    launch = importlib.import_module("kernels.rope")._launch
    gen = torch.Generator().manual_seed(0)
    q_shape, k_shape = (batch, heads, seq, head_dim), (batch, kv_heads, seq, head_dim)
    cos, sin = rotary_table(seq, head_dim, 500000.0)
    shapes = {"sources": [(q_shape, dtype), (k_shape, dtype)], "work": [(q_shape, dtype), (k_shape, dtype)],
              "incoming": [(q_shape, dtype), (k_shape, dtype)], "outputs": [(q_shape, dtype), (k_shape, dtype)],
              "table": [(tuple(cos.shape), cos.dtype), (tuple(sin.shape), sin.dtype)]}
    size = sum(gaps.get(group, 0) + sum(_aligned(_bytes(s, d)) for s, d in shapes[group]) for group in GROUPS)
    arena = torch.empty(size, dtype=torch.uint8, device=device)
    views, offset = {}, 0
    for group in GROUPS:
        offset += gaps.get(group, 0)
        views[group] = []
        for shape, dt in shapes[group]:
            n = _bytes(shape, dt)
            views[group].append(arena[offset:offset + n].view(dt).view(shape))
            offset += _aligned(n)
    (Q0, K0), (Q, K), (dQ, dK), (dQ_out, dK_out), (cos_p, sin_p) = (views[g] for g in GROUPS)
    for target, value in ((Q0, torch.randn(q_shape, generator=gen, dtype=dtype)),
                          (K0, torch.randn(k_shape, generator=gen, dtype=dtype)),
                          (dQ, torch.randn(q_shape, generator=gen, dtype=dtype)),
                          (dK, torch.randn(k_shape, generator=gen, dtype=dtype)), (cos_p, cos), (sin_p, sin)):
        target.copy_(value)
    positions = packed_positions(batch, seq, torch.Generator().manual_seed(0)).to(device) if packed else None

    def call():
        Q.copy_(Q0)
        K.copy_(K0)
        launch(Q, Q, K, K, cos_p, sin_p, positions, False)
        launch(dQ, dQ_out, dK, dK_out, cos_p, sin_p, positions, True)
        return Q, K, dQ_out, dK_out
    return call


def _bytes(shape, dtype) -> int:
    return math.prod(shape) * dtype.itemsize


def _aligned(n: int) -> int:
    """Bytes to the next tensor: each starts 256-byte aligned after the one before (the CPU check's odd shapes)."""
    return -(-n // 256) * 256


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="every placement once on the CPU: the same bits")
    parser.add_argument("--dtypes", default="bfloat16")
    parser.add_argument("--variants", default="plain,packed")
    args = parser.parse_args()
    if args.check:
        for packed in (False, True):
            calls = {name: placed_rotation(torch.bfloat16, "cpu", packed, gaps, batch=2, heads=12, kv_heads=3, seq=7,
                                           head_dim=10) for name, gaps in PLACEMENTS.items()}
            first = next(iter(calls.values()))()
            first = [t.clone() for t in first]
            if not all(all(torch.equal(a, b) for a, b in zip(first, call())) for call in calls.values()):
                raise SystemExit("a placement changed the bits")
        print(f"{len(PLACEMENTS)} placements: the same bits, plain and packed")
        return

    from oracle import bench

    copy_tbps = bench.copy_bandwidth_tbps()
    print(f"{torch.cuda.get_device_name()}, copy bandwidth {copy_tbps:.2f} TB/s", flush=True)
    shape = dict(batch=4, heads=32, kv_heads=8, seq=4096, head_dim=128)
    for dtype in (getattr(torch, name) for name in args.dtypes.split(",")):
        qk_bytes = _bytes((shape["batch"], shape["heads"] + shape["kv_heads"], shape["seq"], shape["head_dim"]), dtype)
        floor_ms = 4 * qk_bytes / (copy_tbps * 1e9)  # forward and backward each read and write Q and K
        for variant in args.variants.split(","):
            calls = {name: placed_rotation(dtype, "cuda", variant == "packed", gaps, **shape)
                     for name, gaps in PLACEMENTS.items()}
            times = bench.interleaved_graph_ms(calls)
            for name, ms in times.items():
                print(f"{variant:6s} {str(dtype).removeprefix('torch.'):8s} {name:18s} {ms:.4f} ms, "
                      f"{ms / floor_ms:.3f}x the floor, {ms / times['no gaps']:.3f}x no gaps", flush=True)
            del calls
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
