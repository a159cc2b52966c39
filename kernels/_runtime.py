"""Where the kernels run: the GPU when there is one, otherwise Triton's CPU interpreter.

Importing this module picks the backend. It must happen before any ``@triton.jit`` decorator runs,
because Triton reads ``TRITON_INTERPRET`` when a kernel is decorated; ``kernels/__init__.py``
imports it first.

Note [bf16 under the interpreter]
    Triton's interpreter keeps bf16 values as raw uint16 bits. Its fp32 -> bf16 cast truncates
    instead of rounding to nearest even (about half of all values land one ULP off what a GPU
    stores), and casts between bf16 and fp64/fp16 reinterpret numbers as integers. Upstream
    declined to change this (triton issues 4972, 11584, 11604). Our kernels never do arithmetic on
    bf16 values (they upcast on load), so correcting the casts is enough to make CPU results equal
    the GPU's. ``ensure_faithful_bf16`` probes the interpreter once, installs the correction when the
    probe shows truncation, and probes again to prove the correction took.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys

import torch


def _choose_backend() -> None:
    # An explicit TRITON_INTERPRET (either value) is the user's choice; respect it.
    if "TRITON_INTERPRET" in os.environ or torch.cuda.is_available():
        return
    os.environ["TRITON_INTERPRET"] = "1"
    # If triton was imported before us (torch._dynamo imports it, and transformers imports that),
    # its own @jit helpers (tl.sum, ...) were built for a GPU and refuse to run in the interpreter.
    # Drop its Python modules so that the import below builds them again for the interpreter; the
    # compiled extension (triton._C) stays loaded.
    for name in [n for n in sys.modules if (n == "triton" or n.startswith("triton.")) and not n.startswith("triton._C")]:
        del sys.modules[name]


_choose_backend()

import numpy as np
import triton
import triton.language as tl


@functools.cache  # fixed once the kernels are decorated (above), and asked on every call's path
def interpreted() -> bool:
    """True when kernels run under Triton's CPU interpreter."""
    return bool(triton.knobs.runtime.interpret)


def kernel_device() -> torch.device:
    """The device tensors should live on for the kernels to run natively."""
    if interpreted() or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


# --- bf16 cast correction (see Note [bf16 under the interpreter]) -------------------------------

_TORCH_FLOATS = {tl.float16: torch.float16, tl.float32: torch.float32, tl.float64: torch.float64}


def _rounding_cast_impl(original):
    """Wrap the interpreter's cast so that casts touching bf16 use torch's conversions (RNE)."""
    from triton.runtime.interpreter import TensorHandle

    def cast_impl(self, src, dst_type):
        src_ty, dst_ty = src.dtype.scalar, dst_type.scalar
        if dst_ty == tl.bfloat16 and src_ty in _TORCH_FLOATS:
            values = torch.from_numpy(np.array(src.data, copy=True))
            bits = values.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            return TensorHandle(bits, dst_ty)
        if src_ty == tl.bfloat16 and dst_ty in _TORCH_FLOATS:
            bits = torch.from_numpy(np.array(src.data, copy=True).view(np.int16))
            values = bits.view(torch.bfloat16).to(_TORCH_FLOATS[dst_ty]).numpy()
            return TensorHandle(values, dst_ty)
        return original(self, src, dst_type)

    cast_impl._oracle_original = original
    return cast_impl


def _interpreter_builder_class():
    from triton.runtime.interpreter import InterpreterBuilder

    return InterpreterBuilder


def _install_cast_correction() -> None:
    builder = _interpreter_builder_class()
    if not hasattr(builder.cast_impl, "_oracle_original"):
        builder.cast_impl = _rounding_cast_impl(builder.cast_impl)


@contextlib.contextmanager
def uncorrected_bf16_casts():
    """Run with the interpreter's own bf16 casts (for tests proving the correction matters)."""
    builder = _interpreter_builder_class()
    corrected = builder.cast_impl
    builder.cast_impl = getattr(corrected, "_oracle_original", corrected)
    try:
        yield
    finally:
        builder.cast_impl = corrected


@triton.jit
def _cast_probe_kernel(
    Y_ptr,  # bf16 out: fp32 input rounded to bf16
    Z_ptr,  # fp64 out: that bf16 value widened to fp64
    X_ptr,  # fp32 in
    n,
    BLOCK: tl.constexpr,
):
    i = tl.arange(0, BLOCK)
    mask = i < n
    y = tl.load(X_ptr + i, mask=mask, other=0.0).to(tl.bfloat16)
    tl.store(Y_ptr + i, y, mask=mask)
    tl.store(Z_ptr + i, y.to(tl.float64), mask=mask)


def _probe_values() -> torch.Tensor:
    """fp32 values whose bf16 rounding differs from truncation, plus ties, signs and specials."""
    gen = torch.Generator().manual_seed(0)
    random = torch.randn(1000, generator=gen) * torch.logspace(-30, 30, 1000)
    crafted = torch.tensor([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, -(1.0 + 3 * 2.0**-8), 1.0 + 2.0**-7 + 2.0**-9,
                            0.0, -0.0, float("inf"), float("-inf"), 3.4e38, 1e-40])
    return torch.cat([random, crafted]).float()


def probe_bf16_casts() -> dict[str, float]:
    """Fraction of probe values the kernel rounds differently from torch (fp32->bf16, bf16->fp64)."""
    x = _probe_values()
    y = torch.empty(x.numel(), dtype=torch.bfloat16)
    z = torch.empty(x.numel(), dtype=torch.float64)
    _cast_probe_kernel[(1,)](y, z, x, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    want = x.to(torch.bfloat16)
    return {
        "fp32_to_bf16": (y.view(torch.int16) != want.view(torch.int16)).float().mean().item(),
        "bf16_to_fp64": (z != want.double()).float().mean().item(),
    }


@functools.cache
def ensure_faithful_bf16() -> str:
    """Make bf16 casts round like the GPU; returns how: 'native', 'faithful' or 'corrected'.

    Called before every launch (cached after the first). Raises if the interpreter still
    disagrees with round-to-nearest-even after the correction, since bf16 results would be wrong.
    """
    if not interpreted():
        return "native"
    if not any(probe_bf16_casts().values()):
        return "faithful"
    _install_cast_correction()
    remaining = probe_bf16_casts()
    if any(remaining.values()):
        raise RuntimeError(f"Triton {triton.__version__}'s interpreter still mis-rounds bf16 after correction: {remaining}")
    return "corrected"


_NATIVE_LAUNCH = contextlib.nullcontext()


def launching() -> contextlib.AbstractContextManager:
    """Wrap every kernel launch: bf16 casts made faithful first, and under the interpreter numpy's
    warnings on IEEE overflow silenced (exp(1000) = inf and 70000 cast to fp16 = inf are what the
    GPU computes too, silently, and what HF computes). On a GPU a shared no-op: it is on every call's path."""
    ensure_faithful_bf16()
    if not interpreted():
        return _NATIVE_LAUNCH
    return np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore")


def runtime_summary() -> dict[str, str]:
    """What the kernels run on, for reports and failure messages."""
    return {
        "backend": "triton-interpreter" if interpreted() else "cuda",
        "device": torch.cuda.get_device_name() if not interpreted() and torch.cuda.is_available() else "cpu",
        "triton": triton.__version__,
        "torch": torch.__version__,
        "bf16_casts": ensure_faithful_bf16(),
    }
