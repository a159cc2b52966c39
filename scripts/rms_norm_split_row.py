"""An experiment, not shipped: RMSNorm's forward at 65536 columns with each row split over SPLIT
programs that keep their slice in registers and exchange their partial sums of squares through
global memory, so that X is read from HBM once (the shipped looped kernel reads each row twice, the
second time hoping to find it in L2, and reaches about 71% of copy bandwidth there). Prints GPU
time and fraction of copy per setting against the shipped kernel, and each setting's largest
difference from the shipped output.

    python scripts/rms_norm_split_row.py        # on the GPU machine: the prefetching settings
    python scripts/rms_norm_split_row.py --all  # and the 27 without prefetch (reports/logs/rms-norm-split-row-h200.log)

How the programs of a row meet: a persistent grid of SPLIT-program groups, all resident at once
(launched as a cooperative grid, so the launch fails rather than deadlocks when they do not fit).
Program s of a group loads slice s of its row, stores its partial sum, bumps the row's counter
(release), and spins until the counter says every slice has arrived (acquire); it then sums the
SPLIT partials in slice order (the same sum in every program), normalises its slice and writes
it, and bumps the counter again on its way out; the last to leave resets it to 0 for the next
call. What a product version would still need: a counter buffer per stream (two streams running
at once would share rows' counters), and an answer for a launch that dies between the bumps.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kernels  # noqa: E402
from oracle.bench import copy_bandwidth_tbps  # noqa: E402


@triton.jit
def _split_row_forward(Y_ptr, X_ptr, W_ptr, partial_ptr, counter_ptr, n_rows, eps,
                       N: tl.constexpr, SPLIT: tl.constexpr, SLICE: tl.constexpr, PREFETCH: tl.constexpr):
    program = tl.program_id(0)
    part = program % SPLIT
    groups = tl.num_programs(0) // SPLIT
    cols = part * SLICE + tl.arange(0, SLICE).to(tl.int64)
    w = tl.load(W_ptr + cols).to(tl.float32)
    first = program // SPLIT
    upcoming = tl.load(X_ptr + first * N + cols, mask=(cols < N) & (first < n_rows), other=0.0)
    for row in tl.range(first, n_rows, groups):
        if PREFETCH:  # the next row's slice is loading while this one waits for its peers
            x = upcoming.to(tl.float32)
            following = row + groups
            upcoming = tl.load(X_ptr + following * N + cols, mask=(cols < N) & (following < n_rows), other=0.0)
        else:
            x = tl.load(X_ptr + row * N + cols).to(tl.float32)
        tl.store(partial_ptr + row * SPLIT + part, tl.sum(x * x, axis=0))
        tl.debug_barrier()  # the partial is stored before the counter says so
        tl.atomic_add(counter_ptr + row, 1, sem="release", scope="gpu")
        arrived = tl.atomic_add(counter_ptr + row, 0, sem="acquire", scope="gpu")
        while arrived < SPLIT:
            arrived = tl.atomic_add(counter_ptr + row, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()
        partials = tl.load(partial_ptr + row * SPLIT + tl.arange(0, SPLIT), volatile=True)
        inv_rms = tl.rsqrt(tl.sum(partials, axis=0) / N + eps)
        y = (x * inv_rms).to(Y_ptr.dtype.element_ty).to(tl.float32) * w  # Llama's cast order
        tl.store(Y_ptr + row * N + cols, y)
        left = tl.atomic_add(counter_ptr + row, 1, sem="acq_rel", scope="gpu")
        if left == 2 * SPLIT - 1:  # the last of the row's programs to leave
            tl.atomic_xchg(counter_ptr + row, 0, sem="relaxed", scope="gpu")


def split_row_rms_norm(X, W, eps, split, warps, per_sm, prefetch, counters, partials):
    n_rows, n = X.shape
    Y = torch.empty_like(X)
    slots = torch.cuda.get_device_properties(X.device).multi_processor_count * per_sm
    groups = min(n_rows, slots // split)
    _split_row_forward[(groups * split,)](Y, X, W, partials, counters, n_rows, eps, N=n, SPLIT=split,
                                          SLICE=n // split, PREFETCH=prefetch, num_warps=warps,
                                          launch_cooperative_grid=True)
    return Y


def main() -> None:
    cols, eps = 65536, 1e-6
    rows = 2**26 // cols  # the benchmark's sweep row: 2**26 elements
    X = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    W = (1 + 0.1 * torch.randn(cols, device="cuda")).to(torch.bfloat16)
    counters = torch.zeros(rows, device="cuda", dtype=torch.int32)
    partials = torch.empty(rows, 64, device="cuda", dtype=torch.float32)
    copy = copy_bandwidth_tbps()
    n_bytes = 2 * X.numel() * X.element_size()
    shipped = kernels.rms_norm(X, W, eps)

    def report(name, fn):
        ms = triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
        print(f"{name:56s} {ms:.4f} ms, {n_bytes / ms / 1e9 / copy:5.1%} of copy", flush=True)

    print(f"{torch.cuda.get_device_name()}, copy {copy:.2f} TB/s, X {rows}x{cols} bf16", flush=True)
    report("shipped (kernels.rms_norm)", lambda: kernels.rms_norm(X, W, eps))
    settings = itertools.product((False, True), (4, 8, 16), (4, 8, 16), (1, 2, 4)) if "--all" in sys.argv else \
        itertools.product((True,), (4, 8), (4, 8), (2, 3, 4))
    for prefetch, split, warps, per_sm in settings:
        name = f"split {split:2d}, {warps:2d} warps, {per_sm} programs/SM{', prefetch' if prefetch else ''}"
        try:
            Y = split_row_rms_norm(X, W, eps, split, warps, per_sm, prefetch, counters, partials)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - a setting that does not fit is reported, not fatal
            print(f"{name:56s} not launched: {type(exc).__name__}: {str(exc)[:100]}", flush=True)
            continue
        differs = (Y.float() - shipped.float()).abs().max().item()
        if counters.any():
            print(f"{name:56s} counters not reset: {counters.nonzero().numel()} rows", flush=True)
            counters.zero_()
            continue
        report(f"{name} (max |diff| {differs:.3g})",
               lambda: split_row_rms_norm(X, W, eps, split, warps, per_sm, prefetch, counters, partials))


if __name__ == "__main__":
    main()
