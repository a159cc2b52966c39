"""Where a call's host time goes, on the GPU machine: the floor every implementation pays (autograd,
one Triton launch by argument count, a custom Function), RoPE's call layer by layer (the launch, the
op's body, the wrapper, the backward alone) and its forward+backward against torch.compile's, each
with Triton's own launch and with the direct launch (kernels/_launcher.py), and a cProfile of the
kernels' RMSNorm and RoPE forward+backward (and packed RoPE's forward) at Llama-3-8B shapes.

    python scripts/host_profile.py            # prints; the note of the performance issue quotes it
"""

from __future__ import annotations

import cProfile
import importlib
import io
import pstats
import sys
import time
import types
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kernels
from kernels import _launcher
from oracle.bench import interleaved_host_and_loop_ms
from oracle.ops.rope import packed_positions, rotary_table

CALLS, LOOPS = 200, 7
LAUNCHES = {"Triton's launch": False, "direct launch": True}  # kernels/_launcher.py's DIRECT


def host_us(fn) -> float:
    """Best of LOOPS loops: microseconds the host spends issuing one call (the GPU is synchronised
    between loops, never inside one)."""
    fn()
    best = float("inf")
    for _ in range(LOOPS):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(CALLS):
            fn()
        best = min(best, (time.perf_counter() - start) / CALLS * 1e6)
    torch.cuda.synchronize()
    return best


def with_launch(direct: bool, fn):
    """fn with the launch path set before each call (so that competitors can be interleaved)."""
    def call():
        _launcher.DIRECT = direct
        return fn()

    return call


@triton.jit
def _empty_8(a, b, c, d, e, f, g, h, N: tl.constexpr):
    pass


@triton.jit
def _empty_32(a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7,
              c0, c1, c2, c3, c4, c5, c6, c7, d0, d1, d2, d3, d4, d5, d6, d7, N: tl.constexpr):
    pass


class _Dirty(torch.autograd.Function):
    """What RotatedInPlace does to autograd, without a kernel: marks its inputs dirty, returns them."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.mark_dirty(a, b)
        return a, b

    @staticmethod
    def backward(ctx, da, db):
        return da, db


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


def floor() -> None:
    x = torch.randn(16, device="cuda", requires_grad=True)
    ptr = torch.empty(16, device="cuda")
    ints = list(range(3, 35))
    flag = torch.ones(1, dtype=torch.int32, device="cuda")
    ones = torch.ones_like(x)
    rows = [
        ("torch.autograd.grad of y = x * 1", lambda: torch.autograd.grad(x * 1, x, torch.ones_like(x))),
        ("custom Function apply + grad", lambda: torch.autograd.grad(_Identity.apply(x), x, torch.ones_like(x))),
        ("one Triton launch, 8 arguments", lambda: _empty_8[(1,)](ptr, ptr, 3, 4, 5, 6, 7, 8, N=1)),
        ("one Triton launch, 32 arguments", lambda: _empty_32[(1,)](ptr, ptr, *ints[2:], N=1)),
        ("torch.empty", lambda: torch.empty(16, device="cuda")),
        ("tensor.clone", lambda: ptr.clone()),
        ("a one-element int32 flag (torch.ones)", lambda: torch.ones(1, dtype=torch.int32, device="cuda")),
        ("torch._assert_async on it", lambda: torch._assert_async(flag, "never")),
        ("mark_dirty Function on 2 clones + grad", lambda: torch.autograd.grad(_Dirty.apply(x.clone(), x.clone()),
                                                                          x, (ones, ones))),
    ]
    for name, fn in rows:
        print(f"floor  {name:36s} {host_us(fn):7.1f} us", flush=True)


def workloads() -> dict:
    X = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    W = torch.ones(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dY = torch.randn_like(X)
    Q0 = torch.randn(4, 32, 4096, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    K0 = torch.randn(4, 8, 4096, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dQ, dK = torch.randn_like(Q0), torch.randn_like(K0)
    cos, sin = rotary_table(4096, 128, 500000.0, device="cuda")
    positions = packed_positions(4, 4096, torch.Generator().manual_seed(0)).cuda()

    def rope_fwd_bwd(*packed):
        Q, K = Q0.clone(), K0.clone()
        return torch.autograd.grad(kernels.rope(Q, K, cos, sin, *packed), (Q0, K0), (dQ, dK))

    return {
        "rms_norm fwd": lambda: kernels.rms_norm(X.detach(), W.detach(), 1e-6),
        "rms_norm fwd+bwd": lambda: torch.autograd.grad(kernels.rms_norm(X, W, 1e-6), (X, W), dY),
        "rms_norm gemma fwd": lambda: kernels.rms_norm(X.detach(), W.detach(), 1e-6, True),
        "rms_norm gemma fwd+bwd": lambda: torch.autograd.grad(kernels.rms_norm(X, W, 1e-6, True), (X, W), dY),
        "rope fwd (no autograd)": lambda: kernels.rope(Q0.detach().clone(), K0.detach().clone(), cos, sin),
        "rope fwd+bwd": rope_fwd_bwd,
        "rope packed fwd (no autograd)": lambda: kernels.rope(Q0.detach().clone(), K0.detach().clone(), cos, sin,
                                                              positions),
        "rope packed fwd+bwd": lambda: rope_fwd_bwd(positions),
        "rope's two clones + grad alone": lambda: torch.autograd.grad((Q0.clone(), K0.clone()), (Q0, K0), (dQ, dK)),
    }


SHAPES = {"small": (1, 8, 2, 16, 128), "model": (4, 32, 8, 4096, 128)}  # batch, heads, kv heads, seq, head_dim


def rope_layers(shape: str) -> None:
    """RoPE's forward and backward taken apart: each row adds one layer of the call to the row above,
    so the differences say what each layer costs (plain: no position_ids; packed: position_ids). At
    the small shape the GPU's time cannot hold the host back, so the rows are the host's alone."""
    rope_module = importlib.import_module("kernels.rope")
    batch, heads, kv_heads, seq, head_dim = SHAPES[shape]
    Q = torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16)
    K = torch.randn(batch, kv_heads, seq, head_dim, device="cuda", dtype=torch.bfloat16)
    cos, sin = rotary_table(seq, head_dim, 500000.0, device="cuda")
    packed = packed_positions(batch, seq, torch.Generator().manual_seed(0)).cuda()
    for name, positions in (("plain", None), ("packed", packed)):
        buffers, placements = rope_module._buffers(Q, K)
        ctx = types.SimpleNamespace(saved_tensors=(cos, sin, positions), placements=placements,
                                    layouts=rope_module._layouts(buffers, placements))
        rows = [
            ("Triton launch alone (_launch)", lambda: rope_module._launch(Q, Q, K, K, cos, sin, positions, False)),
            ("+ the op's body (memory checks)", lambda: rope_module._rotate_in_place(Q, K, cos, sin, positions)),
            ("+ the wrapper, no autograd", lambda: kernels.rope(Q, K, cos, sin, positions)),
            ("backward alone (fake ctx)", lambda: rope_module.RotatedInPlace.backward(ctx, Q, K)),
        ]
        for launch, direct in LAUNCHES.items():
            for row, fn in rows:
                print(f"rope {shape:5s} {name:6s} {launch:15s} {row:34s} {host_us(with_launch(direct, fn)):7.1f} us",
                      flush=True)
    _launcher.DIRECT = True


def rope_fwd_bwd_rows(shape: str) -> None:
    """Forward+backward as the benchmark times it (two clones, the call, autograd.grad): the kernels
    with either launch against torch.compile of HF's function, interleaved loops of 30 calls as the
    benchmark takes them (medians of 7): host until issued, loop until the GPU is done too."""
    from oracle.ops.rope import apply_rotary_pos_emb, table_rows

    batch, heads, kv_heads, seq, head_dim = SHAPES[shape]
    Q0 = torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    K0 = torch.randn(batch, kv_heads, seq, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dQ, dK = torch.randn_like(Q0), torch.randn_like(K0)
    cos, sin = rotary_table(seq, head_dim, 500000.0, device="cuda")
    packed = packed_positions(batch, seq, torch.Generator().manual_seed(0)).cuda()
    rows = table_rows(Q0, cos, sin, packed)
    compiled = torch.compile(apply_rotary_pos_emb, dynamic=False)

    def fwd_bwd(call):
        return lambda: torch.autograd.grad(call(Q0.clone(), K0.clone()), (Q0, K0), (dQ, dK))

    calls = {"two clones + grad alone": lambda: torch.autograd.grad((Q0.clone(), K0.clone()), (Q0, K0), (dQ, dK)),
             "compile (HF's function)": fwd_bwd(lambda Q, K: compiled(Q, K, *rows))}
    for launch, direct in LAUNCHES.items():
        calls[f"kernels plain, {launch}"] = with_launch(direct, fwd_bwd(lambda Q, K: kernels.rope(Q, K, cos, sin)))
        calls[f"kernels packed, {launch}"] = with_launch(direct, fwd_bwd(lambda Q, K: kernels.rope(Q, K, cos, sin,
                                                                                                 packed)))
    for name, (host, loop) in interleaved_host_and_loop_ms(calls, torch.cuda.synchronize).items():
        print(f"rope {shape:5s} fwd+bwd {name:36s} host {host * 1e3:7.1f} us, loop {loop * 1e3:7.1f} us", flush=True)
    _launcher.DIRECT = True


def main() -> None:
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    floor()
    for shape in SHAPES:
        rope_layers(shape)
        rope_fwd_bwd_rows(shape)
    calls = workloads()
    for name, fn in calls.items():
        for launch, direct in LAUNCHES.items():
            print(f"kernels {name:34s} {launch:15s} {host_us(with_launch(direct, fn)):7.1f} us host per call",
                  flush=True)
    _launcher.DIRECT = True
    for name in ("rms_norm fwd+bwd", "rope fwd+bwd", "rope packed fwd (no autograd)"):
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(CALLS):
            calls[name]()
        profiler.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(22)
        print(f"\n--- cProfile, {CALLS} calls of kernels {name} (tottime) ---")
        print("\n".join(line for line in text.getvalue().splitlines()[6:] if line.strip()))


if __name__ == "__main__":
    importlib.import_module("kernels.rope")
    main()
