"""Row addressing for tensors of shape (..., n_cols) in any layout.

Row kernels take each tensor's strides instead of demanding contiguous memory, so transposed,
sliced and stride-0 (expanded) tensors are read in place without a copy. Leading dimensions are
merged where every tensor allows it; the kernels address up to three leading dimensions
(row -> i0, i1, i2), which covers a row-major batch, a transposed pair and a sliced third.

The groups fill (L0, L1, L2) from the front and the sizes left over are 1: Triton compiles an
integer argument equal to 1 as a constant, so the kernels' divisions by L1 and L2 (64-bit, on
every row's path) fold away for the groups that are not there. Contiguous tensors, one group,
address a row as ``row * s0`` with no division at all (RMSNorm's narrow backward lost about a third
of its row loop's instructions: docs/performance.md).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

MAX_LEADING = 3


@dataclass(frozen=True)
class RowLayout:
    lead: tuple[int, int, int]  # (L0, L1, L2): row index r = (i0 * L1 + i1) * L2 + i2
    strides: tuple[tuple[int, int, int, int], ...]  # per tensor: (s0, s1, s2, column stride)

    @property
    def n_rows(self) -> int:
        return self.lead[0] * self.lead[1] * self.lead[2]


def _merge_leading(shape: tuple[int, ...], strides: list[tuple[int, ...]]) -> list[tuple[int, list[int]]]:
    """Groups of leading dims as (size, stride per tensor), merging neighbours that are contiguous for all."""
    groups: list[tuple[int, list[int]]] = []
    for dim, size in enumerate(shape):
        if size == 1:
            continue  # a size-1 dim never moves the address
        dim_strides = [s[dim] for s in strides]
        if groups:
            prev_size, prev_strides = groups[-1]
            if all(ps == st * size for ps, st in zip(prev_strides, dim_strides)):
                groups[-1] = (prev_size * size, dim_strides)
                continue
        groups.append((size, dim_strides))
    return groups


def row_layout(*tensors: torch.Tensor) -> RowLayout | None:
    """Layout of same-shaped tensors viewed as rows, or None if more than three leading groups remain."""
    shape = tuple(tensors[0].shape[:-1])
    strides = [tuple(t.stride()) for t in tensors]
    groups = _merge_leading(shape, [s[:-1] for s in strides])
    if len(groups) > MAX_LEADING:
        return None
    groups = groups + [(1, [0] * len(tensors))] * (MAX_LEADING - len(groups))  # absent groups last: L = 1
    lead = tuple(size for size, _ in groups)
    per_tensor = tuple(
        (groups[0][1][i], groups[1][1][i], groups[2][1][i], strides[i][-1]) for i in range(len(tensors))
    )
    return RowLayout(lead=lead, strides=per_tensor)


def rows_addressable(*tensors: torch.Tensor) -> tuple[RowLayout, tuple[torch.Tensor, ...]]:
    """A RowLayout for the tensors, copying them to contiguous memory only when no layout exists."""
    if all(t.is_contiguous() for t in tensors):  # the common case, on every call's path: no merging to do
        return _contiguous_layout(tensors[0].shape, len(tensors)), tensors
    layout = row_layout(*tensors)
    if layout is None:  # rare: four or more independent leading strides
        tensors = tuple(t.contiguous() for t in tensors)
        layout = row_layout(*tensors)
    return layout, tensors


@functools.lru_cache(maxsize=1024)
def _contiguous_layout(shape: torch.Size, n_tensors: int) -> RowLayout:
    n_cols = shape[-1] if shape else 1
    n_rows = math.prod(shape[:-1])
    return RowLayout(lead=(n_rows, 1, 1), strides=((n_cols, 0, 0, 1),) * n_tensors)
