"""The kernels' Python on the host, without the launches: each Triton kernel replaced by a no-op, so
that what is left is validation, allocation, autograd and the launch arguments. Runs on the CPU
(no GPU needed); compare the rows of one run, not runs of different machines.

    python scripts/host_path_cpu.py       # git checkout 8afd716 -- kernels: the same rows before
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kernels  # noqa: E402

RMS = importlib.import_module("kernels.rms_norm")
ROPE = importlib.import_module("kernels.rope")


class _NoLaunch:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def stub_launches() -> None:
    for name in ("_rms_norm_forward_kernel", "_rms_norm_forward_looped_kernel", "_rms_norm_backward_kernel",
                 "_sum_partials_kernel", "_rms_norm_row_dot_kernel", "_rms_norm_tail_kernel",
                 "_rms_norm_forward_parts_kernel"):
        setattr(RMS, name, _NoLaunch())
    ROPE._rope_kernel = _NoLaunch()


def us_per_call(fn, calls: int = 2000, loops: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(loops):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main() -> None:
    stub_launches()
    X = torch.randn(64, 4096, dtype=torch.bfloat16, requires_grad=True)
    W = torch.ones(4096, dtype=torch.bfloat16, requires_grad=True)
    dY = torch.randn_like(X)
    Q0 = torch.randn(1, 32, 64, 128, dtype=torch.bfloat16, requires_grad=True)
    K0 = torch.randn(1, 8, 64, 128, dtype=torch.bfloat16, requires_grad=True)
    dQ, dK = torch.randn_like(Q0), torch.randn_like(K0)
    cos, sin = torch.randn(128, 128), torch.randn(128, 128)
    positions = torch.randint(0, 128, (1, 64))
    Qd, Kd = Q0.detach().clone(), K0.detach().clone()

    def rope_fwd_bwd(position_ids=None):
        Q, K = Q0.clone(), K0.clone()
        return torch.autograd.grad(kernels.rope(Q, K, cos, sin, position_ids), (Q0, K0), (dQ, dK))

    def rope_backward_alone(position_ids=None):
        """RotatedInPlace.backward on a recorded node (the node is its ctx), without autograd's engine."""
        Q, K = Q0.clone(), K0.clone()
        kernels.rope(Q, K, cos, sin, position_ids)
        node = Q.grad_fn
        return lambda: ROPE.RotatedInPlace.backward(node, dQ, dK)

    x = torch.randn(16, requires_grad=True)
    rows = {
        "floor: autograd.grad of y = x * 1": lambda: torch.autograd.grad(x * 1, x, torch.ones_like(x)),
        "rms_norm fwd (no autograd)": lambda: kernels.rms_norm(X.detach(), W.detach(), 1e-6),
        "rms_norm fwd+bwd": lambda: torch.autograd.grad(kernels.rms_norm(X, W, 1e-6), (X, W), dY),
        "rope fwd (no autograd)": lambda: kernels.rope(Qd, Kd, cos, sin),
        "rope fwd packed (no autograd)": lambda: kernels.rope(Qd, Kd, cos, sin, positions),
        "floor: rope's two clones + grad": lambda: torch.autograd.grad((Q0.clone(), K0.clone()), (Q0, K0), (dQ, dK)),
        "rope fwd+bwd": rope_fwd_bwd,
        "rope fwd+bwd packed": lambda: rope_fwd_bwd(positions),
        "rope backward alone": rope_backward_alone(),
        "rope backward alone, packed": rope_backward_alone(positions),
    }
    print(f"torch {torch.__version__}; launches stubbed; best of 5 loops of 2000 calls")
    for name, fn in rows.items():
        print(f"{name:36s} {us_per_call(fn):7.1f} us")


if __name__ == "__main__":
    main()
