"""What Unsloth's LoRA Functions and fast cross-entropy compute, declared for the harness.

Each LoRA reference is PEFT's ``lora.Linear`` forward in the input's dtype, adapters in that dtype
too (PEFT's ``autocast_adapter_dtype=False``; Unsloth casts its adapters to X's dtype whatever they
are): ``base(x) + lora_B(lora_A(x)) * scaling``, every step rounded as eager torch rounds it. The
base weights are frozen, as in LoRA training: only X and the adapters A and B have gradients.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from oracle import Choice, Dim, Integers, Op, Tensor

BATCH = Dim(1, 4, special=(1, 2))
SEQ = Dim(1, 512, special=(1, 3, 64, 257), programs=True)
HIDDEN = Dim(1, 2048, special=(1, 7, 64, 1000))
INTERMEDIATE = Dim(1, 4096, special=(1, 7, 1000, 1025, 4097))  # past the raw SwiGLU kernels' 1024 block
OUT = Dim(1, 2048, special=(1, 7, 64, 1000))
RANK = Dim(1, 64, special=(1, 8, 16))
SCALING = Choice(0.5, 1.0, 2.0)  # lora_alpha / r
# "large" values (1e4) through a projection overflow float16 in every implementation, PEFT's as well:
# no case there judges a kernel. The other kinds, non-finite inputs included, stay.
PROJECTION_VALUES = ("normal", "tiny", "zero_rows", "outliers", "nonfinite")


def lora_linear(x, W, A, B, scaling):
    """PEFT's LoRA layer: the frozen base projection plus the scaled low-rank update."""
    return F.linear(x, W) + F.linear(F.linear(x, A), B) * scaling


def _adapters(prefix: str, out: str, into: str) -> dict:
    """A projection's frozen base weight (out x into) and its adapters A (rank x into), B (out x rank)."""
    return {f"{prefix}W": Tensor(out, into, values="small"), f"{prefix}A": Tensor("rank", into, values="small"),
            f"{prefix}B": Tensor(out, "rank", values="small")}


def lora_mlp(X, gateW, gateA, gateB, upW, upA, upB, downW, downA, downB, scaling):
    """Llama's MLP with LoRA on its three projections: down(silu(gate(x)) * up(x))."""
    gate = lora_linear(X, gateW, gateA, gateB, scaling)
    up = lora_linear(X, upW, upA, upB, scaling)
    return lora_linear(F.silu(gate) * up, downW, downA, downB, scaling)


def _trainable(*projections: str) -> tuple[str, ...]:
    return ("X", *(f"{p}{part}" for p in projections for part in "AB"))


LORA_MLP = Op(
    "lora_mlp", reference=lora_mlp,
    inputs={"X": Tensor("batch", "seq", "hidden"), **_adapters("gate", "inter", "hidden"),
            **_adapters("up", "inter", "hidden"), **_adapters("down", "hidden", "inter")},
    dims={"batch": BATCH, "seq": SEQ, "hidden": HIDDEN, "inter": INTERMEDIATE, "rank": RANK},
    params={"scaling": SCALING}, differentiable=_trainable("gate", "up", "down"), outputs=("Y",),
    may_clobber=("X",),  # inplace=True, apply_lora_mlp_swiglu's default: the backward writes dX into X
    value_kinds=PROJECTION_VALUES,
    summary="LoRA_MLP with swiglu_fg_kernel / swiglu_DWf_DW_dfg_kernel (apply_lora_mlp_swiglu, inplace=True)",
)


def lora_qkv(X, QW, QA, QB, KW, KA, KB, VW, VA, VB, scaling):
    """An attention layer's three input projections, each with LoRA."""
    return tuple(lora_linear(X, W, A, B, scaling) for W, A, B in ((QW, QA, QB), (KW, KA, KB), (VW, VA, VB)))


LORA_QKV = Op(
    "lora_qkv", reference=lora_qkv,
    inputs={"X": Tensor("batch", "seq", "hidden"), **_adapters("Q", "q_out", "hidden"),
            **_adapters("K", "kv_out", "hidden"), **_adapters("V", "kv_out", "hidden")},
    dims={"batch": BATCH, "seq": SEQ, "hidden": HIDDEN, "q_out": OUT, "kv_out": Dim(1, 1024, special=(1, 7, 64)),
          "rank": RANK},
    params={"scaling": SCALING}, differentiable=_trainable("Q", "K", "V"), outputs=("Q", "K", "V"),
    may_clobber=("X",),  # inplace=True, apply_lora_qkv's default: the backward writes dX into X
    value_kinds=PROJECTION_VALUES,
    summary="LoRA_QKV (apply_lora_qkv, inplace=True)",
)

LORA_O = Op(
    "lora_o", reference=lambda X, OW, OA, OB, scaling: lora_linear(X, OW, OA, OB, scaling),
    inputs={"X": Tensor("batch", "seq", "hidden"), **_adapters("O", "out", "hidden")},
    dims={"batch": BATCH, "seq": SEQ, "hidden": HIDDEN, "out": OUT, "rank": RANK},
    params={"scaling": SCALING}, differentiable=_trainable("O"), outputs=("Y",),
    value_kinds=PROJECTION_VALUES,
    summary="LoRA_W on the output projection (apply_lora_o)",
)


def causal_lm_loss(logits, labels, softcap):
    """HF's causal-LM loss on float32 logits, Gemma 2's tanh soft-capping first where it is on (softcap
    > 0): the sum over the kept tokens (label -100 is ignored) over their count."""
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if softcap:
        x = softcap * torch.tanh(x / softcap)
    kept = (labels != -100).sum()
    return F.cross_entropy(x.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum") / kept


CROSS_ENTROPY = Op(
    "fast_cross_entropy", reference=causal_lm_loss,
    inputs={"logits": Tensor("batch", "seq", "vocab"),
            "labels": Tensor("batch", "seq", dtype=torch.int64, values=Integers(0, "vocab", {-100: 0.1}))},
    dims={"batch": BATCH, "seq": Dim(1, 256, special=(1, 3, 64), programs=True),
          "vocab": Dim(2, 32768, special=(2, 7, 1000, 4097, 32000))},
    params={"softcap": Choice(0.0, 30.0)}, outputs=("loss",),
    summary="fast_cross_entropy_loss (n_items None: the mean over kept tokens; or Gemma 2's softcap 30)",
)
