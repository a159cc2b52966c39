"""An experiment: the launch that sums RMSNorm's dW partial rows, with fewer columns a program (GPU).

At narrow widths the backward's dW costs a launch of its own after the main one: kernels/rms_norm.py's
sum_partials adds the programs' partial rows (one per backward program: 132 on an H100 from 256 to
4096 columns), 64 columns a program before this experiment. At 256 columns that is 4 programs on 4
SMs, each walking every partial row: on an H100 the launch took 0.0110 ms of the backward's 0.1562
at 262144 x 256 (``scripts/backward_floor.py``, "dW's sum"), about what the shipped backward took over
its no-dW form (0.1462). Here the same kernel is launched with 64, 32, 16 and 8 columns a program,
the partial rows' steps (PARTIALS) as shipped, on the partial rows the shipped backward leaves at each
width (2^26 bf16 elements, Llama); times are do_bench medians with L2 flushed, and each variant's dW
is compared with the 64 columns' bits (the reduction tree inside a step follows the tile's layout,
which the block size may change). On an H100, 16 columns a program took about 3 us less at every
width, with the same bits up to 2048 columns (docs/performance.md, the twentieth session): the
shipped sum now takes 16 up to 4096 columns (``_sum_columns``).

    python scripts/rms_norm_dw_sum_ab.py              # on the GPU machine: widths 256 to 4096
    python scripts/rms_norm_dw_sum_ab.py --check      # any machine: each block size's dW against torch's sum
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BLOCKS = (64, 32, 16, 8)
rms = importlib.import_module("kernels.rms_norm")  # the module (kernels.rms_norm is also the function)


def sum_with_block(dW, partials, programs: int, n_rows: int, rows_per_program: int, block: int) -> None:
    """kernels/rms_norm.py's sum_partials (partials in a buffer of their own), ``block`` columns a program."""
    rms.sum_partials(dW, partials, programs, n_rows, rows_per_program, 0, 2, columns=block)


def _case(rows: int, cols: int, device: str):
    """(programs, rows a program, random partial rows) as the shipped backward launches at this shape."""
    import torch

    from scripts.backward_floor import _launch

    X = torch.randn(rows, cols, device=device, dtype=torch.bfloat16)
    dY = torch.randn_like(X)
    W = torch.ones(cols, device=device, dtype=torch.bfloat16)
    _, inv_var = rms.forward(X, W, 1e-6, False)
    programs, per_program, _ = _launch(dY, X, W, inv_var, False)
    return programs, per_program, torch.randn(programs, cols, device=device)


def check() -> None:
    import torch

    torch.manual_seed(0)
    for rows, cols in ((300, 256), (77, 40)):
        programs, per_program, partials = _case(rows, cols, "cpu")
        for block in BLOCKS:
            dW = torch.empty(cols, dtype=torch.bfloat16)
            sum_with_block(dW, partials, programs, rows, per_program, block)
            torch.testing.assert_close(dW.float(), partials.sum(dim=0).to(torch.bfloat16).float(), rtol=0.01,
                                       atol=0.01)
        print(f"{rows} x {cols}: {programs} partial rows, blocks {BLOCKS}: dW ok")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="256,512,1024,2048,4096")
    parser.add_argument("--check", action="store_true", help="each block size's dW on a small shape, any device")
    args = parser.parse_args()
    if args.check:
        return check()
    import torch
    import triton
    from triton.testing import do_bench

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    torch.manual_seed(0)
    for cols in (int(c) for c in args.widths.split(",")):
        rows = 2**26 // cols
        programs, per_program, partials = _case(rows, cols, "cuda")
        wide = torch.empty(cols, device="cuda", dtype=torch.bfloat16)  # 64 columns a program, as first shipped
        sum_with_block(wide, partials, programs, rows, per_program, BLOCKS[0])
        line = []
        for block in BLOCKS:
            dW = torch.empty_like(wide)
            sum_with_block(dW, partials, programs, rows, per_program, block)
            same = "same bits" if torch.equal(dW, wide) else "other bits"
            ms = do_bench(lambda: sum_with_block(dW, partials, programs, rows, per_program, block),
                          return_mode="median")
            line.append(f"{block} cols {ms * 1000:.1f} us ({same})")
        print(f"{rows} x {cols}, {programs} partial rows: " + " | ".join(line), flush=True)


if __name__ == "__main__":
    main()
