"""Deliberately broken Triton kernels that access memory out of bounds: ``python -m oracle.sanitize``
must report each one (tests/test_sanitize.py).

They are never run under the CPU interpreter: there an unmasked access reads or writes the host
heap past the tensor, and corrupts the process. Run them on a GPU only, loaded as
``--impl tests.broken_gpu_kernels:NAME``. Importing this module is safe anywhere (it only defines
the kernels).

Both are SwiGLU's raw forward, ``swiglu_fg_kernel(e, g)``: a new h = silu(e) * g in fp32, silu
rounded to e's dtype as HF's F.silu, over a flat 1-D grid of BLOCK_SIZE elements per program.

- ``unmasked_tail_store``: the store has no mask, so the last partial block writes past the end of h.
  The harness's guard bands see this one too.
- ``unmasked_tail_load``: the loads of e and g have no mask (the store has), so h is right and only
  the reads past e and g are wrong; guard bands cannot see a read, memcheck can.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

import kernels  # noqa: F401 - before triton: it picks the interpreter on a machine without a GPU

# isort: split
import triton
import triton.language as tl

from oracle.declare.registry import SPECS

BLOCK_SIZE = 1024


@triton.jit
def _unmasked_store_kernel(h_ptr, e_ptr, g_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    e = tl.load(e_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    f = (e / (1.0 + tl.exp(-e))).to(h_ptr.dtype.element_ty).to(tl.float32)
    tl.store(h_ptr + offsets, f * g)  # the bug: no mask


@triton.jit
def _unmasked_load_kernel(h_ptr, e_ptr, g_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    e = tl.load(e_ptr + offsets).to(tl.float32)  # the bug: no mask on either load
    g = tl.load(g_ptr + offsets).to(tl.float32)
    f = (e / (1.0 + tl.exp(-e))).to(h_ptr.dtype.element_ty).to(tl.float32)
    tl.store(h_ptr + offsets, f * g, mask=mask)


def _raw_forward(kernel):
    def swiglu_fg_kernel(e: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        h = torch.empty_like(e)
        n = e.numel()
        if n:
            kernel[(triton.cdiv(n, BLOCK_SIZE),)](h, e, g, n, BLOCK_SIZE=BLOCK_SIZE)
        return h

    return swiglu_fg_kernel


_LACKING = {op: "a broken swiglu_fg_kernel only" for op in SPECS if op != "swiglu_fg_kernel"}

unmasked_tail_store = SimpleNamespace(swiglu_fg_kernel=_raw_forward(_unmasked_store_kernel), LACKING=_LACKING)
unmasked_tail_load = SimpleNamespace(swiglu_fg_kernel=_raw_forward(_unmasked_load_kernel), LACKING=_LACKING)
