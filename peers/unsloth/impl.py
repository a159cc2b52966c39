"""Unsloth 2026.10.9 behind the declarations of ``ops``: its own autograd Functions, called as
``unsloth.kernels.fast_lora``'s ``apply_lora_mlp_swiglu``, ``apply_lora_qkv`` and ``apply_lora_o`` call
them (through ``_apply``, which torch.compile does not trace) for a plain LoRA layer (no quantisation, dropout or bias: ``W_quant`` None, ``inplace=True``), and
``fast_cross_entropy_loss`` as Unsloth's patched causal-LM loss calls it.

Unsloth's kernels compute in float32 and promise no float64 (``NO_FLOAT64``). The modules are
loaded as the built-in adapter loads them (``peers.unsloth.adapter``: Unsloth's package
``__init__`` never runs, it patches transformers).
"""

from __future__ import annotations

import importlib
import os
import sys

import torch

from oracle import ImplementationUnavailable, implementation
from peers.unsloth import adapter

if not torch.cuda.is_available() and os.environ.get("UNSLOTH_ALLOW_CPU") != "1":
    raise ImplementationUnavailable("Unsloth refuses to import without a GPU; on a CPU set its own test-only switch "
                                    "UNSLOTH_ALLOW_CPU=1 and its kernels run under Triton's interpreter")
try:
    adapter._installed_version("unsloth")
    for package in adapter.BARE_PACKAGES:
        adapter._register_bare(package)
    sys.modules["unsloth_zoo"].DEVICE_TYPE = importlib.import_module("unsloth.device_type").DEVICE_TYPE
    fast_lora = importlib.import_module("unsloth.kernels.fast_lora")
    swiglu_kernels = importlib.import_module("unsloth.kernels.swiglu")
    losses = importlib.import_module("unsloth.kernels.cross_entropy_loss")
except adapter.Unavailable as exc:
    raise ImplementationUnavailable(str(exc)) from exc


def lora_mlp(X, gateW, gateA, gateB, upW, upA, upB, downW, downA, downB, scaling):
    return fast_lora._apply(  # Unsloth's own call: LoRA Functions hidden from torch.compile (a graph break)
        fast_lora.LoRA_MLP, X, gateW, None, gateA, gateB, scaling, upW, None, upA, upB, scaling, downW, None, downA, downB, scaling,
        swiglu_kernels.swiglu_fg_kernel, swiglu_kernels.swiglu_DWf_DW_dfg_kernel, True)


def lora_qkv(X, QW, QA, QB, KW, KA, KB, VW, VA, VB, scaling):
    return fast_lora._apply(fast_lora.LoRA_QKV, X, QW, None, QA, QB, scaling, KW, None, KA, KB, scaling, VW, None, VA, VB,
                                    scaling, True)


def lora_o(X, OW, OA, OB, scaling):
    return fast_lora._apply(fast_lora.LoRA_W, X, OW, None, OA, OB, scaling)


def fast_cross_entropy(logits, labels, softcap):
    return losses.fast_cross_entropy_loss(logits, labels, logit_softcapping=softcap)


OPS = {"lora_mlp": lora_mlp, "lora_qkv": lora_qkv, "lora_o": lora_o, "fast_cross_entropy": fast_cross_entropy}
# inplace=True, the default of Unsloth's model code: the backward writes dX into X's buffer.
impl = implementation(**OPS, CLOBBERS={"lora_mlp": {"X"}, "lora_qkv": {"X"}}, NO_FLOAT64=set(OPS))
