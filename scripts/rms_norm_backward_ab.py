"""RMSNorm's backward against Liger-Kernel's on one shape, kernel against kernel (GPU; Liger installed).

    python scripts/rms_norm_backward_ab.py                     # do_bench medians, both variants
    ncu --clock-control none -k regex:backward python scripts/rms_norm_backward_ab.py --once

Ours is timed in the shipped setting (with and without dW) and in the whole-row settings the tuner
offers; Liger's as its autograd Function calls it (in place, its partial rows summed by torch).
`--once` calls each setting once, in the order it prints, for a profiler to read kernel by kernel
(ncu flushes the caches before each kernel it profiles).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernels._rms_norm_configs import Config


def _cases(rms, liger, X, W, dY, gemma: bool):
    """(name, call) pairs: ours in several settings, then Liger's."""
    _, inv_var = rms.forward(X, W, 1e-6, gemma)
    dX = dY.clone()
    cases = [("shipped", lambda: rms.backward(dY, X, W, inv_var, gemma, dX, True))]
    cases.append(("shipped-no-dW", lambda: rms.backward(dY, X, W, inv_var, gemma, dX, False)))
    for warps in (8, 16, 32):
        config = Config("rows", warps)
        cases.append((f"rows-{warps}w", lambda c=config: rms.backward(dY, X, W, inv_var, gemma, dX, True, c)))
    if liger is not None:
        offset, casting = (1.0, "gemma") if gemma else (0.0, "llama")
        _, _, rstd, block, warps, mode = liger.rms_norm_forward(X, W, 1e-6, offset, casting, None)
        scratch = dY.clone()  # Liger writes dX into dY: its own copy, so ours keep theirs
        cases.append(("liger", lambda: liger.rms_norm_backward(scratch, X, W, rstd, offset, mode, block, warps,
                                                               True, None)))
    return cases


def main() -> None:
    import torch
    import triton.testing

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=16384)
    parser.add_argument("--variants", default="gemma,llama")
    parser.add_argument("--once", action="store_true", help="each setting called once, for a profiler")
    args = parser.parse_args()
    try:
        import liger_kernel.ops.rms_norm as liger
    except ImportError:
        liger = None
        print("Liger-Kernel is not installed: ours only")
    rms = importlib.import_module("kernels.rms_norm")  # the module (kernels.rms_norm is also the function)

    torch.manual_seed(0)
    X = torch.randn(args.rows, args.cols, device="cuda", dtype=torch.bfloat16)
    W = (1 + 0.1 * torch.randn(args.cols, device="cuda")).to(torch.bfloat16)
    dY = torch.randn_like(X)
    gb = 3 * X.numel() * X.element_size() / 1e9  # dY and X read, dX written
    for variant in args.variants.split(","):
        for name, call in _cases(rms, liger, X, W, dY, variant == "gemma"):
            label = f"{variant}-{name}"
            if args.once:
                call()
                torch.cuda.synchronize()
                print(label, "ran", flush=True)
                continue
            ms = triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median")
            print(f"{label:28s} {ms:.4f} ms  {gb / ms:.2f} TB/s", flush=True)


if __name__ == "__main__":
    main()
