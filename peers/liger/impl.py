"""Liger-Kernel 0.8.5 behind the declarations of ``ops``: each op is Liger's own autograd Function
(``liger_kernel.ops.<module>.Liger...Function.apply``), called with the defaults its
``liger_kernel.transformers`` module or functional wrapper uses; where those defaults are not the
op declared (a reduction, a kernel size), the argument is the declaration's and the docstring of
the entry says so.

Liger's kernels compute in float32 and promise no float64: those checks are not asked
(``NO_FLOAT64``). Liger documents two in-place defaults, both kept: PolyNorm's and modulated
RMSNorm's backward write dX into the incoming gradient (``in_place=True``, their modules' default).

On a CPU (Triton's interpreter) one op cannot run, for a reason of Liger's own Python, not of its
kernel: DyT's backward sizes its partial sums by the GPU's multiprocessor count and has no branch
for any other device (``NUM_SMS`` is never bound), so it is declared lacking there, with that reason.
"""

from __future__ import annotations

from oracle.engine.devices import native_gpu
from oracle import ImplementationUnavailable, implementation

from . import ops

try:
    import liger_kernel  # noqa: F401
except ImportError as exc:  # the harness reports it as the implementation being unavailable
    raise ImplementationUnavailable(
        f"liger-kernel is not importable ({exc}): pip install --no-deps liger-kernel==0.8.5") from exc

from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction  # noqa: E402
from liger_kernel.ops.dyt import LigerDyTFunction  # noqa: E402
from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction  # noqa: E402
from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction  # noqa: E402
from liger_kernel.ops.fused_linear_jsd import LigerFusedLinearJSDFunction  # noqa: E402
from liger_kernel.ops.group_norm import LigerGroupNormFunction  # noqa: E402
from liger_kernel.ops.jsd import LigerJSDFunction  # noqa: E402
from liger_kernel.ops.kl_div import LigerKLDivLossFunction  # noqa: E402
from liger_kernel.ops.layer_norm import LigerLayerNormFunction  # noqa: E402
from liger_kernel.ops.llama4_rope import LigerLlama4RopeFunction  # noqa: E402
from liger_kernel.ops.modulated_rms_norm import LigerModulatedRMSNormFunction  # noqa: E402
from liger_kernel.ops.multi_token_attention import LigerMultiTokenAttentionFunction  # noqa: E402
from liger_kernel.ops.poly_norm import LigerPolyNormFunction  # noqa: E402
from liger_kernel.ops.qwen2vl_mrope import LigerQwen2VLMRopeFunction  # noqa: E402
from liger_kernel.ops.relu_squared import LigerReLUSquaredFunction  # noqa: E402
from liger_kernel.ops.softmax import LigerSoftmaxFunction  # noqa: E402
from liger_kernel.ops.sparsemax import LigerSparsemaxFunction  # noqa: E402
from liger_kernel.ops.tvd import LigerTVDLossFunction  # noqa: E402


def layer_norm(X, W, B, eps):
    return LigerLayerNormFunction.apply(X, W, B, eps)


def fused_add_rms_norm(X, R, W, eps):
    """LigerFusedAddRMSNorm's defaults: offset 0, casting_mode='llama', in_place=False."""
    return LigerFusedAddRMSNormFunction.apply(X, R, W, eps, 0.0, "llama", False)


def group_norm(X, W, B, eps):
    return LigerGroupNormFunction.apply(X, W, B, X.shape[1], X.shape[1] // ops.GROUP_SIZE, eps)


def poly_norm(X, W, B, eps):
    """LigerPolyNorm's default in_place=True (dX written into the incoming gradient)."""
    return LigerPolyNormFunction.apply(X, W, B, eps, True)


def modulated_rms_norm(X, W, scale, shift, eps):
    """liger_modulated_rms_norm's defaults: offset 0, casting_mode='llama', in_place=True."""
    return LigerModulatedRMSNormFunction.apply(X, W, scale, shift, eps, 0.0, "llama", True)


def dyt(x, alpha, gamma, beta):
    return LigerDyTFunction.apply(x, alpha, gamma, beta)


def softmax(X):
    return LigerSoftmaxFunction.apply(X)


def sparsemax(X):
    return LigerSparsemaxFunction.apply(X, -1)


def relu_squared(X):
    return LigerReLUSquaredFunction.apply(X)


def cross_entropy(logits, target):
    """LigerCrossEntropyLoss's defaults: no class weights, ignore_index -100, mean, no z-loss."""
    return LigerCrossEntropyFunction.apply(logits, target, None, -100)[0]


def fused_linear_cross_entropy(X, W, target):
    """liger_fused_linear_cross_entropy's defaults: no bias, ignore_index -100, mean, accum_dtype None."""
    return LigerFusedLinearCrossEntropyFunction.apply(X, W, target)[0]


def kl_div(input, target, reduction):
    """LigerKLDIVLoss's log_target=False and eps=1e-10; the reduction is the declaration's."""
    return LigerKLDivLossFunction.apply(input, target, reduction, False, 1e-10)


def jsd(input, target, labels, beta):
    return LigerJSDFunction.apply(input, target, labels, beta, -100)


def tvd(p, q, labels):
    """LigerTVDLoss's defaults: reduction='batchmean', ignore_index -100."""
    return LigerTVDLossFunction.apply(p, q, labels, "batchmean", -100)


def fused_linear_jsd(student_input, student_weight, teacher_input, teacher_weight, labels, beta, temperature):
    """liger_fused_linear_jsd, accum_dtype None; beta and temperature are the declaration's."""
    return LigerFusedLinearJSDFunction.apply(student_input, student_weight, teacher_input, teacher_weight, labels,
                                             beta, -100, temperature)


def qwen2vl_mrope(q, k, cos, sin):
    return LigerQwen2VLMRopeFunction.apply(q, k, cos, sin, ops.mrope_section(q.shape[-1]), 1)


def llama4_rope(q, k, freqs):
    """freqs_cis given as its real view, (seq, half, 2), which Liger's launcher takes as it is."""
    return LigerLlama4RopeFunction.apply(q, k, freqs)


def multi_token_attention(scores, weight, bias):
    """LigerMultiTokenAttention with the declaration's 3x3 kernel and padding 1; softmax (sparse=False)."""
    return LigerMultiTokenAttentionFunction.apply(scores, weight, bias, 1, ops.MTA_KERNEL // 2, 1, 1, False)


OPS = {name: globals()[name] for name in (
    "layer_norm", "fused_add_rms_norm", "group_norm", "poly_norm", "modulated_rms_norm", "dyt", "softmax",
    "sparsemax", "relu_squared", "cross_entropy", "fused_linear_cross_entropy", "kl_div", "jsd", "tvd",
    "fused_linear_jsd", "qwen2vl_mrope", "llama4_rope", "multi_token_attention")}

# Liger's own Python with no CPU branch: the op runs on a GPU only.
CPU_LACKING = {
    "dyt": "liger_kernel.ops.dyt.liger_dyt_bwd sizes its partial sums by the device's multiprocessor count "
           "and has branches for cuda, xpu and npu only: on a CPU NUM_SMS is never bound (UnboundLocalError)",
}

_lacking = {} if native_gpu() else CPU_LACKING

impl = implementation(
    **{name: fn for name, fn in OPS.items() if name not in _lacking},
    LACKING={**_lacking},
    NO_FLOAT64=set(OPS),
)

# The two ops whose default writes dX into the incoming gradient, called with in_place=False, so that
# their numerics are judged apart from that documented write (every other op as in ``impl``).
not_in_place = implementation(
    **{name: fn for name, fn in OPS.items() if name not in _lacking} | {
        "poly_norm": lambda X, W, B, eps: LigerPolyNormFunction.apply(X, W, B, eps, False),
        "modulated_rms_norm": lambda X, W, scale, shift, eps: LigerModulatedRMSNormFunction.apply(
            X, W, scale, shift, eps, 0.0, "llama", False)},
    LACKING={**_lacking},
    NO_FLOAT64=set(OPS),
)
