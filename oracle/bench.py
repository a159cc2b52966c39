"""``python -m oracle.bench``: the kernels against HF eager, torch.compile and Liger-Kernel, in one process.

GPU only. For each op (Llama-3-8B shapes, bf16 and fp16) and each implementation: forward, and
forward+backward, timed with ``triton.testing.do_bench`` (median) on fresh random data larger
than L2; the achieved bandwidth (the bytes the op must move, each counted once, over the time)
against a device-to-device copy measured in the same run; and the peak memory of forward+backward
(``max_memory_allocated`` after a reset, above what was allocated before). Every competitor runs
in this process, so the ratios hold on a noisy machine even where the absolute times drift.

Note [How fwd+bwd is measured]
    Outputs stay alive through backward (a real next layer holds them), and gradients are taken
    with ``torch.autograd.grad`` so nothing accumulates between repetitions. RoPE rotates Q and K
    in place, which autograd allows only on non-leaf tensors, as in a model where Q and K come out
    of a projection. So every implementation's RoPE inputs are made by one ``clone()`` of leaf
    tensors inside the timed region; that clone's own time and memory, measured in the same run,
    are subtracted from every RoPE fwd+bwd figure. Peers get cos/sin already gathered per token,
    as HF's rotary embedding computes them once per model forward; the kernels read the table.

``--gate`` compares each op's time ratio to torch.compile (measured in this same run) with the
committed benchmark and exits 1 when one got worse by more than 10%.

``--position-check`` times only what rope's position-id range check costs per call (runs on the
CPU too, in seconds) and exits: see ``position_check_cost``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .ops import SPECS
from .environment import environment, write_json_atomic
from .workload import Workload, randn_cuda

SCHEMA = "kernel-oracle/bench/1"
GATE_MARGIN = 0.10  # a ratio to torch.compile may grow by 10% before the gate fails
DEFAULT_BASELINE = Path("reports/bench-h200.json")


@dataclass
class Timing:
    op: str
    variant: str
    dtype: str
    impl: str
    fwd_ms: float | None = None  # do_bench median: what a caller waits, launch overhead included
    fwd_bwd_ms: float | None = None
    fwd_gpu_ms: float | None = None  # CUDA-graph replay median: the GPU's time alone
    fwd_bwd_gpu_ms: float | None = None
    fwd_bytes: int = 0
    fwd_bwd_bytes: int = 0
    peak_mb: float | None = None
    note: str = ""
    fwd_bwd_target: float = 0.8  # from its Workload

    def fwd_tbps(self) -> float | None:
        return self.fwd_bytes / (self.fwd_ms * 1e-3) / 1e12 if self.fwd_ms else None

    def fwd_bwd_tbps(self) -> float | None:
        return self.fwd_bwd_bytes / (self.fwd_bwd_ms * 1e-3) / 1e12 if self.fwd_bwd_ms else None

    def fwd_gpu_tbps(self) -> float | None:
        return self.fwd_bytes / (self.fwd_gpu_ms * 1e-3) / 1e12 if self.fwd_gpu_ms else None




# --- workloads ----------------------------------------------------------------------------------










# --- measuring ----------------------------------------------------------------------------------


def median_ms(fn: Callable) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def graph_ms(fn: Callable) -> float | None:
    """GPU time alone: the same call captured in a CUDA graph and replayed (no Python in the way);
    None where the call cannot be captured."""
    import triton.testing

    try:
        return float(triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median"))
    except Exception as exc:  # noqa: BLE001 - capture is not possible for every competitor
        print(f"  (no CUDA-graph timing: {type(exc).__name__}: {str(exc)[:120]})", flush=True)
        torch.cuda.synchronize()
        return None


def peak_mb(fn: Callable) -> float:
    """Peak memory of one call above what was allocated before it, in MiB."""
    fn()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def copy_bandwidth_tbps(n_bytes: int = 2**31) -> float:
    src = torch.randint(0, 255, (n_bytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * n_bytes / (median_ms(lambda: dst.copy_(src)) * 1e-3) / 1e12


def measure(work: Workload) -> list[Timing]:
    """Forward is timed without autograd (inference: the kernel alone); forward+backward with it."""
    producer_ms = median_ms(work.producer) if work.producer else 0.0
    producer_gpu_ms = graph_ms(work.producer) if work.producer else 0.0
    out = []
    for impl in dict.fromkeys([*work.forward, *work.forward_backward]):
        t = Timing(work.op, work.variant, str(work.dtype).removeprefix("torch."), impl,
                   fwd_bytes=work.fwd_bytes, fwd_bwd_bytes=work.fwd_bwd_bytes, fwd_bwd_target=work.fwd_bwd_target)
        try:
            if impl in work.forward:
                with torch.no_grad():
                    t.fwd_ms = median_ms(work.forward[impl])
                    t.fwd_gpu_ms = graph_ms(work.forward[impl])
            if impl in work.forward_backward:
                t.fwd_bwd_ms = median_ms(work.forward_backward[impl]) - producer_ms
                gpu = graph_ms(work.forward_backward[impl])
                t.fwd_bwd_gpu_ms = gpu - (producer_gpu_ms or 0.0) if gpu is not None else None
                t.peak_mb = peak_mb(work.forward_backward[impl]) - work.producer_bytes / 2**20
        except Exception as exc:  # noqa: BLE001 - one competitor failing must not lose the others
            t.note = f"failed: {type(exc).__name__}: {str(exc)[:200]}"
        out.append(t)
    torch.cuda.empty_cache()
    return out




# --- the cost of rope's position range check ------------------------------------------------------


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def position_check_cost(shapes=((1, 2048), (4, 4096), (8, 8192)), calls: int = 300, repeats: int = 5) -> list[dict]:
    """Microseconds per call of rope's position-id range check alone (one aminmax, one host read), per
    (batch, seq), on the GPU when there is one, else the CPU: the best and the median of ``repeats``
    loops of ``calls`` calls. On a GPU the host read also waits for all queued work; in a model that stall,
    not the microseconds, is the cost (``rope_check_share`` measures it on a real rope call)."""
    from kernels.rope import require_positions_in_table

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for batch, seq in shapes:
        positions = torch.randint(0, seq, (batch, seq), device=device)
        require_positions_in_table(positions, seq)  # warm-up
        per_call = []
        for _ in range(repeats):
            _synchronize(device)
            start = time.perf_counter()
            for _ in range(calls):
                require_positions_in_table(positions, seq)
            _synchronize(device)
            per_call.append((time.perf_counter() - start) / calls * 1e6)
        # the best loop is the cost itself; the median adds what a busy machine's scheduler took
        rows.append({"device": device, "batch": batch, "seq": seq, "best_us_per_call": min(per_call),
                     "median_us_per_call": statistics.median(per_call)})
    return rows


def rope_check_share(dtype=torch.bfloat16, batch=4, heads=32, kv_heads=8, seq=4096, head_dim=128) -> dict:
    """GPU only: kernels.rope with packed position_ids at Llama-3-8B shapes, timed with the range
    check and with it switched off, so the difference includes the stall of its host sync."""
    import importlib

    import kernels

    from .ops.rope import packed_positions, rotary_table

    rope_module = importlib.import_module("kernels.rope")  # the module: ``kernels.rope`` is the function
    Q = randn_cuda(batch, heads, seq, head_dim, dtype=dtype)
    K = randn_cuda(batch, kv_heads, seq, head_dim, dtype=dtype)
    cos, sin = rotary_table(seq, head_dim, 500000.0, device="cuda")
    positions = packed_positions(batch, seq, torch.Generator().manual_seed(0)).cuda()
    with torch.no_grad():
        with_check = median_ms(lambda: kernels.rope(Q, K, cos, sin, positions))
        checked = rope_module.require_positions_in_table
        rope_module.require_positions_in_table = lambda *_: None
        try:
            without_check = median_ms(lambda: kernels.rope(Q, K, cos, sin, positions))
        finally:
            rope_module.require_positions_in_table = checked
    return {"shape": [batch, heads, kv_heads, seq, head_dim], "dtype": str(dtype).removeprefix("torch."),
            "with_check_ms": with_check, "without_check_ms": without_check}


def position_check_report() -> dict:
    rows = position_check_cost()
    for row in rows:
        print(f"position check on {row['device']}: position_ids ({row['batch']}, {row['seq']}): "
              f"{row['best_us_per_call']:.1f} us per call (median of loops {row['median_us_per_call']:.1f})")
    result = {"schema": SCHEMA, "environment": environment(), "position_check": rows}
    if torch.cuda.is_available():
        share = rope_check_share()
        result["rope_check_share"] = share
        print(f"rope fwd {share['shape']} {share['dtype']}: {share['with_check_ms']:.4f} ms with the check, "
              f"{share['without_check_ms']:.4f} ms without")
    return result


# --- targets and the gate -----------------------------------------------------------------------


def targets(timings: list[Timing], copy_tbps: float) -> list[dict]:
    """The issue's targets, each evaluated on numbers from this one run, on the wall-clock times
    (do_bench) and on the GPU's times alone (CUDA-graph replay)."""
    rows = []
    by_key: dict[tuple, dict[str, Timing]] = {}
    for t in timings:
        by_key.setdefault((t.op, t.variant, t.dtype), {})[t.impl] = t
    for (op, variant, dtype), impls in by_key.items():
        ours = impls.get("kernels")
        if ours is None or ours.fwd_ms is None:
            continue
        peers = [impls[name] for name in ("compile", "liger") if name in impls and impls[name].fwd_bwd_ms]
        limit = ours.fwd_bwd_target
        row = {"op": op, "variant": variant, "dtype": dtype, "fwd_target": 0.85, "fwd_bwd_target": limit,
               "fwd_fraction_of_copy": ours.fwd_tbps() / copy_tbps,
               "fwd_gpu_fraction_of_copy": ours.fwd_gpu_tbps() / copy_tbps if ours.fwd_gpu_ms else None,
               "peak_mb": ours.peak_mb,
               "leanest_peer_mb": min((p.peak_mb for p in peers if p.peak_mb is not None), default=None)}
        for suffix, attr in (("", "fwd_bwd_ms"), ("_gpu", "fwd_bwd_gpu_ms")):
            fastest = min((getattr(p, attr) for p in peers if getattr(p, attr)), default=None)
            mine = getattr(ours, attr)
            row[f"fwd_bwd{suffix}_vs_fastest_peer"] = mine / fastest if fastest and mine else None
        row["fwd_ok"] = row["fwd_fraction_of_copy"] >= 0.85
        row["fwd_gpu_ok"] = (row["fwd_gpu_fraction_of_copy"] or 0) >= 0.85
        row["fwd_bwd_ok"] = (row["fwd_bwd_vs_fastest_peer"] or math.inf) <= limit
        row["fwd_bwd_gpu_ok"] = (row["fwd_bwd_gpu_vs_fastest_peer"] or math.inf) <= limit
        row["memory_ok"] = row["leanest_peer_mb"] is not None and ours.peak_mb is not None and \
            ours.peak_mb <= row["leanest_peer_mb"]
        rows.append(row)
    return rows


def ratios_to_compile(timings: list[dict]) -> dict[str, float]:
    """'op/variant/dtype/pass' -> kernels' time / torch.compile's time, from one run's timings."""
    table: dict[tuple, dict[str, dict]] = {}
    for t in timings:
        table.setdefault((t["op"], t["variant"], t["dtype"]), {})[t["impl"]] = t
    out = {}
    for (op, variant, dtype), impls in table.items():
        ours, compiled = impls.get("kernels"), impls.get("compile")
        if not ours or not compiled:
            continue
        for phase in ("fwd_ms", "fwd_bwd_ms"):
            if ours.get(phase) and compiled.get(phase):
                out[f"{op}/{variant}/{dtype}/{phase[:-3]}"] = ours[phase] / compiled[phase]
    return out


def gate(current: dict, baseline: dict) -> list[str]:
    """Regressions: ratios to torch.compile that grew by more than GATE_MARGIN."""
    now, before = ratios_to_compile(current["timings"]), ratios_to_compile(baseline["timings"])
    return [f"{key}: ratio to torch.compile {before[key]:.3f} -> {now[key]:.3f} (+{now[key] / before[key] - 1:.0%})"
            for key in sorted(now.keys() & before.keys()) if now[key] > before[key] * (1 + GATE_MARGIN)]


# --- output -------------------------------------------------------------------------------------


def table(timings: list[Timing], copy_tbps: float) -> str:
    lines = [f"copy bandwidth: {copy_tbps:.2f} TB/s (read + write); 'gpu' columns: CUDA-graph replay",
             f"{'op':8s} {'variant':10s} {'dtype':9s} {'impl':22s} {'fwd ms':>8s} {'of copy':>8s} {'gpu ms':>8s} "
             f"{'fwd+bwd ms':>11s} {'gpu ms':>8s} {'peak MiB':>9s}"]
    for t in timings:
        frac = f"{t.fwd_tbps() / copy_tbps:.0%}" if t.fwd_ms else ""
        lines.append(f"{t.op:8s} {t.variant:10s} {t.dtype:9s} {t.impl:22s} {_fmt(t.fwd_ms, 8)} {frac:>8s} "
                     f"{_fmt(t.fwd_gpu_ms, 8)} {_fmt(t.fwd_bwd_ms, 11)} {_fmt(t.fwd_bwd_gpu_ms, 8)} "
                     f"{_fmt(t.peak_mb, 9, '.0f')} {t.note}")
    return "\n".join(lines)


def target_line(row: dict) -> str:
    checks = ("fwd_ok", "fwd_gpu_ok", "fwd_bwd_ok", "fwd_bwd_gpu_ok", "memory_ok")
    marks = " ".join(f"{k.removesuffix('_ok')}:{'ok' if row[k] else 'MISS'}" for k in checks)

    def x(value):
        return "n/a" if value is None else f"{value:.2f}x"

    return (f"target {row['op']:8s} {row['variant']:7s} {row['dtype']:9s} fwd {row['fwd_fraction_of_copy']:.0%} of copy "
            f"(gpu {row['fwd_gpu_fraction_of_copy'] or 0:.0%}), fwd+bwd {x(row['fwd_bwd_vs_fastest_peer'])} fastest peer "
            f"(gpu {x(row['fwd_bwd_gpu_vs_fastest_peer'])}), peak {row['peak_mb'] or 0:.0f} vs {row['leanest_peer_mb']} MiB"
            f"  [{marks}]")


def _fmt(value, width, spec=".3f"):
    return f"{value:{width}{spec}}" if value is not None else " " * width


def run(quick: bool = False, include_liger: bool = True) -> dict:
    torch.manual_seed(0)
    benched = [spec for spec in SPECS.values() if spec.bench is not None]
    peers = {spec.name: spec.bench.peers(include_liger) for spec in benched}
    copy_tbps = copy_bandwidth_tbps()
    timings: list[Timing] = []
    dtypes = (torch.bfloat16,) if quick else (torch.bfloat16, torch.float16)
    for dtype in dtypes:
        for spec in benched:
            for work in spec.bench.workloads(peers[spec.name], dtype):
                timings += measure(work)
                print(table([t for t in timings if t.op == work.op and t.variant == work.variant
                             and t.dtype == str(dtype).removeprefix("torch.")], copy_tbps), flush=True)
                del work
                torch.cuda.empty_cache()
    sweep = [] if quick else [t for spec in benched if spec.bench.sweep
                              for work in spec.bench.sweep(peers[spec.name]) for t in measure(work)]
    impls = sorted({name for by_name in peers.values() for name in by_name})
    return {"schema": SCHEMA, "environment": environment(), "copy_tbps": copy_tbps,
            "timings": [asdict(t) for t in timings], "column_sweep": [asdict(t) for t in sweep],
            "targets": targets(timings, copy_tbps), "impls": impls}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oracle.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--quick", action="store_true", help="bf16 only, no column sweep")
    parser.add_argument("--no-liger", action="store_true", help="leave Liger-Kernel out even if installed")
    parser.add_argument("--gate", action="store_true", help="exit 1 if a ratio to torch.compile regressed by >10%%")
    parser.add_argument("--baseline", type=Path, default=DEFAULT_BASELINE, help="benchmark to gate against")
    parser.add_argument("--position-check", action="store_true",
                        help="only time rope's position-id range check per call (CPU too) and exit")
    args = parser.parse_args(argv)
    if args.position_check:
        result = position_check_report()
        if args.json:
            write_json_atomic(args.json, result)
            print(f"wrote {args.json}")
        return 0
    if not torch.cuda.is_available():
        print("error: oracle.bench times GPU kernels and needs a CUDA device; this machine has none "
              "(the correctness suite and the report run on CPU)", file=sys.stderr)
        return 2
    baseline = None
    if args.gate:
        try:
            baseline = json.loads(args.baseline.read_text())
            if baseline.get("schema") != SCHEMA:
                raise ValueError(f"schema {baseline.get('schema')!r}, expected {SCHEMA!r}")
        except (OSError, ValueError) as exc:
            print(f"error: cannot use baseline {args.baseline}: {exc}", file=sys.stderr)
            return 2
    result = run(quick=args.quick, include_liger=not args.no_liger)
    for row in result["targets"]:
        print(target_line(row))
    if args.json:
        write_json_atomic(args.json, result)
        print(f"wrote {args.json}")
    if baseline is not None:
        regressions = gate(result, baseline)
        for line in regressions:
            print("REGRESSION " + line)
        return 1 if regressions else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
