"""Input validation shared by the ops. Every check runs before any launch and names the argument."""

from __future__ import annotations

import numbers

import numpy as np
import torch

from ._runtime import interpreted

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# Fixed once kernels/_runtime.py has picked the backend; a constant here, so that torch.compile
# traces the device check below without calling into Triton (a graph break).
_INTERPRETED = interpreted()


def require_tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def require_float(name: str, t: torch.Tensor) -> None:
    require_tensor(name, t)
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {t.dtype}")


def require_same_dtype(**tensors: torch.Tensor) -> None:
    dtypes = {name: t.dtype for name, t in tensors.items()}
    if len(set(dtypes.values())) > 1:
        listed = ", ".join(f"{name}={dtype}" for name, dtype in dtypes.items())
        raise TypeError(f"dtypes must match: {listed}")


def require_kernel_device(**tensors: torch.Tensor) -> None:
    """All tensors on one device: CUDA, or the CPU when the interpreter runs the kernels (a meta
    tensor has no memory to read, so it is refused here rather than crashing a kernel)."""
    device = next(iter(tensors.values())).device
    if any(t.device != device for t in tensors.values()):
        listed = ", ".join(f"{name} on {t.device}" for name, t in tensors.items())
        raise ValueError(f"tensors must be on one device: {listed}")
    if _INTERPRETED and device.type != "cpu":
        raise ValueError(f"the kernels run on the CPU through Triton's interpreter here, but the tensors are "
                         f"on {device}; move them to the CPU")
    if not _INTERPRETED and device.type != "cuda":
        raise ValueError(
            f"the kernels run on CUDA but the tensors are on {device}; move them to the GPU "
            "(or set TRITON_INTERPRET=1 to run them on the CPU through Triton's interpreter)"
        )


def require_ndim(name: str, t: torch.Tensor, ndim: int, layout: str) -> None:
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {tuple(t.shape)}")


def require_real(name: str, value: object) -> float:
    if type(value) is float or type(value) is int:  # the common case, without the abstract class's slow check
        return float(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    return float(value)


FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def require_small_nonnegative(name: str, value: object) -> float:
    """A real number in [0, float32's largest]: a kernel receives Python floats as fp32, so a larger
    one would arrive as inf; NaN or a negative value (an eps) would turn every result into NaN."""
    number = require_real(name, value)
    if not (0.0 <= number <= FLOAT32_MAX):  # also false for NaN
        raise ValueError(f"{name} must be finite, >= 0 and at most {FLOAT32_MAX:.4g} (float32's largest), got {number}")
    return number


def require_bool(name: str, value: object) -> bool:
    """A flag must be a real bool: a truthy 1 or "no" would silently pick a code path."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


# --- aliasing: tensors a kernel writes must own their memory ----------------------------------------


def byte_span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last + 1) byte addresses t's elements can occupy: its storage's start, plus its offset,
    plus how far its strides reach (torch strides are never negative)."""
    start = t.data_ptr()  # the storage's start plus the offset, without making a storage object
    if t.is_contiguous():  # the common case, on every call's path: the elements one after another
        return start, start + t.numel() * t.element_size()
    reach = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return start, start + (reach + 1) * t.element_size()


def _spans_meet(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _fills_its_span(t: torch.Tensor) -> bool:
    return torch._debug_has_internal_overlap(t) == 0  # 0: non-overlapping and dense, every byte of its span used


class _Extent:
    """t's address, shape and byte strides in numpy's array interface, for numpy's exact overlap
    solver. It only describes the memory: numpy never reads it, so a GPU address is fine."""

    def __init__(self, t: torch.Tensor):
        self.__array_interface__ = {
            "version": 3, "shape": tuple(t.shape), "typestr": f"|V{t.element_size()}",
            "strides": tuple(stride * t.element_size() for stride in t.stride()), "data": (t.data_ptr(), True),
        }


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True if a and b share at least one byte of memory, exactly: disjoint byte spans are the cheap,
    common answer; interleaved views (Q and K of one fused projection) get numpy's solver, which
    decides on the strides alone. Memory is compared by address, so storages that alias each other
    (from_numpy, DLPack) count too."""
    if a.numel() == 0 or b.numel() == 0 or not _spans_meet(byte_span(a), byte_span(b)):
        return False
    if _fills_its_span(a) and _fills_its_span(b):
        return True
    try:
        return bool(np.shares_memory(np.asarray(_Extent(a)), np.asarray(_Extent(b)), max_work=10**6))
    except np.exceptions.TooHardError:  # a pathological stride pattern: no proof that they are disjoint
        return True


def _strides_nest(t: torch.Tensor) -> bool:
    """Each dim's stride (sorted) steps over everything the smaller-stride dims reach: then no two
    elements share an address. True for every slice, transpose or permutation of a dense tensor."""
    reach = 0
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz > 1):
        if stride <= reach:
            return False
        reach += (size - 1) * stride
    return True


def has_internal_overlap(t: torch.Tensor) -> bool:
    """True if two elements of t share memory (an expanded, stride-0 tensor; an unfold)."""
    status = torch._debug_has_internal_overlap(t)  # 0: no, 1: yes (a stride-0 dim), 2: torch cannot tell
    if status != 2:
        return bool(status)
    if _strides_nest(t):
        return False
    # A hand-made as_strided layout: count distinct offsets (host work on the shape alone, no data).
    offsets = torch.zeros((), dtype=torch.int64)
    for size, stride in zip(t.shape, t.stride()):
        offsets = offsets.unsqueeze(-1) + torch.arange(size) * stride
    return offsets.unique().numel() < t.numel()


def require_unaliased(written: dict[str, torch.Tensor], read: dict[str, torch.Tensor]) -> None:
    """A tensor the kernel writes in place must own each of its elements once and share no memory
    with any other argument; otherwise an element is rotated twice, or an output lands on an input
    that a later program still reads, and the result is silently wrong."""
    for name, t in written.items():
        if has_internal_overlap(t):
            raise ValueError(f"{name} has elements that share memory (expanded, stride 0?) and is written in "
                             f"place; pass {name}.clone()")
    tensors = written | read
    names = list(tensors)  # the written ones first
    spans = {name: byte_span(t) for name, t in tensors.items()}  # once each: the cheap test for every pair
    for i, first in enumerate(written):
        for second in names[i + 1:]:
            if _spans_meet(spans[first], spans[second]) and overlaps(tensors[first], tensors[second]):
                raise ValueError(f"{first} and {second} share memory, and {first} is written in place; "
                                 f"pass separate tensors (clone one of them)")


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """Kernels compute in fp32, or in fp64 when any input is fp64 (so gradcheck can test them)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32
