"""Implementations of the declared ops: torch.compile of each reference (must pass), and planted
bugs (each must fail)."""

import torch
import torch._functorch.config
import torch.nn.functional as F

import declared_ops as ops
from oracle import implementation

# A compiled graph donates its saved buffers to backward unless told not to; gradcheck and the
# retain-graph check run backward more than once.
torch._functorch.config.donated_buffer = False
DECLARED = (ops.LAYER_NORM, ops.FUSED_ADD_RMS_NORM, ops.CROSS_ENTROPY, ops.SOFTMAX, ops.GEMM_GELU)
compiled = implementation(**{op.name: torch.compile(op.reference, dynamic=True) for op in DECLARED})


def layer_norm_unbiased_variance(X, W, B, eps):
    x = X.float()
    mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=True)
    return ((x - mean) * torch.rsqrt(var + eps) * W.float() + B.float()).to(X.dtype)


def rms_norm_of_x_alone(X, R, W, eps):
    """Normalises X instead of X + R (the residual is still returned right)."""
    return ops.add_rms_norm(X, torch.zeros_like(R), W, eps)[0], X + R


def cross_entropy_counting_ignored_tokens(logits, target):
    """The mean over every token, the ignored ones counted as zero loss."""
    losses = F.cross_entropy(logits.float(), target, ignore_index=-100, reduction="none")
    return losses.mean()


def softmax_in_bfloat16(X):
    return torch.softmax(X.to(torch.bfloat16), dim=-1).to(X.dtype) if X.dtype == torch.float32 else \
        torch.softmax(X.float(), -1).to(torch.bfloat16).to(torch.float16).to(X.dtype)


bugs = implementation(layer_norm=layer_norm_unbiased_variance, fused_add_rms_norm=rms_norm_of_x_alone,
                      cross_entropy=cross_entropy_counting_ignored_tokens, softmax=softmax_in_bfloat16)
