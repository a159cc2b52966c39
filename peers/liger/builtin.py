"""Liger-Kernel's counterparts of the built-in ops (``--impl liger``): its autograd Functions behind
the contract's signatures, with the defaults its ``liger_kernel.transformers`` modules use. It
declares no CLOBBERS, as Liger documents none; every other op is lacking (Liger has no counterpart).

    pip install --no-deps liger-kernel==0.8.5
    pytest -n auto --impl liger --ops rms_norm,rope,swiglu
"""

from __future__ import annotations

from oracle import ImplementationUnavailable, implementation
from oracle.ops.rope import table_rows

try:
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    from liger_kernel.ops.rope import LigerRopeFunction
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction
except ImportError as exc:  # the harness reports it as the implementation being unavailable
    raise ImplementationUnavailable(
        f"liger-kernel is not importable ({exc}); install it with pip install 'kernel-oracle[liger]'") from exc


def rms_norm(X, W, eps, gemma=False):
    """Llama casting with in_place=True (dX written into dY, Liger's default), Gemma with offset 1."""
    if gemma:
        return LigerRMSNormFunction.apply(X, W, eps, 1.0, "gemma", True)
    return LigerRMSNormFunction.apply(X, W, eps, 0.0, "llama", True)


def rope(Q, K, cos, sin, position_ids=None):
    """Liger takes each token's table rows, as HF's rotary embedding returns them."""
    return LigerRopeFunction.apply(Q, K, *table_rows(Q, cos, sin, position_ids))


def swiglu(e, g):
    return LigerSiLUMulFunction.apply(e, g)


# The benchmark times each peer as HF's model calls it: RoPE's rows gathered once per step, outside.
BENCH_PEERS = {"rms_norm": rms_norm, "rope": LigerRopeFunction.apply, "swiglu": swiglu}

impl = implementation(rms_norm=rms_norm, rope=rope, swiglu=swiglu)


def adapter():
    """What ``--impl liger`` loads (oracle/declare/implementations.py, ``ADAPTERS``)."""
    return impl
