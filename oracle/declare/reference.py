"""What every op module's copy of Hugging Face's maths shares: the registry of mirrors, and the truth.

Each op module (oracle/ops/) writes HF's maths once, exactly as transformers evaluates it. Every
such function takes ``compute``: the dtype HF upcasts to (float32). The truth is the same function
evaluated on float64 copies of the same inputs with ``compute=torch.float64`` (``truth(...)``), as
FlashAttention's ``upcast`` switch does. Each mirror records the transformers source it copies;
tests/test_reference.py proves it bit-identical against the installed transformers, whose version
is in each test id (no version is stamped here that the run did not test).

Alongside each mirror is a *reordered* form: the same maths in the same dtype, evaluated in a
different but equally valid order. The verdict (compare.py) uses the spread between the two as the
rounding noise an implementation is entitled to, which is what makes it fair where results are
small differences of large terms.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# What op modules use to mirror HF's maths and to evaluate the truth; the rest is internal.
__all__ = ["MIRRORS", "Mirror", "mirrors", "truth", "upcast"]


@dataclass(frozen=True)
class Mirror:
    source: str  # the transformers object whose maths the function copies
    function: Callable


MIRRORS: dict[str, Mirror] = {}  # function name -> what it mirrors (filled as op modules import)


def mirrors(source: str) -> Callable:
    def register(fn: Callable) -> Callable:
        MIRRORS[fn.__name__] = Mirror(source=source, function=fn)
        return fn

    return register


# --- The truth ----------------------------------------------------------------------------------


def upcast(value):
    """A float64 copy of a floating tensor (keeping requires_grad as a fresh leaf); anything else unchanged."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().to(torch.float64).requires_grad_(value.requires_grad)
    return value


def truth(fn: Callable, *args, **kwargs):
    """``fn`` on float64 copies of its tensor arguments, computing in float64."""
    return fn(*(upcast(a) for a in args), **{k: upcast(v) for k, v in kwargs.items()}, compute=torch.float64)
