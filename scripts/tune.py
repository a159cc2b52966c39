"""Launch-setting sweep for RoPE, SwiGLU and GeGLU on a GPU (run on the lent H200; prints one table per knob;
RMSNorm has its own measured table: scripts/tune_rms_norm.py).

Each knob is a module-level function or constant of kernels/*.py, patched in turn; the shapes are
the benchmark's (oracle/bench/). Used to choose the defaults, not by the package itself.
"""

from __future__ import annotations

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


def elementwise_knobs():
    """SwiGLU's and GeGLU's forward+backward (what the benchmark's fwd+bwd target times) per BLOCK_SIZE
    and num_warps of the flat launch, against torch.compile of HF's maths: GPU times from CUDA-graph
    replays taken in turn (oracle.bench.interleaved_graph_ms), so the settings are compared in one run."""
    from oracle.bench import interleaved_graph_ms
    from oracle.ops.geglu import geglu
    from oracle.ops.swiglu import swiglu

    e = torch.randn(16384, 14336, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn_like(e, requires_grad=True)
    dh = torch.randn_like(e)
    original_block, original_launch = elementwise.BLOCK_SIZE, elementwise.launch

    def fwd_bwd(fn):
        return lambda: torch.autograd.grad(fn(e, g), (e, g), dh)

    def with_setting(fn, block, warps):
        def call():
            elementwise.BLOCK_SIZE = block
            elementwise.launch = lambda kernel, grid, *args, **options: original_launch(kernel, grid, *args,
                                                                                         num_warps=warps, **options)
            try:
                return fn()
            finally:
                elementwise.BLOCK_SIZE, elementwise.launch = original_block, original_launch
        return call

    for name, ours, hf in (("swiglu", kernels.swiglu, swiglu), ("geglu", kernels.geglu, geglu)):  # GeGLU: tanh
        fns = {"compile": fwd_bwd(torch.compile(hf, dynamic=False))}
        for block, warps in itertools.product((1024, 2048, 4096), (4, 8)):
            fns[f"BLOCK_SIZE={block} num_warps={warps}"] = with_setting(fwd_bwd(ours), block, warps)
        for setting, gpu in interleaved_graph_ms(fns).items():
            print(f"{name} fwd+bwd {setting:30s} {gpu:.4f} ms", flush=True)


KNOBS = {"rope": rope_knobs, "elementwise": elementwise_knobs}

if __name__ == "__main__":
    for knob in sys.argv[1:] or KNOBS:  # python scripts/tune.py [rope] [elementwise]
        KNOBS[knob]()
