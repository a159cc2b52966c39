"""Does the order of the benchmark's interleaved CUDA-graph replays move its GPU-time ratios? (GPU only)

    python scripts/bench_order.py

GeGLU's forward+backward at the benchmark's shape (Gemma-2-9B's MLP), kernels, HF eager and
torch.compile, as ``python -m oracle.bench`` builds them, timed by ``oracle.bench.interleaved_graph_ms``
twice per dtype and repeat: with the one-direction rotation the benchmark used up to `8d00d37` (a fixed
cyclic order: compile always replayed right after eager) and with ``_in_turn``'s alternating one.
Prints kernels / compile per ordering.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from oracle import bench  # noqa: E402
from oracle.ops import geglu as geglu_ops  # noqa: E402


def one_direction(names: list[str], rounds: int):
    for round_ in range(rounds if names else 0):
        yield names[round_ % len(names):] + names[:round_ % len(names)]


def main(repeats: int = 2) -> None:
    alternating = bench._in_turn
    orders = {"one direction": one_direction, "alternating": alternating}
    for dtype in (torch.bfloat16, torch.float16):
        work = geglu_ops.geglu_workload(geglu_ops.BENCH.peers(False), dtype)
        for repeat in range(repeats):
            for label, in_turn in orders.items():
                bench._in_turn = in_turn
                gpu = bench.interleaved_graph_ms(work.forward_backward)
                times = "  ".join(f"{name} {ms:.4f}" for name, ms in gpu.items())
                print(f"{str(dtype)[6:]:8s} #{repeat} {label:13s}: {times}  kernels/compile "
                      f"{gpu['kernels'] / gpu['compile']:.4f}", flush=True)
        bench._in_turn = alternating
        del work
        torch._dynamo.reset()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
