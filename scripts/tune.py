"""Launch-setting sweep for RoPE and SwiGLU on a GPU (run on the lent H200; prints one table per knob;
RMSNorm has its own measured table: scripts/tune_rms_norm.py).

Each knob is a module-level function or constant of kernels/*.py, patched in turn; the shapes are
the benchmark's (oracle/bench/). Used to choose the defaults, not by the package itself.
"""

from __future__ import annotations

import importlib
import itertools

import torch
import triton.testing

import kernels
from oracle.ops import rope as rope_ops

rope = importlib.import_module("kernels.rope")
swiglu = importlib.import_module("kernels.swiglu")


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


def swiglu_knobs():
    e = torch.randn(16384, 14336, device="cuda", dtype=torch.bfloat16)
    g = torch.randn_like(e)
    for block in (1024, 2048):
        swiglu.BLOCK_SIZE = block
        print(f"swiglu forward     BLOCK_SIZE={block}: {ms(lambda: kernels.swiglu_fg_kernel(e, g)):.3f} ms")
    swiglu.BLOCK_SIZE = 1024


if __name__ == "__main__":
    rope_knobs()
    swiglu_knobs()
