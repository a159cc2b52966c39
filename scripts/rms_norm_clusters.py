"""An experiment, not shipped: RMSNorm's forward at 65536 columns with each row held in registers
across a Hopper thread-block cluster (Triton's ``num_ctas``: the row's block is split over the
cluster's CTAs, and ``tl.sum`` reduces through distributed shared memory), so that X is read from
HBM once. Compiles a minimal one-row kernel for sm_90 at each cluster size (timing waits for a
Triton on the H200 that compiles them).

    python scripts/rms_norm_clusters.py 2>/dev/null  # any machine: compiling needs no GPU (stderr: MLIR dumps)

Triton 3.6 (the H200's) fails every cluster size (an MLIR pass pipeline failure; see
reports/logs/rms-norm-clusters-compile.log, and rms-norm-clusters-h200.log for the tuner run with
the shipped kernel there); Triton 3.9 compiles them.
"""

from __future__ import annotations

import os

os.environ.pop("TRITON_INTERPRET", None)  # compile for the GPU even on a CPU machine

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

COLS = 65536
SETTINGS = [(1, 32), (2, 16), (2, 32), (4, 8), (4, 16), (4, 32), (8, 8), (8, 16)]  # (CTAs, warps per CTA)


@triton.jit
def _one_row_forward(Y_ptr, X_ptr, W_ptr, inv_var_ptr, n_cols, eps, BLOCK: tl.constexpr):
    """Llama's RMSNorm of one row per program (cluster), fp32 inside, without the shipped kernel's
    layouts, eps split and Gemma variant: what the experiment needs to compile."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    inv_var = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(inv_var_ptr + row, inv_var)
    w = tl.load(W_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = (x * inv_var).to(Y_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(Y_ptr + row * n_cols + cols, y, mask=mask)


def compiles(ctas: int, warps: int) -> str:
    """'ok' (with the PTX's cluster instructions counted) or the compiler's first line."""
    signature = {"Y_ptr": "*bf16", "X_ptr": "*bf16", "W_ptr": "*bf16", "inv_var_ptr": "*fp32", "n_cols": "i32",
                 "eps": "fp32", "BLOCK": "constexpr"}
    source = ASTSource(_one_row_forward, signature, constexprs={"BLOCK": COLS},
                       attrs={(i,): [["tt.divisibility", 16]] for i in range(5)})
    try:
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": warps, "num_ctas": ctas})
    except Exception as exc:  # noqa: BLE001 - a setting the compiler refuses is the finding
        return f"fails: {str(exc).splitlines()[0][:100]}"
    ptx = compiled.asm["ptx"]
    return f"ok ({ptx.count('barrier.cluster')} cluster barriers in the PTX)"


def main() -> None:
    print(f"triton {triton.__version__}: one row of {COLS} bf16 columns per program, compiled for sm_90")
    for ctas, warps in SETTINGS:
        print(f"  {ctas} CTAs x {warps:2d} warps: {compiles(ctas, warps)}", flush=True)


if __name__ == "__main__":
    main()
