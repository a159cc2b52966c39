"""Where the time of one kernels call goes on the GPU: CPU issue time vs GPU time, per op.

For each op, forward and forward+backward: the CPU time to issue one call (no synchronisation),
do_bench's median (what the benchmark reports), do_bench_cudagraph's median (GPU time alone), and
the CUDA kernels the profiler sees with their device times. Run on the lent H200.
"""

from __future__ import annotations

import time

import torch
import triton.testing
from torch.profiler import ProfilerActivity, profile

import kernels
from oracle.ops import rms_norm as norm_ops, rope as rope_ops


def cpu_issue_us(fn, n=200):
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    issue = (time.perf_counter() - start) / n
    torch.cuda.synchronize()
    return issue * 1e6


def report(name, fn):
    bench = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    try:
        graph = triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
    except Exception as exc:  # noqa: BLE001
        graph = float("nan")
        print(f"  (cuda graph failed: {type(exc).__name__}: {str(exc)[:120]})")
    print(f"{name:40s} cpu issue {cpu_issue_us(fn):7.1f} us   do_bench {bench * 1e3:7.1f} us   "
          f"cudagraph {graph * 1e3:7.1f} us")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    for event in prof.key_averages():
        if event.device_time_total > 0:
            print(f"    {event.key[:70]:70s} {event.device_time_total / event.count:8.1f} us x{event.count // 5}")


def main():
    X = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    W = torch.ones(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dY = torch.randn_like(X)
    own = dY.clone()
    with torch.no_grad():
        report("rms_norm fwd (no grad)", lambda: kernels.rms_norm(X, W, 1e-6))
    report("rms_norm fwd (grad)", lambda: kernels.rms_norm(X, W, 1e-6))
    report("rms_norm fwd+bwd", lambda: torch.autograd.grad(kernels.rms_norm(X, W, 1e-6), (X, W), dY))
    report("rms_norm fwd+bwd dX into dY",
           lambda: torch.autograd.grad(kernels.rms_norm(X, W, 1e-6, write_dx_into_dy=True), (X, W), own))
    compiled = torch.compile(norm_ops.rms_norm)
    report("compile rms_norm fwd+bwd", lambda: torch.autograd.grad(compiled(X, W, 1e-6), (X, W), dY))

    Q0 = torch.randn(4, 32, 4096, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    K0 = torch.randn(4, 8, 4096, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    cos, sin = rope_ops.rotary_table(4096, 128, device="cuda")
    from oracle.ops.rope import packed_positions
    pos = packed_positions(4, 4096, torch.Generator().manual_seed(0)).cuda()
    Qd, Kd = Q0.detach().clone(), K0.detach().clone()
    report("rope fwd plain", lambda: kernels.rope(Qd, Kd, cos, sin))
    report("rope fwd packed", lambda: kernels.rope(Qd, Kd, cos, sin, pos))
    dQ, dK = torch.randn_like(Q0), torch.randn_like(K0)
    report("rope clone (producer)", lambda: (Q0.clone(), K0.clone()))
    report("rope fwd+bwd plain (with clone)",
           lambda: torch.autograd.grad(kernels.rope(Q0.clone(), K0.clone(), cos, sin), (Q0, K0), (dQ, dK)))

    # Python-side cost of one fwd+bwd, by function: where the CPU issue time goes.
    import cProfile
    import pstats

    step = lambda: torch.autograd.grad(kernels.rms_norm(X, W, 1e-6), (X, W), dY)  # noqa: E731
    cProfile.runctx("for _ in range(50): step()", {"step": step}, {}, "/tmp/rms.prof")
    torch.cuda.synchronize()
    pstats.Stats("/tmp/rms.prof").sort_stats("tottime").print_stats(22)

    e = torch.randn(16384, 14336, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn_like(e).requires_grad_()
    dh = torch.randn_like(e)
    report("swiglu fwd+bwd", lambda: torch.autograd.grad(kernels.swiglu(e, g), (e, g), dh))


if __name__ == "__main__":
    main()
