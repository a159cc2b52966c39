"""Where the kernels run: the GPU when there is one, otherwise Triton's CPU interpreter.

Importing this module picks the backend. It must happen before any ``@triton.jit`` decorator runs,
because Triton reads ``TRITON_INTERPRET`` when a kernel is decorated; ``kernels/__init__.py``
imports it first. This package depends on no harness: under one (``--impl kernels``) the harness
has already chosen the interpreter and made its casts and 16-bit arithmetic compute as a GPU does,
as it does for any library's kernels, before this module is imported. Imported alone on a CPU, the
kernels run in Triton's interpreter as it is (whose bf16 casts truncate: docs/design.md §5).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    # Triton's own @jit helpers (tl.sum, ...) built before the choice would refuse to run in the
    # interpreter: drop its Python modules so the next import builds them again (its C extension stays).
    for _name in [n for n in sys.modules if n.split(".")[0] == "triton" and not n.startswith("triton._C")]:
        del sys.modules[_name]

import numpy as np  # noqa: E402
import triton  # noqa: E402


@functools.cache
def interpreted() -> bool:
    """Whether the kernels run in Triton's interpreter: fixed once triton is imported (above), and
    asked on every call's path."""
    return bool(triton.knobs.runtime.interpret)


_NATIVE_LAUNCH = contextlib.nullcontext()


def launching() -> contextlib.AbstractContextManager:
    """Wrap every kernel launch: under the interpreter numpy's warnings on IEEE overflow silenced
    (exp(1000) = inf and 70000 cast to fp16 = inf are what the GPU computes too, silently, and what HF
    computes). On a GPU a shared no-op: it is on every call's path."""
    if not interpreted():
        return _NATIVE_LAUNCH
    return np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore")
