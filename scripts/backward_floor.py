"""An experiment: where RMSNorm's backward loses time against the bytes it moves.

At 2^26 bf16 elements the backward takes about 0.12 ms at every width from 128 to 8192 columns
(the tuner's best settings, Llama and Gemma alike), 402 MB read and written: 78% of the copy's
bandwidth, where the forward reaches 95%. torch.compile's backward sits at the same place. Either
two reads and one write are slower on the H200 than one read and one write (then 0.12 ms is the
floor of the backward's bytes, and a tie there is a tie at the hardware's limit), or our kernel
loses the time somewhere. A ladder, each rung adding one thing the backward does, all timed at
the same shape, L2 flushed between calls (triton.testing.do_bench, as the tuner):

    copy          dX.copy_(X): one read, one write (the forward's pattern)
    add           torch.add(X, dY, out=dX): two reads, one write (the backward's pattern)
    stream        a Triton kernel with the backward's launch (its grid, rows a step, warps, pipelining):
                  dX = X + dY, nothing else
    row sum       the same, with each row's sum of dY * X and 1/rms: the backward without W and dW
    no dW         the shipped backward, W needing no gradient
    dW's sum      the launch that sums the programs' partial rows of dW, alone (the bytes: the partials)
    shipped       the shipped backward with dW (its partial rows' sum and fix-up launches included)

    python scripts/backward_floor.py                   # on the GPU: widths 256, 512, 4096, 16384
    python scripts/backward_floor.py --check           # anywhere (the interpreter on a CPU): the rungs' values
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


rms = importlib.import_module("kernels.rms_norm")  # the module (kernels.rms_norm is also the function)


@triton.jit
def _stream_kernel(dX_ptr, dY_ptr, X_ptr, inv_var_ptr, n_rows, n_cols, rows_per_program,
                   ROW_SUM: tl.constexpr, ROWS: tl.constexpr, BLOCK_SIZE: tl.constexpr, NUM_STAGES: tl.constexpr):
    """The backward's loop over a program's rows (contiguous rows only), with its arithmetic left out
    (ROW_SUM=False: dX = X + dY) or all but W's (ROW_SUM=True)."""
    pid = tl.program_id(0).to(tl.int64)
    first_row = pid * rows_per_program
    end_row = tl.minimum(first_row + rows_per_program, n_rows)
    cols = tl.arange(0, BLOCK_SIZE).to(tl.int64)
    col_mask = cols < n_cols
    for start in tl.range(first_row, end_row, ROWS, num_stages=NUM_STAGES):
        rows = start + tl.arange(0, ROWS)
        row_mask = rows < end_row
        mask = row_mask[:, None] & col_mask[None, :]
        offsets = rows[:, None] * n_cols + cols[None, :]
        x = tl.load(X_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dY_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        if ROW_SUM:
            inv_var = tl.load(inv_var_ptr + rows, mask=row_mask, other=0.0)[:, None]
            normed = x * inv_var
            mean = tl.sum(dy * normed, axis=1) / n_cols
            dx = inv_var * (dy - normed * mean[:, None])
        else:
            dx = x + dy
        tl.store(dX_ptr + offsets, dx, mask=mask)


def _launch(dY: torch.Tensor, X: torch.Tensor, W: torch.Tensor, inv_var: torch.Tensor,
            gemma: bool) -> tuple[int, int, dict]:
    """(programs, rows a program, launch settings) of the shipped backward's main launch for these inputs,
    read from one call of it (so the stream rungs follow whatever the backward decides)."""
    seen = []

    def recording(kernel, grid, *args, **settings):
        if kernel is rms._rms_norm_backward_kernel and not settings["FIXUP"]:
            seen.append((grid, dict(zip(kernel.arg_names, args)), settings))
        return launch(kernel, grid, *args, **settings)

    launch, rms.launch = rms.launch, recording
    try:
        rms.backward(dY, X, W, inv_var, gemma, torch.empty_like(X), True)
    finally:
        rms.launch = launch
    (grid, args, settings), = seen
    if settings["SPLIT"]:
        raise SystemExit(f"{X.shape[-1]} columns: the table's backward takes the split path; the ladder follows "
                         "the whole-row path only")
    return grid[0], args["rows_per_program"], {name: settings[name] for name in
                                               ("ROWS", "BLOCK_SIZE", "NUM_STAGES", "num_warps")}


def rungs(X: torch.Tensor, dY: torch.Tensor, W: torch.Tensor, gemma: bool) -> tuple[list, dict[str, torch.Tensor]]:
    """(name, bytes moved, call) for each rung in order, and the tensors they read and write: 1/rms, the
    dX every call but the sum's writes, the partial rows and the dW it writes."""
    rows, cols = X.shape
    _, inv_var = rms.forward(X, W, 1e-6, gemma)
    tensor_bytes = X.numel() * X.element_size()
    programs, per_program, settings = _launch(dY, X, W, inv_var, gemma)
    dX = torch.empty_like(X)
    partials = torch.randn(programs, cols, device=X.device)  # the partial rows in a buffer of their own
    dW = torch.empty(cols, device=X.device, dtype=W.dtype)

    def stream(row_sum: bool):
        return lambda: _stream_kernel[(programs,)](dX, dY, X, inv_var, rows, cols, per_program, ROW_SUM=row_sum,
                                                   **settings)

    return [("copy", 2 * tensor_bytes, lambda: dX.copy_(X)),
            ("add", 3 * tensor_bytes, lambda: torch.add(X, dY, out=dX)),
            ("stream", 3 * tensor_bytes, stream(False)),
            ("row sum", 3 * tensor_bytes, stream(True)),
            ("no dW", 3 * tensor_bytes, lambda: rms.backward(dY, X, W, inv_var, gemma, dX, False)),
            ("dW's sum", partials.numel() * 4, lambda: rms.sum_partials(dW, partials, programs, rows, per_program, 0,
                                                                       X.element_size())),
            ("shipped", 3 * tensor_bytes, lambda: rms.backward(dY, X, W, inv_var, gemma, dX, True))], \
        dict(inv_var=inv_var, dX=dX, partials=partials, dW=dW)


def check() -> None:
    """Each Triton rung's output against torch's, on a small shape (the interpreter on a CPU)."""
    torch.manual_seed(0)
    for rows, cols in ((37, 256), (9, 512)):
        X = torch.randn(rows, cols, dtype=torch.bfloat16)
        dY = torch.randn(rows, cols, dtype=torch.bfloat16)
        W = torch.ones(cols, dtype=torch.bfloat16)
        calls, t = rungs(X, dY, W, False)
        x, dy, r = X.float(), dY.float(), t["inv_var"][:, None]
        dx = r * (dy - x * r * (dy * x * r).mean(dim=1, keepdim=True))
        expected = {"stream": ("dX", x + dy), "row sum": ("dX", dx), "no dW": ("dX", dx),
                    "dW's sum": ("dW", t["partials"].sum(dim=0))}
        for name, _, call in calls:
            if name in expected:
                call()
                output, value = expected[name]
                torch.testing.assert_close(t[output].float(), value.to(torch.bfloat16).float(), rtol=0.02, atol=0.02)
                print(f"{rows} x {cols}: {name} ok")


def _add_bandwidth_tbps(n_bytes: int = 2**31) -> float:
    """torch.add's bandwidth (two reads, one write) on tensors the size of the benchmark's copy's."""
    from triton.testing import do_bench

    a, b, out = torch.empty(3, n_bytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    return 3 * n_bytes / (do_bench(lambda: torch.add(a, b, out=out), return_mode="median") * 1e-3) / 1e12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="256,512,4096,16384")
    parser.add_argument("--variants", default="llama,gemma")
    parser.add_argument("--elements", type=int, default=2**26)
    parser.add_argument("--check", action="store_true", help="the rungs' values on a small shape, on any device")
    args = parser.parse_args()
    if args.check:
        return check()
    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("timing needs a GPU (run --check on a CPU)")
    from oracle.bench import copy_bandwidth_tbps
    from triton.testing import do_bench

    copy_tbps, add_tbps = copy_bandwidth_tbps(), _add_bandwidth_tbps()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; 2 GiB tensors: "
          f"copy {copy_tbps:.2f} TB/s, add {add_tbps:.2f} TB/s ({add_tbps / copy_tbps:.1%} of copy)", flush=True)
    torch.manual_seed(0)
    for cols in (int(c) for c in args.widths.split(",")):
        rows = args.elements // cols
        X = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        dY = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        W = (1 + 0.1 * torch.randn(cols, device="cuda")).to(torch.bfloat16)
        for variant in args.variants.split(","):
            calls, _ = rungs(X, dY, W, variant == "gemma")
            line = []
            for name, n_bytes, call in calls:
                if variant != "llama" and name in ("copy", "add", "stream", "row sum"):
                    continue  # the same as Llama's: no W in them
                ms = do_bench(call, return_mode="median")
                line.append(f"{name} {ms:.4f} ms {n_bytes / ms / 1e9 / copy_tbps:.0%}")
            print(f"{rows} x {cols} {variant}: " + " | ".join(line), flush=True)


if __name__ == "__main__":
    main()
