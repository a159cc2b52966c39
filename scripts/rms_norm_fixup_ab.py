"""RMSNorm's backward with its dW partial rows in a buffer of their own against the same rows lent dX's
memory (Note [dW's partial rows inside dX]), at the widths where the 1% rule keeps them apart (GPU).

    python scripts/rms_norm_fixup_ab.py                   # 32768 and 65536 columns, 2^26 bf16 elements

For each width and variant: the backward's do_bench median in both placements, the memory it takes
beyond what it was handed (its peak minus what was allocated before the call), and whether dX and dW
are the same bits both ways (they must be: the placement moves memory, not sums).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _measure(rms, call, lend: bool):
    import triton.testing

    from oracle.bench import peak_mb

    shipped = rms.LEND_ABOVE
    rms.LEND_ABOVE = 1 << 40 if lend else shipped  # lend whenever there is a partial row at all
    try:
        extra_kib = peak_mb(call) * 1024
        ms = triton.testing.do_bench(call, warmup=25, rep=200)
        dW = call()  # the last call's dX stays in place for the comparison
    finally:
        rms.LEND_ABOVE = shipped
    return ms, extra_kib, dW


def backward_inputs(rms, width: int, elements: int, gemma: bool):
    """(X, W, dY, inv_var, dX): seeded bf16 rows of ``width`` columns, ``elements`` in all, their forward's
    1/rms, and dX to write (scripts/rms_norm_one_range_ab.py takes the same)."""
    import torch

    torch.manual_seed(0)
    X = torch.randn(elements // width, width, device="cuda", dtype=torch.bfloat16)
    W = (1 + 0.1 * torch.randn(width, device="cuda")).to(torch.bfloat16)
    dY = torch.randn_like(X)
    _, inv_var = rms.forward(X, W, 1e-6, gemma)
    return X, W, dY, inv_var, torch.empty_like(X)


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="32768,65536")
    parser.add_argument("--elements", type=int, default=1 << 26)
    args = parser.parse_args()
    rms = importlib.import_module("kernels.rms_norm")
    print(f"{'width':>6} {'variant':7} {'apart ms':>9} {'lent ms':>9} {'lent/apart':>10} "
          f"{'apart KiB':>10} {'lent KiB':>9} same bits")
    for width in (int(w) for w in args.widths.split(",")):
        for gemma in (False, True):
            X, W, dY, inv_var, dX = backward_inputs(rms, width, args.elements, gemma)
            call = lambda: rms.backward(dY, X, W, inv_var, gemma, dX, True)  # noqa: E731
            apart_ms, apart_kib, apart_dW = _measure(rms, call, lend=False)
            apart_dX = dX.clone()
            dX.zero_()
            lent_ms, lent_kib, lent_dW = _measure(rms, call, lend=True)
            same = torch.equal(apart_dX, dX) and torch.equal(apart_dW, lent_dW)
            print(f"{width:>6} {'gemma' if gemma else 'llama':7} {apart_ms:9.4f} {lent_ms:9.4f} "
                  f"{lent_ms / apart_ms:10.3f} {apart_kib:10.1f} {lent_kib:9.1f} {same}")


if __name__ == "__main__":
    main()
