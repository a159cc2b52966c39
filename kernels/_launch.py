"""Launch heuristics and launch arguments, kept in one place so that every kernel sizes its blocks and
picks its compute dtype the same way."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ._runtime import interpreted

# A kernel's COMPUTE constexpr: the tl twin of _checks.compute_dtype's answer (fp32, or fp64 for fp64 inputs).
TL_COMPUTE = {torch.float32: tl.float32, torch.float64: tl.float64}

MAX_FUSED_COLUMNS = 65536  # one row must fit one block: 64 Ki fp32 values is what a program can hold


def row_block(n_cols: int) -> tuple[int, int]:
    """(BLOCK_SIZE, num_warps) for a kernel that holds one whole row of ``n_cols`` values."""
    if n_cols > MAX_FUSED_COLUMNS:
        raise ValueError(
            f"{n_cols} columns exceed the fused kernels' maximum of {MAX_FUSED_COLUMNS} "
            f"(one row must fit one block of at most {MAX_FUSED_COLUMNS} elements)"
        )
    block = triton.next_power_of_2(n_cols)
    # More warps for wider rows keeps registers per thread bounded (a 64 Ki row is 64 values/thread at 32 warps).
    if block >= 32768:
        warps = 32
    elif block >= 8192:
        warps = 16
    elif block >= 2048:
        warps = 8
    else:
        warps = 4
    return block, warps


@functools.cache
def program_slots(device_index: int | None) -> int:
    """Persistent programs for the RMSNorm backward: one per SM on a GPU (with its 3-stage pipelined
    loop this measured fastest on the H200; more programs mean more dW partial rows to sum), four
    under the interpreter, which runs programs one after another."""
    if interpreted() or device_index is None:
        return 4  # the interpreter runs programs one after another; fewer, wider programs are faster there
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def device_index(t: torch.Tensor) -> int | None:
    return t.device.index if t.device.type == "cuda" else None
