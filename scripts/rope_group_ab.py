"""RoPE's heads per program (kernels/rope.py GROUP_SIZE) against torch.compile, at the benchmark's shape (GPU).

    python scripts/rope_group_ab.py                  # 4, 8, 16 and 32 heads a program, bf16 and fp16

Each group size is captured in a CUDA graph with the benchmark's own forward+backward callables
(oracle/ops/rope.py's workload, plain and packed), and the replays of every setting and of compile's
take turns (oracle.bench.interleaved_graph_ms), so a drift of the clocks falls on all alike. Times
are per forward+backward and against the floor its bytes set at the copy's bandwidth.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    import torch

    from oracle import bench
    from oracle.ops import rope as rope_op

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", default="4,8,16,32")
    parser.add_argument("--dtypes", default="bfloat16,float16")
    args = parser.parse_args()
    kernels_rope = importlib.import_module("kernels.rope")  # the module (kernels.rope is also the function)
    shipped = kernels_rope.GROUP_SIZE
    copy_tbps = bench.copy_bandwidth_tbps()
    print(f"copy bandwidth {copy_tbps:.2f} TB/s; shipped GROUP_SIZE {shipped}")
    for dtype in (getattr(torch, name) for name in args.dtypes.split(",")):
        for packed in (False, True):
            peers = {name: make for name, make in rope_op._bench_peers(False).items() if name in ("kernels", "compile")}
            work = rope_op.rope_workload(peers, dtype, packed)
            fns = {"compile": work.forward_backward["compile"]}
            for group in (int(g) for g in args.groups.split(",")):
                def call(group=group, fn=work.forward_backward["kernels"]):
                    kernels_rope.GROUP_SIZE = group  # read at each launch; a captured graph keeps its own
                    try:
                        return fn()
                    finally:
                        kernels_rope.GROUP_SIZE = shipped
                fns[f"group {group}"] = call
            times = bench.interleaved_graph_ms(fns)
            print_times(times, work.fwd_bwd_bytes / (copy_tbps * 1e9), "compile",
                        f"{work.variant:6s} {str(dtype).removeprefix('torch.'):8s}")


def print_times(times: dict, floor_ms: float, compile_name: str, label: str) -> None:
    """One line a competitor: its time per forward+backward, against the floor and compile's."""
    width, peer = max(len(name) for name in times), times[compile_name]
    for name, ms in times.items():
        shown = "not captured" if ms is None else f"{ms:.4f} ms, {ms / floor_ms:.3f}x the floor" + \
            ("" if peer is None else f", {ms / peer:.3f}x compile")
        print(f"{label} {name:{width}s} {shown}", flush=True)


def check_or_time(description: str, check, time_on_gpu, check_help: str) -> None:
    """The A/B scripts' command line: ``--check`` runs ``check`` (any machine), else ``time_on_gpu`` over
    ``--dtypes``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", action="store_true", help=check_help)
    parser.add_argument("--dtypes", default="bfloat16,float16")
    args = parser.parse_args()
    if args.check:
        check()
    else:
        time_on_gpu(args.dtypes.split(","))


if __name__ == "__main__":
    main()
