"""An autotuned raw SwiGLU forward, as libraries write them, for tests/test_autotune_cases.py: two
configs that must give the same bits, and a twin whose second config is wrong (it skips the last,
partial block), a bug that Triton's autotuning would hide until the day that config won."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from oracle.declare.implementations import implementation


def _configs(second_is_wrong: bool) -> list:
    return [triton.Config({"BLOCK": 64, "SKIP_TAIL": False}, num_warps=2),
            triton.Config({"BLOCK": 128, "SKIP_TAIL": second_is_wrong}, num_warps=4)]


def _kernel(configs):
    @triton.autotune(configs=configs, key=["n"])
    @triton.jit
    def swiglu_fg(H, E, G, n, BLOCK: tl.constexpr, SKIP_TAIL: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < (n // BLOCK * BLOCK if SKIP_TAIL else n)
        e = tl.load(E + offs, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
        f = (e * tl.sigmoid(e)).to(H.dtype.element_ty).to(tl.float32)  # HF rounds silu(e) to the dtype
        tl.store(H + offs, (f * g).to(H.dtype.element_ty), mask=mask)

    return swiglu_fg


def _launcher(kernel):
    def swiglu_fg_kernel(e: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        e, g = e.contiguous(), g.contiguous()
        h = torch.empty_like(e)
        n = e.numel()
        kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](h, e, g, n)
        return h

    return swiglu_fg_kernel


right = implementation(swiglu_fg_kernel=_launcher(_kernel(_configs(second_is_wrong=False))), NO_FLOAT64={"swiglu_fg_kernel"})
wrong_second_config = implementation(swiglu_fg_kernel=_launcher(_kernel(_configs(second_is_wrong=True))),
                                     NO_FLOAT64={"swiglu_fg_kernel"})
