"""How a gated-activation kernel declares the Hugging Face MLPs it can replace.

HF's gated MLPs (Llama, Mistral, Qwen, Gemma, ...) all compute

    down_proj(act_fn(gate_proj(x)) * up_proj(x))

and differ only in act_fn. A kernel module for h = act(e) * g exports ``MLP_PATCH``, a
``GatedMLPPatch`` that recognises its activation; ``kernels.patching`` collects every kernel
module's MLP_PATCH, so a new op brings its own patch and patching.py stays as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

GATED_MLP_PARTS = ("gate_proj", "up_proj", "down_proj", "act_fn")


def is_gated_mlp(module: nn.Module) -> bool:
    return all(hasattr(module, part) for part in GATED_MLP_PARTS)


@dataclass(frozen=True)
class GatedMLPPatch:
    name: str  # the op, as reports name it
    op: Callable[..., torch.Tensor]  # op(e, g, **options) -> act(e) * g
    options_for: Callable[[nn.Module], dict | None]  # act_fn -> op's options; None: not this op's activation

    def forward(self, options: dict) -> Callable[[nn.Module, torch.Tensor], torch.Tensor]:
        """HF's gated-MLP forward with act_fn(gate) * up replaced by the op (gate computed first, as HF does)."""
        op = self.op

        def gated_mlp_forward(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
            return module.down_proj(op(module.gate_proj(x), module.up_proj(x), **options))

        return gated_mlp_forward

    def label(self, options: dict) -> str:
        """The op and its options, as in ``geglu(approximate='tanh')``."""
        return f"{self.name}({', '.join(f'{k}={v!r}' for k, v in options.items())})"
