"""Four ops declared from outside the harness (its README's "Testing an op of your own"): each a
reference in plain torch and a few lines of data. Found through this project's entry point
(pyproject.toml), or with --op-module declared_ops."""

import torch
import torch.nn.functional as F

from oracle import Dim, Integers, Op, Tensor

ROWS = Dim(1, 4096, programs=True)
WIDTH = Dim(1, 8192, special=(1, 7, 128, 1000, 1023, 4097, 8192))

LAYER_NORM = Op(
    "layer_norm",
    reference=lambda X, W, B, eps: F.layer_norm(X, X.shape[-1:], W, B, eps),
    inputs={"X": Tensor("rows", "cols"), "W": Tensor("cols", values="weight"), "B": Tensor("cols", values="small")},
    dims={"rows": ROWS, "cols": WIDTH}, params={"eps": (1e-5, 1e-6)}, outputs=("Y",),
)


def add_rms_norm(X, R, W, eps):
    """A decoder layer's residual add and the next norm, as HF writes them (LlamaRMSNorm)."""
    residual = X + R
    h = residual.to(torch.promote_types(residual.dtype, torch.float32))
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return W * h.to(residual.dtype), residual


FUSED_ADD_RMS_NORM = Op(
    "fused_add_rms_norm", reference=add_rms_norm,
    inputs={"X": Tensor("rows", "cols"), "R": Tensor("rows", "cols"), "W": Tensor("cols", values="weight")},
    dims={"rows": ROWS, "cols": WIDTH}, params={"eps": 1e-6}, outputs=("Y", "residual"),
    may_clobber=("X", "R"),  # fused kernels write the new residual into their inputs
)

CROSS_ENTROPY = Op(
    "cross_entropy",
    # HF's loss upcasts the logits to float32 (float64 stays float64)
    reference=lambda logits, target: F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)),
                                                     target, ignore_index=-100),
    inputs={"logits": Tensor("tokens", "vocab"),
            "target": Tensor("tokens", dtype=torch.int64, values=Integers(0, "vocab", {-100: 0.1}))},
    dims={"tokens": Dim(1, 4096, special=(1, 3, 64, 257)),
          "vocab": Dim(2, 131072, special=(2, 1000, 4097, 32000, 128256))},
    outputs=("loss",),
)

SOFTMAX = Op(
    "softmax", reference=lambda X: torch.softmax(X, dim=-1),
    inputs={"X": Tensor("rows", "cols")}, dims={"rows": ROWS, "cols": WIDTH}, outputs=("Y",),
)

# A KernelBench-style problem: the module's parameters become inputs, get_inputs() gives the shapes.
import kernelbench_gemm_gelu as problem  # noqa: E402
from oracle import from_module  # noqa: E402

GEMM_GELU = from_module("gemm_gelu", problem.Model, problem.get_inputs, problem.get_init_inputs)
