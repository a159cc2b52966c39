"""Exactness as a contract: compared tensors that must equal HF's bits, or keep HF's rounding steps,
not merely lie within HF's noise (an op's ``exact``, an implementation's ``EXACT``).

Note [Exact bits]
    The verdict (oracle/verdict) accepts any result as precise as HF's: a kernel that rounds a
    product and a sum once where HF rounds each is as accurate, and passes it. A kernel that promises
    HF's cast order ("an exact copy of HF", kernels/) promises more: the same bits, which a user who
    swaps the kernel into a trained model relies on. Where an implementation declares that promise
    for a tensor, each case compares bits (+0 and -0 alike, any NaN alike any NaN) and fails with the
    count of differing elements and the first of them. It is a promise an implementation makes where
    every rounding step is HF's given the same inputs: RoPE's products and sums (no reduction), not
    a norm whose float32 statistics another summation order moves (docs/design.md §3).

Note [Two contracts]
    A tensor is promised ``"bits"`` (the note above) or ``"rounding"``: HF's rounding steps, given
    float32 values within K ULPs (oracle/checks/rounding.py, Note [HF's rounding steps, given float32
    values within K ULPs]). The second is what a norm or an activation can keep: its float32 values
    legitimately differ from torch's by a few ULPs, so an element may differ from HF's bits where
    that value lies within K ULPs of a 16-bit rounding boundary, and nowhere else. An element keeps
    it where its value lies between the lowest and the highest of HF's three evaluations (HF's, and
    HF's nudged down and up); a tensor wider than 16 bits is itself such a float32 value, and may lie
    K ULPs beyond them. A case none of whose tensors is 16-bit rounds to no 16-bit dtype: the
    contract promises nothing there, and the verdict alone judges its float32 values.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch

from oracle.checks import rounding
from oracle.checks.rounding import SIXTEEN_BIT, nudged
from oracle.verdict import bit_identical

BITS, ROUNDING = "bits", "rounding"
CONTRACTS = (BITS, ROUNDING)


@dataclass(frozen=True)
class Promise:
    """Who promised a tensor (an op, an implementation's EXACT), and which contract (Note [Two contracts])."""

    by: str
    contract: str = BITS


def promised(declared, compared: Collection[str]) -> dict[str, str]:
    """An op's ``exact`` or one entry of an implementation's EXACT as tensor -> contract: True (every
    compared tensor, bit for bit), a collection of names (bit for bit), or a dict of name -> contract.
    The form is checked beforehand (``form_problem``)."""
    if declared is True:
        return {name: BITS for name in compared}
    if isinstance(declared, dict):
        return dict(declared)
    return {name: BITS for name in declared}


def form_problem(declared, allow_all: bool) -> str | None:
    """Why ``declared`` is none of ``promised``'s forms (True only where ``allow_all``), or None."""
    if declared is True and allow_all:
        return None
    if isinstance(declared, str):
        return f"a string is not split into names: write ({declared!r},) or {{{declared!r}: {ROUNDING!r}}}"
    if isinstance(declared, dict):
        for name, contract in declared.items():
            if not isinstance(name, str):
                return f"{name!r} is not a name"
            if contract not in CONTRACTS:
                return f"{name!r}: {contract!r} is no contract; a tensor is promised {BITS!r} or {ROUNDING!r}"
        return None
    if not isinstance(declared, (set, frozenset, tuple, list)):
        return f"{type(declared).__name__} {declared!r} is neither a collection of names nor a dict of name -> contract"
    stray = [v for v in declared if not isinstance(v, str)]
    return f"{stray[0]!r} is not a name" if stray else None


def stronger(a: str, b: str) -> str:
    """Of two contracts promised for one tensor, the one that binds: bits."""
    return BITS if BITS in (a, b) else ROUNDING


def first_difference(got: torch.Tensor, hf: torch.Tensor) -> tuple[int, list[int], float, float] | None:
    """(how many elements differ, the first one's index, HF's value there, the implementation's), or
    None where every element has HF's bits. Both of one shape: a wrong shape is the verdict's failure."""
    differ = ~bit_identical(got, hf.to(got.device))
    return _first(differ, got, hf)


def _first(broken: torch.Tensor, got: torch.Tensor, hf: torch.Tensor):
    count = int(broken.sum())
    if not count:
        return None
    index = [int(i) for i in broken.nonzero()[0]]
    return count, index, float(hf[tuple(index)]), float(got[tuple(index)])


def explained(count: int, total: int, declared_by: str) -> str:
    """The failure's message: how many elements broke the contract, and whose contract it is."""
    return f"{count} of {total} element(s) differ from HF's bits, which {declared_by} promises (HF's cast order)"


def outside_rounding(got: torch.Tensor, hf: torch.Tensor, down: torch.Tensor, up: torch.Tensor, truth: torch.Tensor,
                     steps: int | None = None) -> tuple[int, list[int], float, float, float, float] | None:
    """Like ``first_difference`` for the rounding contract (Note [Two contracts]): the elements that
    lie outside HF's three evaluations (``hf``, ``down``, ``up``), and the range they give at the
    first of them; None where every element keeps the contract. Non-finite values are placed as
    the verdict places them: where HF's is NaN and the float64 ``truth`` an infinity (torch's
    vectorised GeLU of +inf on a CPU is NaN), that infinity keeps it too."""
    steps = rounding.ROUNDING_ULPS if steps is None else steps
    hf, down, up, truth = (t.to(got.device) for t in (hf, down, up, truth))
    low, high = torch.minimum(torch.minimum(hf, down), up), torch.maximum(torch.maximum(hf, down), up)
    if got.dtype not in SIXTEEN_BIT:  # a float32 value itself: K of its ULPs either way
        low, high = nudged(low, -steps), nudged(high, steps)
    kept = bit_identical(got, hf) | bit_identical(got, down) | bit_identical(got, up) | ((got >= low) & (got <= high))
    kept |= hf.isnan() & truth.isinf() & (got.double() == truth)
    first = _first(~kept, got, hf)
    if first is None:
        return None
    index = tuple(first[1])
    return (*first, float(low[index]), float(high[index]))


def explained_rounding(count: int, total: int, declared_by: str, low: float, high: float) -> str:
    """The rounding contract's failure message, naming it and the range HF's evaluations give at the first."""
    steps = rounding.ROUNDING_ULPS
    return (f"{count} of {total} element(s) lie outside HF's rounding steps, given float32 values within {steps} "
            f"ULPs (HF's evaluations nudged down and up give {low!r} to {high!r} at the first), which "
            f"{declared_by} promises (HF's cast order)")
