"""Launch heuristics and launch arguments, kept in one place so that every kernel sizes its blocks and
picks its compute dtype the same way."""

from __future__ import annotations

import functools

import torch
import triton.language as tl

from ._runtime import interpreted

# A kernel's COMPUTE constexpr: the tl twin of _checks.compute_dtype's answer (fp32, or fp64 for fp64 inputs).
TL_COMPUTE = {torch.float32: tl.float32, torch.float64: tl.float64}

@functools.cache
def program_slots(device_index: int | None) -> int:
    """Programs that fill the device once: one per SM on a GPU (RMSNorm's measured settings say how
    many per SM), four under the interpreter, which runs programs one after another."""
    if interpreted() or device_index is None:
        return 4  # the interpreter runs programs one after another; fewer, wider programs are faster there
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def device_index(t: torch.Tensor) -> int | None:
    return t.device.index if t.device.type == "cuda" else None


# Host-side arithmetic for grids and blocks. triton.cdiv and triton.next_power_of_2 are
# constexpr-function objects whose host calls cost microseconds each, on every kernel call.
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 0 else 0
