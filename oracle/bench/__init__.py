"""``python -m oracle.bench``: the kernels against HF eager, torch.compile and Liger-Kernel, in one process.

GPU only (``--plot`` and ``--position-check`` excepted). Each op at its model's shapes (Llama-3-8B, Gemma-2-9B's
MLP; bf16 and fp16), and RMSNorm, Llama's and Gemma's, across widths 128..65536 at 2^26 elements (bf16): per
implementation, forward (without autograd) and forward+backward, each timed four ways:

- wall: ``triton.testing.do_bench``'s median, L2 flushed between calls (what a caller waits, launch overhead in);
- gpu: the same call replayed from a CUDA graph, the GPU's time alone (the stable figure: targets and gate),
  the competitors' replays taken in turn, medians of ten;
- host: a loop of calls issued without synchronising, the CPU's time to issue one call;
- loop: that loop's wall per call once the GPU has drained it, what a training loop sees.

Also the achieved bandwidth (the bytes the op must move, each counted once, over the time) against a
device-to-device copy measured in the same run, and the peak memory of forward+backward (``max_memory_allocated``
after a reset, above what was allocated before). torch.compile is a fresh ``torch.compile(fn, dynamic=False)`` per
workload, dynamo's caches emptied in between, so each shape is measured at its own static graph, as a model step
that only sees that shape compiles it. Every competitor runs in this process, so the ratios hold on a noisy
machine even where the absolute times drift.

Note [How fwd+bwd is measured]
    Outputs stay alive through backward (a real next layer holds them), and gradients are taken
    with ``torch.autograd.grad`` so nothing accumulates between repetitions. RoPE rotates Q and K
    in place, which autograd allows only on non-leaf tensors, as in a model where Q and K come out
    of a projection. So every implementation's RoPE inputs are made by one ``clone()`` of leaf
    tensors inside the timed region; that clone's own time (all four ways) and memory, measured in the
    same run, are subtracted from every RoPE fwd+bwd figure. Peers get cos/sin already gathered per token,
    as HF's rotary embedding computes them once per model forward; the kernels read the table.

``targets`` evaluates the performance issue's targets on this one run (``target`` lines and a summary);
``--gate`` compares kernels' GPU-time ratios to torch.compile, at model shapes and every sweep row, with the
committed benchmark and exits 1 when one grew by more than 10% (2 when the two runs cannot be compared: another
platform, a time of 0, no ratio in both). ``--plot`` renders a stored run's sweep
(oracle/bench/plot.py). ``--position-check`` times only what rope's position-id range check costs per call
(runs on the CPU too, in seconds) and exits: see ``position_check_cost``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from oracle.bench.targets import (FAST_PEERS, FWD_BWD_TARGET, FWD_TARGET, FWD_TARGET_NARROW, MEMORY_PEER,  # noqa: F401
                            NARROW_BELOW, OURS, SCHEMA, WALL_PEER)
from oracle.environment import environment, platform_key, write_json_atomic
from oracle.bench.workload import Bench, Workload, forget_compiled, randn_cuda
from oracle.errors import GateRefused  # noqa: F401 - raised here

GATE_MARGIN = 0.10  # a ratio to torch.compile may grow by 10% before the gate fails
BASELINES = Path("reports")  # bench-<card>.json: each card's gate baseline (default_baseline)
DEFAULT_PLOT = Path("docs/bench-columns.svg")
DEFAULT_BUDGET_S = 470  # a full run takes minutes; callers give it ~540 s, startup and the last workload included

# The schema and the targets (see ``targets``) live in oracle/bench/targets.py, which the plot reads too.

GRAPH_REP_MS = 50  # ms per CUDA-graph replay: ten replays of many calls each are steady, and the run stays short
HOST_CALLS, HOST_LOOPS = 30, 7  # 30 calls keep even eager's launches below the CUDA launch queue's depth


@dataclass
class Timing:
    op: str
    variant: str  # the op's variant, with ", <width> cols" on a sweep row (the dashboard reads it so)
    dtype: str
    impl: str
    op_variant: str = ""  # the op's variant alone: llama, gemma, plain, packed, ...
    width: int | None = None  # columns of a sweep row; None at a model's shape
    fwd_ms: float | None = None  # do_bench median: what a caller waits, launch overhead included
    fwd_bwd_ms: float | None = None
    fwd_gpu_ms: float | None = None  # CUDA-graph replay median: the GPU's time alone
    fwd_bwd_gpu_ms: float | None = None
    fwd_host_ms: float | None = None  # CPU time to issue one call (host_and_loop_ms)
    fwd_bwd_host_ms: float | None = None
    fwd_loop_ms: float | None = None  # wall per call of an unsynchronised loop (host_and_loop_ms)
    fwd_bwd_loop_ms: float | None = None
    fwd_bytes: int = 0
    fwd_bwd_bytes: int = 0
    peak_mb: float | None = None
    note: str = ""

    def fwd_tbps(self) -> float | None:
        return self.fwd_bytes / (self.fwd_ms * 1e-3) / 1e12 if self.fwd_ms else None

    def fwd_bwd_tbps(self) -> float | None:
        return self.fwd_bwd_bytes / (self.fwd_bwd_ms * 1e-3) / 1e12 if self.fwd_bwd_ms else None

    def fwd_gpu_tbps(self) -> float | None:
        return self.fwd_bytes / (self.fwd_gpu_ms * 1e-3) / 1e12 if self.fwd_gpu_ms else None


# --- measuring ----------------------------------------------------------------------------------


def median_ms(fn: Callable) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def graph_ms(fn: Callable) -> float | None:
    """GPU time alone: the same call captured in a CUDA graph and replayed (no Python in the way);
    None where the call cannot be captured (interleaved_graph_ms of one competitor)."""
    return interleaved_graph_ms({"": fn})[""]


def _in_turn(names: list[str], rounds: int):
    """The order of each round when competitors take turns: the list and its reverse alternate, each
    pair of rounds starting one further along. Rotating one direction only would keep one cyclic
    order, each competitor always right after the same one (in the benchmark, compile's replays
    right after eager's); here each follows both its neighbours in the list equally often. No
    rounds without competitors (every capture may have failed)."""
    for round_ in range(rounds if names else 0):
        ordered = names if round_ % 2 == 0 else names[::-1]
        shift = (round_ // 2) % len(names)
        yield ordered[shift:] + ordered[:shift]


GRAPH_ROUNDS = 10  # replays per competitor, as do_bench_cudagraph takes its median over ten


@dataclass
class Captured:
    """A competitor's calls captured in one CUDA graph: ``replay_ms()`` times one replay on the GPU."""

    replay_ms: Callable[[], float]
    calls: int


def capture(fn: Callable, replay_ms: float = GRAPH_REP_MS) -> Captured:
    """fn warmed up on a side stream (allocations, compilation), timed in a graph of one call (its
    second replay: the first uploads the graph), then captured again as a graph of as many calls as
    take about ``replay_ms``."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    one = _captured(fn, 1)
    one.replay_ms()
    calls = max(1, int(replay_ms / one.replay_ms()))
    del one
    return _captured(fn, calls)


def _captured(fn: Callable, calls: int) -> Captured:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()

    def replay_ms() -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    return Captured(replay_ms, calls)


def interleaved_graph_ms(fns: dict[str, Callable], rounds: int = GRAPH_ROUNDS,
                         capture: Callable[[Callable], Captured] = capture) -> dict[str, float | None]:
    """GPU time per call of each competitor (graph_ms), the competitors' replays taken in turn (each
    round in another order: _in_turn), and the median of ``rounds`` per competitor: a clock dip or
    another process during one competitor's replays falls on all of them alike (a GeGLU run measured
    0.912 against compile's 0.882 ms one after the other, where do_bench's wall times were 0.870 and
    0.867). None for a competitor whose calls cannot be captured."""
    captured = {}
    for name, fn in fns.items():
        try:
            captured[name] = capture(fn)
        except Exception as exc:  # noqa: BLE001 - capture is not possible for every competitor
            print(f"  (no CUDA-graph timing of {name}: {type(exc).__name__}: {str(exc)[:120]})", flush=True)
            if torch.cuda.is_available():  # let a failed capture's work finish before the next competitor's
                torch.cuda.synchronize()
    times: dict[str, list[float]] = {name: [] for name in captured}
    for order in _in_turn(list(captured), rounds):
        for name in order:
            times[name].append(captured[name].replay_ms() / captured[name].calls)
    return {name: statistics.median(times[name]) if name in times else None for name in fns}


def host_and_loop_ms(fn: Callable, synchronize: Callable[[], None], calls: int = HOST_CALLS,
                     loops: int = HOST_LOOPS, clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """(host, loop) milliseconds per call, medians over ``loops`` loops of ``calls`` calls issued without
    synchronising, after one warm-up call. host: until the last call returned (the CPU's cost of issuing
    one); loop: until ``synchronize`` returned too (steady-state wall per call, as a training loop sees it)."""
    return interleaved_host_and_loop_ms({"": fn}, synchronize, calls, loops, clock)[""]


def interleaved_host_and_loop_ms(fns: dict[str, Callable], synchronize: Callable[[], None],
                                 calls: int = HOST_CALLS, loops: int = HOST_LOOPS,
                                 clock: Callable[[], float] = time.perf_counter) -> dict[str, tuple[float, float]]:
    """host_and_loop_ms for several competitors at once, their loops taken in turn (each round in
    another order), so that a drift of the machine over a run (another process, the clocks) falls
    on all of them alike rather than on whichever ran during it: host-bound loop times of one code
    moved by a third between runs on the H200 (docs/performance.md). Medians per competitor."""
    for fn in fns.values():
        fn()
    host = {name: [] for name in fns}
    loop = {name: [] for name in fns}
    for order in _in_turn(list(fns), loops):
        for name in order:
            synchronize()
            start = clock()
            for _ in range(calls):
                fns[name]()
            issued = clock()
            synchronize()
            done = clock()
            host[name].append((issued - start) / calls * 1e3)
            loop[name].append((done - start) / calls * 1e3)
    return {name: (statistics.median(host[name]), statistics.median(loop[name])) for name in fns}


def peak_mb(fn: Callable) -> float:
    """Peak memory of one call above what was allocated before it, in MiB.

    Memory that reference cycles of earlier calls still hold is collected first, and the collector is
    kept off during the call: freed mid-call, such memory comes off the peak but not off ``before``
    (one H100 run read SwiGLU's bf16 forward+backward as 448 MiB, every other run 1344: two of its
    tensors fewer, as memory freed mid-call would read).
    """
    fn()
    torch.cuda.synchronize()
    gc.collect()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    collecting = gc.isenabled()
    gc.disable()
    try:
        fn()
        torch.cuda.synchronize()
    finally:
        if collecting:
            gc.enable()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def copy_bandwidth_tbps(n_bytes: int = 2**31) -> float:
    src = torch.randint(0, 255, (n_bytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * n_bytes / (median_ms(lambda: dst.copy_(src)) * 1e-3) / 1e12


@dataclass
class Overhead:
    """What every fwd+bwd of a workload also runs (RoPE's clone), each way: subtracted from the figures."""

    wall: float = 0.0
    gpu: float = 0.0
    host: float = 0.0
    loop: float = 0.0
    mb: float = 0.0

    @classmethod
    def of(cls, work: Workload) -> Overhead:
        if work.producer is None:
            return cls()
        host, loop = host_and_loop_ms(work.producer, torch.cuda.synchronize)
        return cls(median_ms(work.producer), graph_ms(work.producer) or 0.0, host, loop, work.producer_bytes / 2**20)


def measure(work: Workload) -> list[Timing]:
    """Forward is timed without autograd (inference: the kernel alone); forward+backward with it. The
    GPU replays and the wall loops of every competitor are taken in turn (interleaved_graph_ms,
    interleaved_host_and_loop_ms), after the rest."""
    forget_compiled()
    sync = torch.cuda.synchronize
    extra = Overhead.of(work)
    timings = {}
    for impl in dict.fromkeys([*work.forward, *work.forward_backward]):
        t = timings[impl] = Timing(work.op, work.label, str(work.dtype).removeprefix("torch."), impl,
                                   op_variant=work.variant, width=work.width, fwd_bytes=work.fwd_bytes,
                                   fwd_bwd_bytes=work.fwd_bwd_bytes)
        try:
            if impl in work.forward:
                with torch.no_grad():
                    t.fwd_ms = median_ms(work.forward[impl])
            if impl in work.forward_backward:
                fn = work.forward_backward[impl]
                t.fwd_bwd_ms = median_ms(fn) - extra.wall
                t.peak_mb = peak_mb(fn) - extra.mb
        except Exception as exc:  # noqa: BLE001 - one competitor failing must not lose the others
            t.note = f"failed: {type(exc).__name__}: {str(exc)[:200]}"
    working = [impl for impl, t in timings.items() if not t.note]
    with torch.no_grad():
        for impl, gpu in _gpu(work.forward, working).items():
            timings[impl].fwd_gpu_ms = gpu
    for impl, gpu in _gpu(work.forward_backward, working).items():
        timings[impl].fwd_bwd_gpu_ms = gpu - extra.gpu if gpu is not None else None
    with torch.no_grad():
        for impl, (host, loop) in _wall(work.forward, working, sync).items():
            timings[impl].fwd_host_ms, timings[impl].fwd_loop_ms = host, loop
    for impl, (host, loop) in _wall(work.forward_backward, working, sync).items():
        timings[impl].fwd_bwd_host_ms, timings[impl].fwd_bwd_loop_ms = host - extra.host, loop - extra.loop
    out = list(timings.values())
    torch.cuda.empty_cache()
    return out


def _chosen(fns: dict[str, Callable], impls: list[str]) -> dict[str, Callable]:
    return {impl: fns[impl] for impl in impls if impl in fns}


def _gpu(fns: dict[str, Callable], impls: list[str]) -> dict[str, float | None]:
    """Interleaved GPU times (interleaved_graph_ms) of those of ``impls`` in ``fns``."""
    chosen = _chosen(fns, impls)
    return interleaved_graph_ms(chosen) if chosen else {}


def _wall(fns: dict[str, Callable], impls: list[str], sync) -> dict[str, tuple[float, float]]:
    """Interleaved host and loop times of those of ``impls`` in ``fns``; {} if one of them fails (the
    figures taken before stand, the wall columns stay empty)."""
    chosen = _chosen(fns, impls)
    try:
        return interleaved_host_and_loop_ms(chosen, sync) if chosen else {}
    except Exception as exc:  # noqa: BLE001 - the other columns are measured already
        print(f"  (no wall times: {type(exc).__name__}: {str(exc)[:120]})", flush=True)
        return {}


# --- the cost of rope's position range check ------------------------------------------------------


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _rope_module():
    """kernels/rope.py of this checkout, loaded as ``--impl kernels`` loads the package (never another
    package named ``kernels``); the module itself, which the package's ``rope`` function shadows."""
    import importlib

    from oracle.bench.workload import checkout_kernels

    checkout_kernels()
    return importlib.import_module("kernels.rope")


def position_check_cost(shapes=((1, 2048), (4, 4096), (8, 8192)), calls: int = 300, repeats: int = 5) -> list[dict]:
    """Microseconds per call of what rope's position-id range check adds beside the rotation kernel,
    per (batch, seq), on the GPU when there is one (a few O(1) checks of the Python; the range itself
    is the kernel's, ``rope_check_share`` times that), else the CPU (one aminmax and a host read): the
    best and the median of ``repeats`` loops of ``calls`` calls, synchronised only between loops."""
    require_positions_in_table = _rope_module().require_positions_in_table

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
    """GPU only: kernels.rope with packed position_ids at Llama-3-8B shapes, timed with the rotation
    kernel compiled with its range check's device assertion (as it ships) and without (do_bench: the
    difference is what the assertion adds to a call; the comparisons that keep a bad position's
    token unread and unwritten stay in both)."""
    from oracle.bench.workload import checkout_kernels
    from oracle.ops.rope import packed_positions, rotary_table

    kernels, rope_module = checkout_kernels(), _rope_module()
    Q = randn_cuda(batch, heads, seq, head_dim, dtype=dtype)
    K = randn_cuda(batch, kv_heads, seq, head_dim, dtype=dtype)
    cos, sin = rotary_table(seq, head_dim, 500000.0, device="cuda")
    positions = packed_positions(batch, seq, torch.Generator().manual_seed(0)).cuda()

    def timed() -> float:
        kernels.rope(Q, K, cos, sin, positions)  # compiled before do_bench sizes its loops
        return median_ms(lambda: kernels.rope(Q, K, cos, sin, positions))

    with torch.no_grad():
        with_check = timed()
        with rope_module.without_range_assertion():  # kernels/rope.py, Note [The range check in the kernel]
            without_check = timed()
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


def fwd_target(width: int | None) -> float:
    return FWD_TARGET_NARROW if width is not None and width < NARROW_BELOW else FWD_TARGET


def _fastest(timings: list[Timing], attr: str) -> Timing | None:
    timed = [t for t in timings if getattr(t, attr)]
    return min(timed, key=lambda t: getattr(t, attr)) if timed else None


def _over(mine: float | None, theirs: float | None) -> float | None:
    return mine / theirs if mine and theirs else None


TIE = 0.02  # ratios within 2% of 1: a tie no single run can order (docs/performance.md)


def _holds(mine: float | None, theirs: float | None, over_floor: float | None) -> tuple[bool, bool]:
    """(holds, at the floor) for a time that must be no longer than a peer's (not measured: a miss). A tie
    within TIE holds too where the kernels' GPU time for that phase is within TIE of the floor its bytes set
    at the copy's bandwidth: at the hardware's limit nothing is left to win, and which of two times at that
    limit a run puts first is noise (docs/performance.md, "Ties at the floor")."""
    if mine is None or theirs is None:
        return False, False
    if mine <= theirs:
        return True, False
    at_floor = mine < theirs * (1 + TIE) and over_floor is not None and over_floor <= 1 + TIE
    return at_floor, at_floor


def _target_row(impls: dict[str, Timing], copy_tbps: float) -> dict:
    ours = impls[OURS]
    peers = [impls[name] for name in FAST_PEERS if name in impls]
    memory_peer = impls.get(MEMORY_PEER)
    fastest, wall_peer = _fastest(peers, "fwd_bwd_gpu_ms"), impls.get(WALL_PEER)
    row = {"op": ours.op, "variant": ours.variant, "op_variant": ours.op_variant, "width": ours.width,
           "dtype": ours.dtype, "fwd_target": fwd_target(ours.width), "fwd_bwd_target": FWD_BWD_TARGET,
           # do_bench's (wall) figures are shown, not judged; 0 where not measured (the dashboard formats it)
           "fwd_fraction_of_copy": (ours.fwd_tbps() or 0.0) / copy_tbps,
           "fwd_gpu_fraction_of_copy": _over(ours.fwd_gpu_tbps(), copy_tbps),
           "fwd_bwd_vs_fastest_peer": _over(ours.fwd_bwd_ms, min((p.fwd_bwd_ms for p in peers if p.fwd_bwd_ms),
                                                                 default=None)),
           "fastest_peer": fastest.impl if fastest else None,
           "fwd_bwd_gpu_vs_fastest_peer": _over(ours.fwd_bwd_gpu_ms, fastest.fwd_bwd_gpu_ms if fastest else None),
           "peak_mb": ours.peak_mb, "compile_peak_mb": memory_peer.peak_mb if memory_peer else None,
           "leanest_peer_mb": min((p.peak_mb for p in peers if p.peak_mb is not None), default=None),
           "fwd_bwd_gpu_ms": ours.fwd_bwd_gpu_ms, "fwd_bwd_loop_ms": ours.fwd_bwd_loop_ms,
           "fwd_bwd_host_ms": ours.fwd_bwd_host_ms, "fwd_loop_ms": ours.fwd_loop_ms, "fwd_host_ms": ours.fwd_host_ms,
           "wall_peer": WALL_PEER,
           "peer_fwd_loop_ms": wall_peer.fwd_loop_ms if wall_peer else None,
           "peer_fwd_bwd_loop_ms": wall_peer.fwd_bwd_loop_ms if wall_peer else None}
    # The floor: the bytes forward+backward must move, at the copy's bandwidth. Where kernels and peer
    # tie, how far each is from it says whether anything is left to win (docs/performance.md).
    floor = ours.fwd_bwd_bytes / (copy_tbps * 1e9) if ours.fwd_bwd_bytes else None
    fwd_floor = ours.fwd_bytes / (copy_tbps * 1e9) if ours.fwd_bytes else None
    row["fwd_bwd_floor_ms"], row["fwd_floor_ms"] = floor, fwd_floor
    row["fwd_bwd_gpu_over_floor"] = _over(ours.fwd_bwd_gpu_ms, floor)
    row["fwd_gpu_over_floor"] = _over(ours.fwd_gpu_ms, fwd_floor)
    row["peer_fwd_bwd_gpu_over_floor"] = _over(fastest.fwd_bwd_gpu_ms if fastest else None, floor)
    row["fwd_gpu_ok"] = (row["fwd_gpu_fraction_of_copy"] or 0.0) >= row["fwd_target"]
    row["memory_ok"] = ours.peak_mb is not None and row["compile_peak_mb"] is not None and \
        ours.peak_mb <= row["compile_peak_mb"]
    # (mine, the peer's, the kernels' GPU time over the floor) per verdict that a tie at the floor can hold;
    # the wall targets are the model shapes' only (None: not a target on this row)
    timed = {"fwd_bwd_gpu_ok": (ours.fwd_bwd_gpu_ms, fastest.fwd_bwd_gpu_ms * FWD_BWD_TARGET if fastest else None,
                                row["fwd_bwd_gpu_over_floor"])}
    row["fwd_wall_ok"] = row["wall_ok"] = None
    if ours.width is None:
        timed["fwd_wall_ok"] = (ours.fwd_loop_ms, row["peer_fwd_loop_ms"], row["fwd_gpu_over_floor"])
        timed["wall_ok"] = (ours.fwd_bwd_loop_ms, row["peer_fwd_bwd_loop_ms"], row["fwd_bwd_gpu_over_floor"])
    row["held_at_floor"] = []  # the verdicts that hold only as a tie at the floor
    for check, times in timed.items():
        row[check], at_floor = _holds(*times)
        if at_floor:
            row["held_at_floor"].append(check)
    return row


def targets(timings: list[Timing], copy_tbps: float) -> list[dict]:
    """The performance issue's targets, per workload (model shapes and sweep rows), on numbers from this one run:
    forward GPU bandwidth at least ``fwd_target`` of the copy's; forward+backward GPU time at most FWD_BWD_TARGET
    times the faster of torch.compile's and Liger's; forward+backward peak memory at most torch.compile's; and at
    model shapes, the wall per call of an unsynchronised loop (what a training loop sees, host time included) no
    longer than torch.compile's, forward and forward+backward."""
    groups: dict[tuple, dict[str, Timing]] = {}
    for t in timings:
        groups.setdefault((t.op, t.variant, t.dtype), {})[t.impl] = t
    return [_target_row(impls, copy_tbps) for impls in groups.values() if OURS in impls]


CHECKS = ("fwd_gpu_ok", "fwd_bwd_gpu_ok", "memory_ok", "fwd_wall_ok", "wall_ok")


def tally(rows: list[dict]) -> tuple[int, int]:
    """(held, missed) over every target that applies (``None``: not a target on that row)."""
    verdicts = [row[check] for row in rows for check in CHECKS if row[check] is not None]
    return sum(verdicts), len(verdicts) - sum(verdicts)


def _gate_key(t: dict) -> str:
    if t.get("width") is None:
        return f"{t['op']}/{t['variant']}/{t['dtype']}"
    return f"{t['op']}/{t['op_variant']}/{t['width']} cols/{t['dtype']}"


def _paired_times(result: dict) -> dict[str, tuple[float, float]]:
    """'op/variant[/width cols]/dtype/phase (basis)' -> (kernels' time, torch.compile's) in ms, at model shapes
    and on every sweep row of one run: GPU times (CUDA-graph replay, steady), do_bench's wall times only where
    a GPU time is missing (None). The basis is in the key, so a time is only ever compared with one of its kind."""
    table: dict[str, dict[str, dict]] = {}
    for t in [*result.get("timings", []), *result.get("column_sweep", [])]:
        table.setdefault(_gate_key(t), {})[t["impl"]] = t
    out = {}
    for key, impls in table.items():
        ours, compiled = impls.get(OURS), impls.get("compile")
        if not ours or not compiled:
            continue
        for phase in ("fwd", "fwd_bwd"):
            for basis, attr in (("gpu", f"{phase}_gpu_ms"), ("wall", f"{phase}_ms")):
                if ours.get(attr) is not None and compiled.get(attr) is not None:
                    out[f"{key}/{phase} ({basis})"] = (ours[attr], compiled[attr])
                    break
    return out


def ratios_to_compile(result: dict) -> dict[str, float]:
    """Per key of ``_paired_times``, the kernels' time over torch.compile's. A time of 0 (or below) gives a
    ratio of 0 or infinity, which ``gate`` refuses to judge."""
    return {key: ours / compiled if compiled > 0 else math.inf
            for key, (ours, compiled) in _paired_times(result).items()}


def times_against_copy(result: dict) -> dict[str, float]:
    """Per key of ``_paired_times``, the kernels' own time times the run's copy bandwidth (ms x TB/s: the
    time in units of the machine's memory speed, as the ratio is in units of torch.compile's); {} for a run
    that recorded no copy bandwidth."""
    copy_tbps = result.get("copy_tbps")
    if not copy_tbps:
        return {}
    return {key: ours * copy_tbps for key, (ours, _) in _paired_times(result).items()}


@dataclass
class GateReport:
    regressions: list[str] = field(default_factory=list)  # fail the gate
    peer_moved: list[str] = field(default_factory=list)  # the ratio grew, the kernels' own time did not
    new: list[str] = field(default_factory=list)  # keys in this run only: reported, never a failure
    gone: list[str] = field(default_factory=list)  # keys in the baseline only: likewise
    compared: int = 0



def platform_of(result: dict) -> str | None:
    return (result.get("environment") or {}).get("platform")


def gate(current: dict, baseline: dict) -> GateReport:
    """Regressions: ratios to torch.compile that grew by more than GATE_MARGIN against the baseline's, where
    the kernels' own time against the copy bandwidth grew by more than GATE_MARGIN too (both runs recorded
    it). A ratio grown with the kernels' time steady is torch.compile's time moving (one H200 baseline had
    compile's fp16 RoPE forward 12% slower than the runs before and after it, the kernels'
    unchanged): reported as ``peer_moved``, not a failure. A slower kernel is slower against both yardsticks;
    a run-wide slowdown (another machine, clocks) moves both of the kernels' and compile's times and the
    copy's, and neither ratio. Raises GateRefused where a comparison would mean nothing (a gate that
    compared nothing used to pass)."""
    here, there = platform_of(current), platform_of(baseline)
    if here is None or here != there:
        raise GateRefused(f"the baseline was measured on {there or 'an unrecorded platform'}, this run on "
                          f"{here or 'an unrecorded platform'}: ratios to torch.compile are compared on one "
                          "platform only (store this run with --json to gate against it)")
    now, before = ratios_to_compile(current), ratios_to_compile(baseline)
    unusable = [f"{key} = {value:g} in {where}" for where, ratios in (("this run", now), ("the baseline", before))
                for key, value in sorted(ratios.items()) if not (math.isfinite(value) and value > 0)]
    if unusable:
        raise GateRefused(f"{len(unusable)} ratio(s) to torch.compile are not a positive number (a time of 0 "
                          f"or below): {'; '.join(unusable[:4])}{'; ...' if len(unusable) > 4 else ''}")
    common = sorted(now.keys() & before.keys())
    if not common:
        raise GateRefused(f"no ratio to torch.compile is in both ({len(now)} in this run, {len(before)} in the "
                          "baseline): nothing to compare")
    own_now, own_before = times_against_copy(current), times_against_copy(baseline)
    report = GateReport(new=sorted(now.keys() - before.keys()), gone=sorted(before.keys() - now.keys()),
                        compared=len(common))
    for key in common:
        if now[key] <= before[key] * (1 + GATE_MARGIN):
            continue
        line = f"{key}: ratio to torch.compile {before[key]:.3f} -> {now[key]:.3f} (+{now[key] / before[key] - 1:.0%})"
        if key in own_now and key in own_before:
            own = own_now[key] / own_before[key] - 1
            line += f", the kernels' time against the copy bandwidth {own:+.1%}"
            if own <= GATE_MARGIN:
                report.peer_moved.append(line + ": torch.compile's time moved, not the kernels'")
                continue
        report.regressions.append(line)
    return report


# --- output -------------------------------------------------------------------------------------


def table(timings: list[Timing], copy_tbps: float) -> str:
    header = (f"{'op':8s} {'variant':17s} {'dtype':9s} {'impl':21s} {'fwd ms':>7s} {'of copy':>7s} {'gpu':>7s} "
              f"{'host':>6s} {'loop':>7s} {'fwd+bwd':>8s} {'gpu':>7s} {'host':>6s} {'loop':>7s} {'peak MiB':>8s}")
    lines = [header]
    for t in timings:
        frac = f"{t.fwd_gpu_tbps() / copy_tbps:.0%}" if t.fwd_gpu_ms else ""
        lines.append(f"{t.op:8s} {t.variant:17s} {t.dtype:9s} {t.impl:21s} {_fmt(t.fwd_ms, 7)} {frac:>7s} "
                     f"{_fmt(t.fwd_gpu_ms, 7)} {_fmt(t.fwd_host_ms, 6)} {_fmt(t.fwd_loop_ms, 7)} "
                     f"{_fmt(t.fwd_bwd_ms, 8)} {_fmt(t.fwd_bwd_gpu_ms, 7)} {_fmt(t.fwd_bwd_host_ms, 6)} "
                     f"{_fmt(t.fwd_bwd_loop_ms, 7)} {_fmt(t.peak_mb, 8, '.0f')} {t.note}".rstrip())
    return "\n".join(lines)


def target_line(row: dict) -> str:
    at_floor = row.get("held_at_floor", [])  # runs before this field: none

    def mark(check):
        if not row[check]:
            return "MISS"
        return "ok, a tie at the floor" if check in at_floor else "ok"

    def num(value, spec, unit=""):
        return "n/a" if value is None else f"{value:{spec}}{unit}"

    line = (f"target {row['op']:8s} {row['variant']:17s} {row['dtype']:9s} "
            f"fwd gpu {num(row['fwd_gpu_fraction_of_copy'], '.0%')} of copy (>= {row['fwd_target']:.0%}): "
            f"{mark('fwd_gpu_ok')} | fwd+bwd gpu {num(row['fwd_bwd_gpu_vs_fastest_peer'], '.2f', 'x')} "
            f"{row['fastest_peer'] or 'peer'}: {mark('fwd_bwd_gpu_ok')}{_floor_note(row)} | "
            f"peak {num(row['peak_mb'], '.0f')} vs "
            f"compile {num(row['compile_peak_mb'], '.0f')} MiB: {mark('memory_ok')}")
    if row["wall_ok"] is not None:
        line += (f" | wall per call fwd {num(row['fwd_loop_ms'], '.3f')} vs {row['wall_peer']} "
                 f"{num(row['peer_fwd_loop_ms'], '.3f')} ms: {mark('fwd_wall_ok')}{_wall_floor_note(row, 'fwd')}, "
                 f"fwd+bwd {num(row['fwd_bwd_loop_ms'], '.3f')} vs {num(row['peer_fwd_bwd_loop_ms'], '.3f')} ms: "
                 f"{mark('wall_ok')}{_wall_floor_note(row, 'fwd_bwd')}")
    return line


def _wall_floor_note(row: dict, phase: str) -> str:
    """For a wall time held as a tie at the floor: the floor, and the kernels' GPU time against it."""
    if ("fwd_wall_ok" if phase == "fwd" else "wall_ok") not in row.get("held_at_floor", []):
        return ""
    return (f" (the bytes at copy speed take {row[f'{phase}_floor_ms']:.3f} ms, the kernels' GPU time "
            f"{row[f'{phase}_gpu_over_floor']:.2f}x that)")


def _floor_note(row: dict) -> str:
    """For a forward+backward tie, both times against the floor the bytes set at the copy's bandwidth."""
    ratio, ours, peer = row["fwd_bwd_gpu_vs_fastest_peer"], row["fwd_bwd_gpu_over_floor"], \
        row["peer_fwd_bwd_gpu_over_floor"]
    if ratio is None or ours is None or peer is None or abs(ratio - 1) >= TIE:
        return ""
    return (f" (a tie: the bytes at copy speed take {row['fwd_bwd_floor_ms']:.3f} ms; kernels {ours:.2f}x that, "
            f"{row['fastest_peer']} {peer:.2f}x)")


def _fmt(value, width, spec=".3f"):
    return f"{value:{width}{spec}}" if value is not None else " " * width


def _describe(work: Workload) -> str:
    width = f" width {work.width}" if work.width is not None else ""
    return f"{work.op} {work.variant}{width} {str(work.dtype).removeprefix('torch.')}"


def op_benches() -> list[Bench]:
    """Each built-in op module's benchmark, declared beside its ops (``BENCH``), in the registry's order."""
    from oracle.ops import MODULES  # the op modules import this package's workload module: not at import

    return [module.BENCH for module in MODULES if hasattr(module, "BENCH")]


def run(quick: bool = False, include_liger: bool = True, sweep: bool = True,
        widths: tuple[int, ...] | None = None, budget_s: float | None = None) -> dict:
    """Model shapes in bf16 and fp16 (bf16 only when ``quick``), then every op's sweep (none when ``quick`` or
    not ``sweep``) at ``widths`` or its own. No workload starts after ``budget_s`` seconds: those are listed
    as skipped, so that the results are written within the caller's time limit."""
    start = time.perf_counter()
    torch.manual_seed(0)
    benches = [(declared, declared.peers(include_liger)) for declared in op_benches()]
    copy_tbps = copy_bandwidth_tbps()
    print(f"copy bandwidth: {copy_tbps:.2f} TB/s (read + write); fwd/fwd+bwd ms: do_bench; gpu: CUDA-graph "
          f"replay; host, loop: per call of {HOST_CALLS} unsynchronised calls; 'of copy': gpu", flush=True)
    skipped: list[str] = []

    def measured(works) -> list[Timing]:
        out = []
        for work in works:
            elapsed = time.perf_counter() - start
            if budget_s is not None and elapsed > budget_s:
                skipped.append(_describe(work))
                print(f"[{elapsed:6.1f} s] skipped, past the {budget_s:.0f} s budget: {_describe(work)}", flush=True)
                continue
            print(f"[{elapsed:6.1f} s] {_describe(work)}", flush=True)
            out += (rows := measure(work))
            print(table(rows, copy_tbps), flush=True)
            del work  # before the next workload's inputs are made
        return out

    timings: list[Timing] = []
    for dtype in (torch.bfloat16,) if quick else (torch.bfloat16, torch.float16):
        for bench, peers in benches:
            timings += measured(bench.workloads(peers, dtype))
    swept = [] if quick or not sweep else \
        [t for bench, peers in benches if bench.sweep
         for t in measured(bench.sweep(peers, widths or bench.sweep_widths))]
    rows = targets(timings + swept, copy_tbps)
    held, missed = tally(rows)
    return {"schema": SCHEMA, "environment": environment(), "copy_tbps": copy_tbps,
            "timings": [asdict(t) for t in timings], "column_sweep": [asdict(t) for t in swept],
            "targets": rows, "targets_held": held, "targets_missed": missed, "skipped": skipped,
            "impls": sorted({name for _, peers in benches for name in peers}),
            "settings": {"graph_rep_ms": GRAPH_REP_MS, "host_calls": HOST_CALLS, "host_loops": HOST_LOOPS,
                         "budget_s": budget_s},
            "elapsed_s": time.perf_counter() - start}


def _widths(text: str) -> tuple[int, ...]:
    try:
        widths = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        widths = ()
    if not widths or min(widths) < 1:
        raise argparse.ArgumentTypeError(f"expected positive column counts separated by commas, got {text!r}")
    return widths


def card_name(platform: str) -> str:
    """The short name a card's benchmark files carry: 'cuda-NVIDIA-H200' -> 'h200',
    'cuda-NVIDIA-H100-80GB-HBM3' -> 'h100' (the first word of the GPU's name with a digit in it, after
    the maker's), the whole platform for anything else."""
    words = platform.split("-")
    model = next((word for word in words[2:] if re.search(r"\d", word)), None) if words[0] == "cuda" else None
    return (model or platform).lower()


def default_baseline(platform: str) -> Path:
    """Where this card's gate baseline is kept: ratios to torch.compile are compared on one card only,
    so an H100 gates against the H100's run and an H200 against the H200's."""
    return BASELINES / f"bench-{card_name(platform)}.json"


def _load_baseline(path: Path) -> dict:
    baseline = json.loads(path.read_text())
    if baseline.get("schema") != SCHEMA:
        raise ValueError(f"schema {baseline.get('schema')!r}, expected {SCHEMA!r}")
    return baseline


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m oracle.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--quick", action="store_true", help="bf16 only, no column sweep")
    parser.add_argument("--no-sweep", action="store_true", help="model shapes only, no column sweep")
    parser.add_argument("--widths", type=_widths, default=None, metavar="W,W,...",
                        help="sweep only these column counts, e.g. 256,65536 (default: all of the sweep's)")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, metavar="SECONDS",
                        help="start no workload after this many seconds; the rest are listed as skipped and the "
                             "results still written (default %(default)s; 0: no limit)")
    parser.add_argument("--no-liger", action="store_true", help="leave Liger-Kernel out even if installed")
    parser.add_argument("--gate", action="store_true",
                        help="exit 1 if a GPU-time ratio to torch.compile regressed by >10%% against --baseline")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="benchmark to gate against (default reports/bench-<card>.json for this machine's card: "
                             "reports/bench-h200.json on an H200, reports/bench-h100.json on an H100)")
    parser.add_argument("--plot", type=Path, default=None, metavar="BENCH_JSON",
                        help="render the column sweep of a stored run as SVG (no GPU needed) and exit")
    parser.add_argument("--out", type=Path, default=None, help=f"where --plot writes (default {DEFAULT_PLOT})")
    parser.add_argument("--position-check", action="store_true",
                        help="only time rope's position-id range check per call (CPU too) and exit")
    return parser


def main(argv: list[str] | None = None) -> int:
    usage = parser()
    args = usage.parse_args(argv)
    if args.out is not None and args.plot is None:
        usage.error("--out is where --plot writes; give --plot too")
    if args.widths is not None and (args.quick or args.no_sweep):
        usage.error("--widths picks the sweep's widths; --quick and --no-sweep leave the sweep out")
    if args.plot is not None:
        from oracle.bench.plot import BenchFileError, plot_columns

        try:
            plot_columns(args.plot, args.out or DEFAULT_PLOT)
        except BenchFileError as exc:
            print(f"error: cannot plot {args.plot}: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {args.out or DEFAULT_PLOT}")
        return 0
    if args.position_check:
        result = position_check_report()
        if args.json:
            write_json_atomic(args.json, result)
            print(f"wrote {args.json}")
        return 0
    baseline = None
    if args.gate:  # before the GPU check and the minutes of the run
        if args.baseline is None:
            args.baseline = default_baseline(platform_key())
            if not args.baseline.exists():
                print(f"error: no benchmark of this card to gate against ({args.baseline}): store a run there with "
                      f"--json {args.baseline}, or name one with --baseline", file=sys.stderr)
                return 2
        try:
            baseline = _load_baseline(args.baseline)
        except (OSError, ValueError) as exc:
            print(f"error: cannot use baseline {args.baseline}: {exc}", file=sys.stderr)
            return 2
        if platform_of(baseline) != platform_key():
            print(f"error: cannot use baseline {args.baseline}: measured on "
                  f"{platform_of(baseline) or 'an unrecorded platform'}, this machine is {platform_key()}",
                  file=sys.stderr)
            return 2
    if not torch.cuda.is_available():
        print("error: oracle.bench times GPU kernels and needs a CUDA device; this machine has none "
              "(the correctness suite and the report run on CPU; --plot and --position-check do too)",
              file=sys.stderr)
        return 2
    result = run(quick=args.quick, include_liger=not args.no_liger, sweep=not args.no_sweep, widths=args.widths,
                 budget_s=args.budget_s or None)
    for row in result["targets"]:
        print(target_line(row))
    skipped = f", {len(result['skipped'])} workloads skipped past the budget" if result["skipped"] else ""
    print(f"targets: {result['targets_held']} hold, {result['targets_missed']} miss "
          f"(fwd, fwd+bwd and peak per workload, wall at model shapes) in {result['elapsed_s']:.0f} s{skipped}")
    if args.json:
        write_json_atomic(args.json, result)
        print(f"wrote {args.json}")
    if baseline is not None:
        try:
            report = gate(result, baseline)
        except GateRefused as exc:
            print(f"error: the gate cannot judge against {args.baseline}: {exc}", file=sys.stderr)
            return 2
        for line in report.regressions:
            print("REGRESSION " + line)
        for line in report.peer_moved:
            print("gate: not a regression: " + line)
        for key in report.new:
            print(f"gate: new (not in the baseline): {key}")
        for key in report.gone:
            print(f"gate: gone (in the baseline only): {key}")
        moved = f", {len(report.peer_moved)} moved with torch.compile alone" if report.peer_moved else ""
        print(f"gate: {report.compared} ratios compared with {args.baseline}, {len(report.regressions)} regressed{moved}")
        return 1 if report.regressions else 0
    return 0

