"""Launch-setting sweep for RoPE, SwiGLU and GeGLU on a GPU (run on the lent H200; prints one table per knob;
RMSNorm has its own measured table: scripts/tune_rms_norm.py).

Each knob is a module-level function or constant of kernels/*.py, patched in turn; the shapes are
the benchmark's (oracle/bench/). Used to choose the defaults, not by the package itself.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import sys

import torch
import triton.testing

import kernels
from oracle.ops import rope as rope_ops

rope = importlib.import_module("kernels.rope")
elementwise = importlib.import_module("kernels._elementwise")


def ms(fn):
    """GPU time alone (CUDA-graph replay): launch overhead would drown the differences tuned here."""
    return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")


def rope_knobs():
    Q = torch.randn(4, 32, 4096, 128, device="cuda", dtype=torch.bfloat16)
    K = torch.randn(4, 8, 4096, 128, device="cuda", dtype=torch.bfloat16)
    cos, sin = rope_ops.rotary_table(4096, 128, device="cuda")
    original_warps, original_group = rope.rope_warps, rope.GROUP_SIZE
    for group, warps in itertools.product((4, 8, 16), (1, 2, 4)):
        rope.GROUP_SIZE = group
        rope.rope_warps = lambda block, warps=warps: warps
        print(f"rope forward       heads/program={group} num_warps={warps}: {ms(lambda: kernels.rope(Q, K, cos, sin)):.3f} ms")
    rope.rope_warps, rope.GROUP_SIZE = original_warps, original_group


def with_flat_setting(fn, block=None, warps=None, flat=None):
    """fn with every flat launch it makes patched: BLOCK_SIZE, num_warps, the flat specialisation's
    constexprs (None: the shipped choice)."""
    original_launch, original_flat = elementwise._launch_flat, elementwise.flat_launch

    def patched_launch(gated, *args, **constexprs):
        gated = dataclasses.replace(gated, block_size=block or gated.block_size, num_warps=warps or gated.num_warps)
        original_launch(gated, *args, **constexprs)

    def call():
        elementwise._launch_flat = patched_launch
        if flat is not None:
            elementwise.flat_launch = lambda n, block_size: flat
        try:
            return fn()
        finally:
            elementwise._launch_flat, elementwise.flat_launch = original_launch, original_flat
    return call


def elementwise_knobs():
    """SwiGLU's and GeGLU's forward+backward (what the benchmark's fwd+bwd target times) per BLOCK_SIZE
    and num_warps of the flat launch, and the flat specialisation (_elementwise.flat_launch) against
    64-bit offsets with a bounds test everywhere, against torch.compile of HF's maths: GPU times from
    CUDA-graph replays taken in turn (oracle.bench.interleaved_graph_ms), so the settings are compared
    in one run. "shipped" is each activation's own GatedKernels setting."""
    from oracle.bench import interleaved_graph_ms
    from oracle.ops.geglu import geglu
    from oracle.ops.swiglu import swiglu

    for dtype in (torch.bfloat16, torch.float16):
        e = torch.randn(16384, 14336, device="cuda", dtype=dtype, requires_grad=True)
        g = torch.randn_like(e, requires_grad=True)
        dh = torch.randn_like(e)

        def fwd_bwd(fn):
            return lambda: torch.autograd.grad(fn(e, g), (e, g), dh)

        for name, ours, hf in (("swiglu", kernels.swiglu, swiglu), ("geglu", kernels.geglu, geglu)):  # GeGLU: tanh
            fns = {"compile": fwd_bwd(torch.compile(hf, dynamic=False)), "shipped": fwd_bwd(ours)}
            for block, warps in itertools.product((1024, 2048, 4096), (4, 8)):
                fns[f"BLOCK_SIZE={block} num_warps={warps}"] = with_flat_setting(fwd_bwd(ours), block, warps)
            fns["shipped, 64-bit + bounds test"] = with_flat_setting(fwd_bwd(ours), flat={"WIDE": True, "EVEN": False})
            for setting, gpu in interleaved_graph_ms(fns).items():
                print(f"{name} {str(dtype)[6:]} fwd+bwd {setting:32s} {gpu:.4f} ms", flush=True)
            torch._dynamo.reset()


def elementwise_forward_knobs(repeats: int = 3):
    """SwiGLU's and GeGLU's forward alone (the benchmark's forward and its wall target) per launch setting,
    against torch.compile: GPU time (CUDA-graph replay) and the loop's wall per call (30 unsynchronised
    calls, oracle.bench.interleaved_host_and_loop_ms), each taken in turn, ``repeats`` times, so that a
    setting's edge is told from the run-to-run spread."""
    from oracle.bench import interleaved_graph_ms, interleaved_host_and_loop_ms
    from oracle.ops.geglu import geglu
    from oracle.ops.swiglu import swiglu

    e = torch.randn(16384, 14336, device="cuda", dtype=torch.bfloat16)
    g = torch.randn_like(e)
    for name, ours, hf in (("swiglu", kernels.swiglu, swiglu), ("geglu", kernels.geglu, geglu)):
        compiled = torch.compile(hf, dynamic=False)
        fns = {"compile": lambda: compiled(e, g), "shipped": lambda: ours(e, g)}
        for block, warps in ((1024, 4), (2048, 8), (4096, 8)):
            fns[f"BLOCK_SIZE={block} num_warps={warps}"] = with_flat_setting(lambda: ours(e, g), block, warps)
        for repeat in range(repeats):
            gpu = interleaved_graph_ms(fns)
            wall = interleaved_host_and_loop_ms(fns, torch.cuda.synchronize)
            for setting in fns:
                print(f"{name} bfloat16 fwd #{repeat} {setting:32s} gpu {gpu[setting]:.4f} ms  "
                      f"loop {wall[setting][1]:.4f} ms", flush=True)
        torch._dynamo.reset()


KNOBS = {"rope": rope_knobs, "elementwise": elementwise_knobs, "elementwise-forward": elementwise_forward_knobs}

if __name__ == "__main__":
    for knob in sys.argv[1:] or KNOBS:  # python scripts/tune.py [rope] [elementwise] [elementwise-forward]
        KNOBS[knob]()
