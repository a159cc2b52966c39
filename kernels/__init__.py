"""Hand-written Triton kernels for RMSNorm, RoPE, SwiGLU and GeGLU.

This package is an implementation under test in the sense of docs/design.md §2: the harness finds the
ops below by name, the arguments each may overwrite in ``CLOBBERS``, and in ``COMPILES`` that every
op goes into a torch.compile graph whole (each is a ``kernel_oracle`` custom op, see _library). On
a machine without a GPU the kernels run through Triton's interpreter, with its bf16 casts corrected
(see _runtime).
"""

from . import _runtime  # noqa: F401  (picks GPU or interpreter before any kernel is decorated)
from .geglu import (
    geglu, geglu_approx_backward_kernel, geglu_approx_forward_kernel, geglu_exact_backward_kernel,
    geglu_exact_forward_kernel,
)
from .rms_norm import rms_norm
from .rope import rope
from .swiglu import swiglu, swiglu_DWf_DW_dfg_kernel, swiglu_fg_kernel

# Arguments each op may overwrite, by parameter name. Everything else must be bit-for-bit intact.
CLOBBERS: dict[str, set[str]] = {
    "geglu": set(),
    "geglu_approx_forward_kernel": set(),
    "geglu_exact_forward_kernel": set(),
    "geglu_approx_backward_kernel": {"DW", "e", "g"},  # receive h, df and de
    "geglu_exact_backward_kernel": {"DW", "e", "g"},
    "rms_norm": set(),
    "rope": {"Q", "K"},  # rotated in place (autograd is told through mark_dirty)
    "swiglu": set(),
    "swiglu_fg_kernel": set(),
    "swiglu_DWf_DW_dfg_kernel": {"DW", "e", "g"},  # receive h, df and de
}

# Every op compiles into one node of a torch.compile graph (fullgraph=True works): a graph break in
# any of them is a failure of the harness's compile check, not a note.
COMPILES = True

# exp as exact as CUDA's library (libdevice's expf, not Triton's tl.exp): the verdict judges the
# kernels without the room it grants fast exp by default (oracle/noise/rounding.py, Note [Fast maths]).
EXACT_MATHS = True

# HF's cast order, bit for bit, where every rounding step can be HF's: RoPE multiplies and adds in the
# input dtype as HF's eager code does (products rounded, then their sum), with no reduction whose order
# could differ. Each case compares these tensors' bits (oracle/checks/exact.py, Note [Exact bits]).
# The forward outputs of RMSNorm, SwiGLU and GeGLU round where HF rounds, from float32 statistics and
# exponentials that may differ from torch's by a few ULPs: they keep HF's rounding steps given float32
# values within K ULPs (Note [Two contracts]). Their gradients are not promised: the backward's
# closed forms (RMSNorm's dX, the activations' slopes) are not HF's autograd chain.
_ROUNDING_H = {"h": "rounding"}
EXACT = {
    "rope": True,
    "rms_norm": {"Y": "rounding"},
    "swiglu": _ROUNDING_H,
    "swiglu_fg_kernel": _ROUNDING_H,
    "swiglu_DWf_DW_dfg_kernel": _ROUNDING_H,  # the raw backward's h: the forward's product, recomputed
    "geglu": _ROUNDING_H,
    "geglu_approx_forward_kernel": _ROUNDING_H,
    "geglu_exact_forward_kernel": _ROUNDING_H,
    "geglu_approx_backward_kernel": _ROUNDING_H,
    "geglu_exact_backward_kernel": _ROUNDING_H,
}

__all__ = [
    "CLOBBERS", "COMPILES", "EXACT", "EXACT_MATHS", "geglu", "geglu_approx_backward_kernel", "geglu_approx_forward_kernel", "geglu_exact_backward_kernel",
    "geglu_exact_forward_kernel", "rms_norm", "rope", "swiglu", "swiglu_DWf_DW_dfg_kernel", "swiglu_fg_kernel",
]
