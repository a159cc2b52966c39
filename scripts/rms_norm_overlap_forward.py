"""An experiment: RMSNorm's forward at 65536 columns with one row's second sweep and the next row's first in one loop (GPU).

The shipped looped forward (kernels/rms_norm.py) sweeps each row twice: the first sweep reads it
from HBM for its sum of squares, the second reads it again (mostly from L2) to write Y. While a
program is in its second sweep it asks HBM for nothing, and with the one or two programs an SM that
a 65536-column row leaves room for, the SM's loads from HBM come in bursts: 77-81% of copy
bandwidth on the H100 and the H200. Here each persistent program walks its rows with the two
sweeps of neighbouring rows fused: step c of the loop loads chunk c of the next row (from HBM, for
its sum of squares) together with chunk c of the current row (from L2, for Y), so a program's HBM
loads never pause between rows; only its first row's first sweep and its last row's second sweep
run alone. The chunks are summed in the shipped kernel's order and layout, so at the shipped
setting Y and 1/rms are the shipped bits (checked before timing; ``--check`` on a CPU).

Timed as the benchmark times the forward (CUDA graphs replayed back to back, in turns with the
shipped forward: oracle.bench.interleaved_graph_ms), 1024 x 65536 bf16, both variants.

    python scripts/rms_norm_overlap_forward.py            # on the GPU machine
    python scripts/rms_norm_overlap_forward.py --check    # any machine: the shipped bits, under the interpreter
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernels.rms_norm import _inv_rms, _row_offsets, _scaled  # noqa: E402

SETTINGS = [  # (columns a chunk, warps, programs an SM)
    (4096, 16, 1), (4096, 16, 2), (4096, 32, 1), (4096, 32, 2),
    (8192, 16, 1), (8192, 16, 2), (8192, 32, 1), (8192, 32, 2), (16384, 32, 1),
]


@triton.jit
def _overlapped_forward(
    Y_ptr, X_ptr, X_s0, X_s1, X_s2, X_col_stride, W_ptr, W_col_stride, inv_var_ptr,  # as the shipped kernels
    n_rows, n_cols, L1, L2, eps_hi, eps_lo,
    GEMMA: tl.constexpr, COMPUTE: tl.constexpr, CHUNK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64) + tl.arange(0, 1)  # a one-row block: the shipped layout of ROWS=1
    x_row = X_ptr + _row_offsets(row, L1, L2, X_s0, X_s1, X_s2)
    squares = tl.zeros([1, CHUNK], dtype=COMPUTE)
    for start in tl.range(0, n_cols, CHUNK):
        cols = start + tl.arange(0, CHUNK).to(tl.int64)
        x = tl.load(x_row[:, None] + cols[None, :] * X_col_stride, mask=(cols < n_cols)[None, :], other=0.0,
                    eviction_policy="evict_last").to(COMPUTE)
        squares += x * x
    inv_var = _inv_rms(tl.sum(squares, axis=1), n_cols, eps_hi, eps_lo, COMPUTE)
    tl.store(inv_var_ptr + row, inv_var)
    for following in tl.range(tl.program_id(0) + tl.num_programs(0), n_rows, tl.num_programs(0)):
        nxt = tl.cast(following, tl.int64) + tl.arange(0, 1)
        nxt_row = X_ptr + _row_offsets(nxt, L1, L2, X_s0, X_s1, X_s2)
        squares = tl.zeros([1, CHUNK], dtype=COMPUTE)
        for start in tl.range(0, n_cols, CHUNK):
            cols = start + tl.arange(0, CHUNK).to(tl.int64)
            col_mask = cols < n_cols
            ahead = tl.load(nxt_row[:, None] + cols[None, :] * X_col_stride, mask=col_mask[None, :], other=0.0,
                            eviction_policy="evict_last").to(COMPUTE)
            x = tl.load(x_row[:, None] + cols[None, :] * X_col_stride, mask=col_mask[None, :], other=0.0,
                        eviction_policy="evict_first").to(COMPUTE)
            w = tl.load(W_ptr + cols * W_col_stride, mask=col_mask, other=0.0).to(COMPUTE)
            y = _scaled(x * inv_var[:, None], w[None, :], X_ptr.dtype.element_ty, GEMMA, COMPUTE)
            tl.store(Y_ptr + row[:, None] * n_cols + cols[None, :], y, mask=col_mask[None, :],
                     eviction_policy="evict_first")
            squares += ahead * ahead
        inv_var = _inv_rms(tl.sum(squares, axis=1), n_cols, eps_hi, eps_lo, COMPUTE)
        tl.store(inv_var_ptr + nxt, inv_var)
        row, x_row = nxt, nxt_row
    for start in tl.range(0, n_cols, CHUNK):
        cols = start + tl.arange(0, CHUNK).to(tl.int64)
        col_mask = cols < n_cols
        x = tl.load(x_row[:, None] + cols[None, :] * X_col_stride, mask=col_mask[None, :], other=0.0,
                    eviction_policy="evict_first").to(COMPUTE)
        w = tl.load(W_ptr + cols * W_col_stride, mask=col_mask, other=0.0).to(COMPUTE)
        y = _scaled(x * inv_var[:, None], w[None, :], X_ptr.dtype.element_ty, GEMMA, COMPUTE)
        tl.store(Y_ptr + row[:, None] * n_cols + cols[None, :], y, mask=col_mask[None, :], eviction_policy="evict_first")


def overlapped(X, W, eps: float, gemma: bool, chunk: int, warps: int, per_sm: int):
    """(Y, inv_var) of 2-D contiguous X through the overlapped kernel, ``per_sm`` programs an SM."""
    from kernels._launch import TL_COMPUTE, program_slots
    from kernels._layout import rows_addressable
    from kernels.rms_norm import _forward_outputs, _split_eps

    Y, inv_var = _forward_outputs(X, W, gemma)
    n_rows, n_cols = X.shape
    eps_hi, eps_lo = _split_eps(eps)
    slots = program_slots(X.device.index if X.is_cuda else None)
    layout, (X_rows,) = rows_addressable(X)
    _overlapped_forward[(min(n_rows, per_sm * slots),)](
        Y, X_rows, *layout.strides[0], W, W.stride(0), inv_var, n_rows, n_cols, layout.lead[1], layout.lead[2],
        eps_hi, eps_lo,
        GEMMA=gemma, COMPUTE=TL_COMPUTE[inv_var.dtype],
        CHUNK=chunk, num_warps=warps)
    return Y, inv_var


def shipped_looped(X, W, eps: float, gemma: bool, chunk: int, warps: int, per_sm: int):
    from kernels._rms_norm_configs import Config

    rms = importlib.import_module("kernels.rms_norm")
    return rms.forward(X, W, eps, gemma, Config("looped", warps, rows=1, chunk=chunk, programs_per_sm=per_sm))


def same_bits(X, W, gemma: bool, setting) -> bool:
    import torch

    ours = overlapped(X, W, 1e-6, gemma, *setting)
    theirs = shipped_looped(X, W, 1e-6, gemma, *setting)
    return all(torch.equal(a, b) for a, b in zip(ours, theirs))


def check() -> None:
    """On the CPU: rows not a multiple of the programs, a last chunk cut short, both variants."""
    import torch

    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        X = torch.randn(11, 300, generator=gen).to(dtype)
        W = (1 + 0.1 * torch.randn(300, generator=gen)).to(dtype)
        for gemma in (False, True):
            if not same_bits(X, W, gemma, (128, 4, 1)):
                raise SystemExit(f"{dtype} gemma={gemma}: not the shipped looped kernel's bits")
    print("overlapped forward: the shipped looped kernel's bits, bf16 and fp32, both variants")


def time_on_gpu(cols: int, elements: int) -> None:
    import torch

    from oracle import bench

    rms = importlib.import_module("kernels.rms_norm")
    rows = elements // cols
    X = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    W = (1 + 0.1 * torch.randn(cols, device="cuda")).to(torch.bfloat16)
    copy = bench.copy_bandwidth_tbps()
    n_bytes = 2 * X.numel() * X.element_size()
    print(f"{torch.cuda.get_device_name()}, triton {triton.__version__}: {rows} x {cols} bf16, copy {copy:.2f} TB/s",
          flush=True)
    for gemma in (False, True):
        fns = {"shipped (table)": lambda gemma=gemma: rms.forward(X, W, 1e-6, gemma)}
        for setting in SETTINGS:
            if not same_bits(X, W, gemma, setting):
                print(f"  {setting}: NOT the shipped looped kernel's bits", flush=True)
            fns[f"overlapped chunk {setting[0]:5d} warps {setting[1]:2d} {setting[2]} an SM"] = (
                lambda setting=setting, gemma=gemma: overlapped(X, W, 1e-6, gemma, *setting))
            fns[f"looped     chunk {setting[0]:5d} warps {setting[1]:2d} {setting[2]} an SM"] = (
                lambda setting=setting, gemma=gemma: shipped_looped(X, W, 1e-6, gemma, *setting))
        times = bench.interleaved_graph_ms(fns)
        width = max(len(name) for name in times)
        for name, ms in times.items():
            print(f"{'gemma' if gemma else 'llama'} {name:{width}s} {ms:.4f} ms, {n_bytes / ms / 1e9 / copy:.1%} of copy",
                  flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="the shipped bits on a CPU (Triton's interpreter)")
    parser.add_argument("--cols", type=int, default=65536)
    parser.add_argument("--elements", type=int, default=2**26)
    args = parser.parse_args()
    if args.check:
        check()
    else:
        time_on_gpu(args.cols, args.elements)


if __name__ == "__main__":
    main()
