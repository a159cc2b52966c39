"""Exactness as a contract: compared tensors that must equal HF's bits, not merely lie within HF's
noise (an op's ``exact``, an implementation's ``EXACT``).

Note [Exact bits]
    The verdict (oracle/verdict) accepts any result as precise as HF's: a kernel that rounds a
    product and a sum once where HF rounds each is as accurate, and passes it. A kernel that promises
    HF's cast order ("an exact copy of HF", kernels/) promises more: the same bits, which a user who
    swaps the kernel into a trained model relies on. Where an implementation declares that promise
    for a tensor, each case compares bits (+0 and -0 alike, any NaN alike any NaN) and fails with the
    count of differing elements and the first of them. It is a promise an implementation makes where
    every rounding step is HF's given the same inputs: RoPE's products and sums (no reduction), not
    a norm whose float32 statistics another summation order moves (docs/design.md §3).
"""

from __future__ import annotations

import torch

from oracle.verdict import bit_identical


def first_difference(got: torch.Tensor, hf: torch.Tensor) -> tuple[int, list[int], float, float] | None:
    """(how many elements differ, the first one's index, HF's value there, the implementation's), or
    None where every element has HF's bits. Both of one shape: a wrong shape is the verdict's failure."""
    differ = ~bit_identical(got, hf.to(got.device))
    count = int(differ.sum())
    if not count:
        return None
    index = [int(i) for i in differ.nonzero()[0]]
    return count, index, float(hf[tuple(index)]), float(got[tuple(index)])


def explained(count: int, total: int, declared_by: str) -> str:
    """The failure's message: how many elements broke the contract, and whose contract it is."""
    return f"{count} of {total} element(s) differ from HF's bits, which {declared_by} promises (HF's cast order)"
