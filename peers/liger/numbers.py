"""Liger-Kernel 0.8.5's RMSNorm, RoPE and SwiGLU (``--impl liger``) with their in-place writes kept
out of the caller's way, so that a long hypothesis run judges Liger's numbers at every example.

``--impl liger`` fails the first example of these three on aliasing (docs/findings.md: the incoming
gradient overwritten, inputs rotated or overwritten in place), and hypothesis stops a test at its
first failure, so a thorough run says nothing of Liger's numbers beyond one case per test. Here:

- RMSNorm: Liger's own ``in_place=False`` (its default, True, writes dX into dY);
- RoPE: Q and K are rotated in place, declared in CLOBBERS; its backward rotates the incoming
  gradients in place, so each output passes through an identity whose backward hands Liger a copy;
- SwiGLU: its backward overwrites e and g with their gradients, which the contract does not allow
  (swiglu may overwrite nothing): it is handed copies of them.

The kernels and their arithmetic are Liger's; a copy of a gradient changes no number.

    pytest tests/test_ops.py -k matches_hf --impl peers.liger.numbers:impl
"""

from __future__ import annotations

import torch

from oracle import ImplementationUnavailable, implementation
from oracle.ops.rope import table_rows

try:
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    from liger_kernel.ops.rope import LigerRopeFunction
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction
except ImportError as exc:  # the harness reports it as the implementation being unavailable
    raise ImplementationUnavailable(
        f"liger-kernel is not importable ({exc}): pip install --no-deps liger-kernel==0.8.5") from exc


class _GradientCopied(torch.autograd.Function):
    """The identity; its backward passes on a copy of the incoming gradient, which the op before it
    may then overwrite."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.clone()


def rms_norm(X, W, eps, gemma=False):
    offset, casting = (1.0, "gemma") if gemma else (0.0, "llama")
    return LigerRMSNormFunction.apply(X, W, eps, offset, casting, False)


def rope(Q, K, cos, sin, position_ids=None):
    Q_out, K_out = LigerRopeFunction.apply(Q, K, *table_rows(Q, cos, sin, position_ids))
    return _GradientCopied.apply(Q_out), _GradientCopied.apply(K_out)


def swiglu(e, g):
    return LigerSiLUMulFunction.apply(e.clone(), g.clone())


impl = implementation(rms_norm=rms_norm, rope=rope, swiglu=swiglu, CLOBBERS={"rope": {"Q", "K"}})
