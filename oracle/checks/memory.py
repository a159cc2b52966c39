"""Tensors inside guarded buffers, allocation poisoning, and bitwise snapshots (docs/design.md §4).

Every tensor the engine hands an implementation lives inside a larger buffer whose other bytes
hold a sentinel. Writes outside the tensor's own elements (margins, and the gaps between rows of
a strided view) show up as changed sentinel bytes. Under the CPU interpreter there is no bounds
checking at all, so this is the only way such a write is seen; unguarded, it corrupts the host heap.
So the margins are as wide as the overruns kernels really make (a whole block, a head group, a
row): each margin spans as many elements as the tensor itself, at least MARGIN_BYTES and at most
MARGIN_CAP_BYTES (cheap at interpreter sizes; on a GPU the cap bounds the memory of large cases,
where the hardware reports wilder accesses as illegal addresses).

Allocations the implementation makes itself (``torch.empty`` and friends, called from Python) are
re-homed into guarded buffers too, with their elements poisoned with NaN, so an output element the
kernel never writes reads as NaN instead of yesterday's memory (``rehomed_allocations``).

Note [NaN margins]
    A floating-point buffer's margins (and a strided view's gaps) hold a quiet NaN, so that a read
    outside the tensor is seen too: whatever it feeds becomes NaN, and the verdict fails it. A
    finite sentinel hid such reads: one element read past a row into a sum of 65535 terms (a column
    mask off by one), or a row's statistic read past its end and multiplied by a masked lane's 0,
    changes nothing a verdict can see (mutation testing found both). Writes stay visible because
    the margins are compared bit for bit: each buffer's NaN has its own payload, and never the
    payload 0 of the NaN that arithmetic and torch produce, so a NaN written there, or a margin's
    value carried into another buffer's margin, changes bits. The payloads are chosen so that a
    conversion between float widths cannot turn one buffer's into another's: a float16 or bfloat16
    payload widened to float32 has its low 13 bits 0, which no float32 margin has (likewise float32
    widened to float64, low 29 bits), and a narrowing keeps only a payload's top bits, 0 in every
    margin. Other dtypes (integers, bool, 8-bit and complex floats) keep a byte sentinel.
"""

from __future__ import annotations

import contextlib
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

SENTINEL_BYTE = 0xA5  # every margin byte of a buffer whose dtype has no NaN margin (Note [NaN margins])
# dtype -> (the quiet NaN with payload 0, as an integer of its width; how many low payload bits vary)
_NAN_MARGINS = {torch.float16: (0x7E00, 9), torch.bfloat16: (0x7FC0, 6), torch.float32: (0x7FC00000, 13),
                torch.float64: (0x7FF8000000000000, 29)}
MARGIN_BYTES = 256  # the least margin on each side
MARGIN_CAP_BYTES = 64 << 20  # the most

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def margin_fill(buffer: torch.Tensor, label: str) -> None:
    """Fill a guarded buffer with its margins' value: a NaN whose payload (1 or more) depends on the
    buffer's label, for the float dtypes of Note [NaN margins]; else SENTINEL_BYTE in every byte."""
    if buffer.dtype not in _NAN_MARGINS:
        buffer.view(torch.uint8).fill_(SENTINEL_BYTE)
        return
    quiet, width = _NAN_MARGINS[buffer.dtype]
    payload = 1 + zlib.crc32(label.encode()) % ((1 << width) - 1)
    buffer.view(_INT_VIEW[buffer.element_size()]).fill_(quiet | payload)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a tensor's elements, as integers of the same width (for exact comparison)."""
    t = t.detach()
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    return t.contiguous().view(_INT_VIEW[t.element_size()])


@dataclass(frozen=True)
class Layout:
    """How a logical shape sits in memory: a dim order, padding of the innermost stored dim, an offset."""

    order: tuple[int, ...] | None = None  # logical dims from outermost to innermost stored; None = as is
    pad: int = 0  # extra elements after each innermost row (strided rows)
    offset: int = 0  # elements skipped before the first element (a slice's storage offset)
    broadcast: bool = False  # every dim but the last has stride 0: all rows share one row's storage

    def strides(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if self.broadcast:
            return tuple(0 for _ in shape[:-1]) + tuple(1 for _ in shape[-1:])
        order = self.order if self.order is not None else tuple(range(len(shape)))
        strides = [0] * len(shape)
        step = 1
        for position, dim in enumerate(reversed(order)):
            strides[dim] = step
            step *= shape[dim] + (self.pad if position == 0 else 0)
        return tuple(strides)


CONTIGUOUS = Layout()
BROADCAST_ROWS = Layout(broadcast=True)


def copy_into(target: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``target.copy_(values)``, also where target's rows share storage (stride 0): then the values'
    rows are equal by construction and one of them is written."""
    if 0 in target.stride()[:-1] and target.dim() > 1:
        index = tuple(0 if stride == 0 else slice(None) for stride in target.stride()[:-1])
        target[index].copy_(values[index])
        return target
    return target.copy_(values)


class GuardedTensor:
    """A view into a sentinel-filled buffer; ``corruption()`` reports writes outside the view."""

    def __init__(self, shape, dtype: torch.dtype, device, layout: Layout = CONTIGUOUS, fill_nan: bool = False,
                 label: str = "", serial: int = 0):
        self.label = label
        shape = tuple(shape)
        strides = layout.strides(shape)
        span = 1 + sum((size - 1) * stride for size, stride in zip(shape, strides)) if all(shape) else 0
        itemsize = torch.empty((), dtype=dtype).element_size()
        # In whole MARGIN_BYTES, so the tensor starts as aligned as an allocator's would: Triton
        # compiles another kernel for a less aligned pointer (other vector widths, other bits).
        wide = min(max(span * itemsize, MARGIN_BYTES), MARGIN_CAP_BYTES)
        margin = max(1, -(-wide // MARGIN_BYTES) * MARGIN_BYTES // itemsize)
        self.start = margin + layout.offset
        self.buffer = torch.empty(self.start + span + margin, dtype=dtype, device=device)
        margin_fill(self.buffer, f"{label}#{serial}")  # serial: buffers of one label get other payloads
        self.tensor = self.buffer.as_strided(shape, strides, self.start)
        if fill_nan and dtype.is_floating_point:
            self.tensor.fill_(float("nan"))
        self._shape, self._strides = shape, strides
        self._expected = bits(self.buffer)[self._outside()].clone()

    def _outside(self) -> torch.Tensor:
        """Which elements of the buffer are not the view's. Made when needed, not kept: a byte per
        element, 2 GiB for a case at scale (oracle/cases/scale.py)."""
        owned = torch.zeros(self.buffer.numel(), dtype=torch.bool, device=self.buffer.device)
        owned.as_strided(self._shape, self._strides, self.start).fill_(True)
        return owned.logical_not_()

    def corruption(self) -> list[dict]:
        """Positions outside the view whose sentinel changed: [{'position', 'expected', 'found'}], first 5."""
        outside = self._outside()
        found = bits(self.buffer)[outside]
        changed = (found != self._expected).nonzero().flatten()
        if not changed.numel():
            return []
        where = outside.nonzero().flatten()[changed[:5]]
        return [{"position": int(p) - self.start, "expected": int(e), "found": int(f)}
                for p, e, f in zip(where.tolist(), self._expected[changed[:5]].tolist(), found[changed[:5]].tolist())]


def guarded(shape, dtype, device, layout: Layout = CONTIGUOUS, label: str = "") -> GuardedTensor:
    return GuardedTensor(shape, dtype, device, layout, label=label)


class _RehomeAllocations(TorchFunctionMode):
    """Serve torch.empty* from guarded, NaN-poisoned buffers; remember them for the margin check."""

    FACTORIES = {torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty,
                 torch.Tensor.new_empty_strided}

    def __init__(self):
        super().__init__()
        self.allocations: list[GuardedTensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if func not in self.FACTORIES or not isinstance(result, torch.Tensor) or result.numel() == 0:
            return result
        layout = _layout_of(result)
        if layout is None:
            return result
        home = GuardedTensor(result.shape, result.dtype, result.device, layout, fill_nan=True,
                             label=f"{getattr(func, '__name__', func)}{tuple(result.shape)}", serial=len(self.allocations))
        self.allocations.append(home)
        return home.tensor.requires_grad_(result.requires_grad)


def _layout_of(t: torch.Tensor) -> Layout | None:
    """A Layout reproducing t's strides if t is dense (what empty* returns), else None."""
    order = tuple(sorted(range(t.dim()), key=lambda d: (t.stride(d), -d), reverse=True))
    layout = Layout(order=order)
    return layout if layout.strides(tuple(t.shape)) == tuple(t.stride()) else None


@contextlib.contextmanager
def rehomed_allocations():
    """Within: the implementation's torch.empty* land in guarded NaN-filled buffers; C++-side
    allocations are NaN-filled by torch's deterministic mode. Yields the list of guarded buffers."""
    previous_det = torch.are_deterministic_algorithms_enabled()
    previous_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    previous_fill = torch.utils.deterministic.fill_uninitialized_memory
    mode = _RehomeAllocations()
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = True
        with warnings.catch_warnings():
            # warn_only: an op without a deterministic kernel is not this check's concern
            warnings.filterwarnings("ignore", message=".*does not have a deterministic implementation.*")
            with mode:
                yield mode.allocations
    finally:
        torch.use_deterministic_algorithms(previous_det, warn_only=previous_warn)
        torch.utils.deterministic.fill_uninitialized_memory = previous_fill


class Snapshot:
    """Bitwise copies of named tensors, to prove later which of them changed."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = dict(tensors)
        self.saved = {name: bits(t).clone() for name, t in tensors.items()}

    def changed(self) -> dict[str, dict]:
        """name -> {'index', 'expected', 'found', 'count'} for every tensor whose bits differ."""
        out = {}
        for name, t in self.tensors.items():
            now, before = bits(t), self.saved[name]
            diff = (now != before).flatten().nonzero().flatten()
            if diff.numel():
                first = int(diff[0])
                out[name] = {
                    "index": [int(i) for i in torch.unravel_index(torch.tensor(first), tuple(t.shape))],
                    "expected": _as_value(before.flatten()[first], t.dtype),
                    "found": _as_value(now.flatten()[first], t.dtype),
                    "count": int(diff.numel()),
                }
        return out


def _as_value(raw: torch.Tensor, dtype: torch.dtype) -> float | int:
    if dtype.is_floating_point:
        return float(raw.reshape(1).view(dtype)[0])
    return int(raw)


# --- fused storage (the views check, docs/design.md §4) -----------------------------------------


@dataclass(frozen=True)
class Fusion:
    """How several tensors share one storage in a real model: the fused buffer's shape, and the
    views of a buffer of that shape that are the tensors."""

    name: str
    shape: Callable[[dict[str, tuple[int, ...]]], tuple[int, ...]]
    views: Callable[[torch.Tensor, dict[str, tuple[int, ...]]], dict[str, torch.Tensor]]


def _last_dim_shape(shapes):
    first = next(iter(shapes.values()))
    return first[:-1] + (sum(shape[-1] for shape in shapes.values()),)


def _last_dim_views(base, shapes):
    views, start = {}, 0
    for name, shape in shapes.items():
        views[name] = base[..., start:start + shape[-1]]
        start += shape[-1]
    return views


def _heads_shape(shapes):
    batch, _, seq, head_dim = next(iter(shapes.values()))
    return (batch, seq, sum(shape[1] for shape in shapes.values()) * head_dim)


def _heads_views(base, shapes):
    views, start = {}, 0
    for name, (batch, heads, seq, head_dim) in shapes.items():
        block = base[..., start:start + heads * head_dim]
        views[name] = block.view(batch, seq, heads, head_dim).transpose(1, 2)
        start += heads * head_dim
    return views


# (..., n_i) tensors as neighbouring column blocks of one (..., sum n_i) buffer: a fused gate/up projection.
FUSE_LAST_DIM = Fusion("column blocks of one buffer", _last_dim_shape, _last_dim_views)
# (batch, heads_i, seq, head_dim) tensors split from one (batch, seq, sum heads_i * head_dim)
# projection and transposed, the way attention layers take Q, K and V from a fused QKV.
FUSE_HEADS = Fusion("heads of one fused QKV projection", _heads_shape, _heads_views)
