"""Where the kernels run: the GPU when there is one, otherwise Triton's CPU interpreter.

Importing this module picks the backend. It must happen before any ``@triton.jit`` decorator runs,
because Triton reads ``TRITON_INTERPRET`` when a kernel is decorated; ``kernels/__init__.py``
imports it first. The choice and the interpreter's bf16 cast correction are the harness's
(oracle/interpreter.py, Notes [Triton on the CPU] and [bf16 under the interpreter]), which it
applies to any implementation it loads; the kernels use the same, so that ``import kernels`` on a
CPU gives the GPU's bf16 bits outside the harness too.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from oracle import interpreter
from oracle.interpreter import ensure_faithful_bf16, probe_bf16_casts, uncorrected_bf16_casts  # noqa: F401 (API)

interpreter.choose_backend()

import numpy as np  # noqa: E402
import triton  # noqa: E402


# Fixed once triton is imported (above), and asked on every call's path.
interpreted = functools.cache(interpreter.interpreted)


def kernel_device() -> torch.device:
    """The device tensors should live on for the kernels to run natively."""
    if interpreted() or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


_NATIVE_LAUNCH = contextlib.nullcontext()


def launching() -> contextlib.AbstractContextManager:
    """Wrap every kernel launch: bf16 casts made faithful first, and under the interpreter numpy's
    warnings on IEEE overflow silenced (exp(1000) = inf and 70000 cast to fp16 = inf are what the
    GPU computes too, silently, and what HF computes). On a GPU a shared no-op: it is on every call's path."""
    if not interpreted():  # nothing to correct on a GPU (ensure_faithful_bf16 answers "native")
        return _NATIVE_LAUNCH
    ensure_faithful_bf16()
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
