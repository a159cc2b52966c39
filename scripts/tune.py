"""Launch-setting sweep for the kernels on a GPU (run on the lent H200; prints one table per knob).

Each knob is a module-level function or constant of kernels/*.py, patched in turn; the shapes are
the benchmark's (oracle/bench.py). Used to choose the defaults, not by the package itself.
"""

from __future__ import annotations

import importlib
import itertools

import torch
import triton.testing

import kernels
from oracle.ops import rope as rope_ops

rms = importlib.import_module("kernels.rms_norm")
rope = importlib.import_module("kernels.rope")
swiglu = importlib.import_module("kernels.swiglu")


def ms(fn):
    """GPU time alone (CUDA-graph replay): launch overhead would drown the differences tuned here."""
    return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")


def rms_norm_knobs():
    X = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    W = torch.ones(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dY = torch.randn_like(X)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    saved = rms.program_slots, rms._backward_rows_per_step, rms._backward_stages
    forward = ms(lambda: kernels.rms_norm(X, W, 1e-6))
    print(f"rms_norm forward (subtracted below): {forward:.3f} ms")
    for per_sm, rows, stages in itertools.product((1, 4, 8, 16), (1, 2), (1, 2, 3)):
        rms.program_slots = lambda index, per_sm=per_sm: sms * per_sm
        rms._backward_rows_per_step = lambda block, rows=rows: rows
        rms._backward_stages = lambda block, stages=stages: stages
        t = ms(lambda: torch.autograd.grad(kernels.rms_norm(X, W, 1e-6), (X, W), dY)) - forward
        print(f"rms_norm backward  programs/SM={per_sm} rows/step={rows} stages={stages}: {t:.3f} ms")
    rms.program_slots, rms._backward_rows_per_step, rms._backward_stages = saved
    with torch.no_grad():
        for _ in range(2):  # twice, interleaved: a difference smaller than the spread is noise
            for warps in (1, 2, 4, 8, 16):
                original = rms.row_block
                rms.row_block = lambda n, warps=warps: (triton.next_power_of_2(n), warps)
                print(f"rms_norm forward   num_warps={warps}: {ms(lambda: kernels.rms_norm(X, W, 1e-6)):.3f} ms")
                rms.row_block = original


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
    rms_norm_knobs()
    rope_knobs()
    swiglu_knobs()
