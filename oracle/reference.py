"""Hugging Face's maths for the three ops, written once, exactly as transformers evaluates it.

Every function takes ``compute``: the dtype HF upcasts to (float32). The truth is the same function
evaluated on float64 copies of the same inputs with ``compute=torch.float64`` (``truth(...)``),
as FlashAttention's ``upcast`` switch does. Each mirror records the transformers source it copies
and the versions it was proven bit-identical against (tests/test_reference.py runs that proof
against whatever transformers is installed).

Alongside each mirror is a *reordered* form: the same maths in the same dtype, evaluated in a
different but equally valid order. The verdict (compare.py) uses the spread between the two as the
rounding noise an implementation is entitled to, which is what makes it fair where results are
small differences of large terms.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Mirror:
    source: str  # the transformers object whose maths the function copies
    checked: tuple[str, ...]  # transformers versions proven bit-identical (see tests/test_reference.py)


MIRRORS: dict[str, Mirror] = {}
_CHECKED = ("5.17.0", "5.24.0")


def mirrors(source: str) -> Callable:
    def register(fn: Callable) -> Callable:
        MIRRORS[fn.__name__] = Mirror(source=source, checked=_CHECKED)
        return fn

    return register


# --- RMSNorm --------------------------------------------------------------------------------------


@mirrors("transformers.models.llama.modeling_llama.LlamaRMSNorm.forward (also Mistral, Qwen2, Qwen3 and q/k norms)")
def llama_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, compute: torch.dtype = torch.float32):
    input_dtype = x.dtype
    h = x.to(compute)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return w * h.to(input_dtype)


@mirrors("transformers.models.gemma.modeling_gemma.GemmaRMSNorm.forward (Gemma 1/2/3)")
def gemma_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, compute: torch.dtype = torch.float32):
    h = x.to(compute)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    out = h * (1.0 + w.to(compute))
    return out.type_as(x)


def rms_norm(X, W, eps, gemma=False, compute=torch.float32):
    """The contract's rms_norm(X, W, eps, gemma): Llama's or Gemma's HF maths."""
    return (gemma_rms_norm if gemma else llama_rms_norm)(X, W, eps, compute)


def rms_norm_reordered(X, W, eps, gemma=False, compute=torch.float32):
    """Same maths, other order: the sum of squares reversed and divided by n, then divided by the
    root; backward by the closed form dX = r * (g - normed * mean(g * normed)) instead of autograd's
    chain. Where dX is a small difference of large terms (one column: dX ~ eps / x^2 relative to
    its terms) the two orders differ by the rounding noise at the terms' scale, which the verdict
    needs to know (compare.py, Note [The verdict])."""
    return _ClosedFormRMSNorm.apply(X, W, eps, gemma, compute)


class _ClosedFormRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X, W, eps, gemma, compute):
        h = X.to(compute)
        variance = h.flip(-1).pow(2).sum(-1, keepdim=True) / h.shape[-1]
        inv_var = 1.0 / torch.sqrt(variance + eps)
        normed = h * inv_var
        ctx.save_for_backward(X, W, inv_var)
        ctx.gemma, ctx.compute = gemma, compute
        if gemma:
            return ((1.0 + W.to(compute)) * normed).type_as(X)
        return normed.to(X.dtype) * W

    @staticmethod
    def backward(ctx, dY):
        X, W, inv_var = ctx.saved_tensors
        h, dy = X.to(ctx.compute), dY.to(ctx.compute)
        normed = h * inv_var
        if ctx.gemma:
            g = dy * (1.0 + W.to(ctx.compute))
            dW_rows = dy * normed
        else:
            g = (dy * W.to(ctx.compute)).to(X.dtype).to(ctx.compute)
            dW_rows = dy * normed.to(X.dtype).to(ctx.compute)
        # Rows summed one after another (cumsum's order), as a persistent kernel accumulates them,
        # where HF's sum is pairwise: with one column, dW is a sum of +-1-sized terms.
        dW = dW_rows.reshape(-1, h.shape[-1]).cumsum(0)[-1]
        dX = inv_var * (g - normed * (g * normed).mean(-1, keepdim=True))
        return dX.to(X.dtype), dW.to(W.dtype), None, None, None


# --- Rotary embedding ---------------------------------------------------------------------------


@mirrors("transformers.modeling_rope_utils (default, 'linear' and 'llama3' rope_type inverse frequencies)")
def rope_inv_freq(head_dim: int, theta: float, rope_type: str = "default", **params) -> tuple[torch.Tensor, float]:
    """(inv_freq, attention_scaling) as transformers computes them for ``rope_type``.

    linear: ``factor``. llama3: ``factor``, ``low_freq_factor``, ``high_freq_factor``,
    ``original_max_position_embeddings``. All three leave attention_scaling at 1.0.
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim
    inv_freq = 1.0 / (theta ** exponents)
    if rope_type == "default":
        return inv_freq, 1.0
    if rope_type == "linear":
        return inv_freq / params["factor"], 1.0
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, **params), 1.0
    raise ValueError(f"rope_type must be 'default', 'linear' or 'llama3', got {rope_type!r}")


def _llama3_inv_freq(inv_freq, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings):
    # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    context = original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    long_cutoff = context / low_freq_factor
    short_cutoff = context / high_freq_factor
    scaled = torch.where(wavelen > long_cutoff, inv_freq / factor, inv_freq)
    blend = (context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - blend) * scaled / factor + blend * scaled
    in_band = ~(wavelen < short_cutoff) * ~(wavelen > long_cutoff)
    return torch.where(in_band, blended, scaled)


@mirrors("transformers.models.llama.modeling_llama.LlamaRotaryEmbedding.forward")
def rotary_cos_sin(inv_freq: torch.Tensor, attention_scaling: float, position_ids: torch.Tensor,
                   dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (*position_ids.shape, head_dim) for integer positions, fp32 then cast to dtype."""
    freqs = position_ids[..., None].float() * inv_freq.to(device=position_ids.device, dtype=torch.float)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos() * attention_scaling
    sin = emb.sin() * attention_scaling
    return cos.to(dtype), sin.to(dtype)


def rotary_table(max_pos: int, head_dim: int, theta: float = 10000.0, rope_type: str = "default",
                 dtype: torch.dtype = torch.float32, device=None, **params) -> tuple[torch.Tensor, torch.Tensor]:
    """The (max_pos, head_dim) cos and sin tables the contract's ``rope`` takes: rows of HF's rotary output."""
    inv_freq, scaling = rope_inv_freq(head_dim, theta, rope_type, **params)
    return rotary_cos_sin(inv_freq, scaling, torch.arange(max_pos, device=device), dtype)


@mirrors("transformers.models.llama.modeling_llama.rotate_half")
def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


@mirrors("transformers.models.llama.modeling_llama.apply_rotary_pos_emb")
def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim: int = 1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def table_rows(Q, cos, sin, position_ids):
    """Each token's cos and sin rows, cast to Q's dtype: what HF's rotary embedding returns."""
    if position_ids is None:
        position_ids = torch.arange(Q.shape[2], device=Q.device).expand(Q.shape[0], -1)
    return cos[position_ids].to(Q.dtype), sin[position_ids].to(Q.dtype)


def rope(Q, K, cos, sin, position_ids=None, compute=None):
    """The contract's rope: HF's apply_rotary_pos_emb on the table rows of each token, cast to Q's dtype.

    ``compute`` is accepted for symmetry; HF computes RoPE in the model dtype itself.
    """
    c, s = table_rows(Q, cos, sin, position_ids)
    return apply_rotary_pos_emb(Q, K, c, s)


def rope_reordered(Q, K, cos, sin, position_ids=None, compute=torch.float32):
    """Same rotation with one rounding: each output computed in fp32 (or wider) and cast once."""
    c, s = table_rows(Q, cos, sin, position_ids)
    wide = torch.promote_types(compute, Q.dtype)
    c, s = c.to(wide).unsqueeze(1), s.to(wide).unsqueeze(1)
    return tuple((x.to(wide) * c + rotate_half(x.to(wide)) * s).to(x.dtype) for x in (Q, K))


# --- SwiGLU ---------------------------------------------------------------------------------------


@mirrors("transformers.models.llama.modeling_llama.LlamaMLP.forward's act_fn(gate) * up, act_fn = nn.SiLU")
def swiglu(e: torch.Tensor, g: torch.Tensor, compute=None) -> torch.Tensor:
    return F.silu(e) * g


def swiglu_reordered(e, g, compute=torch.float32):
    """silu as e * sigmoid(e) in the compute dtype, rounded once, then times g. ``e`` is upcast once,
    so autograd sums the two paths of de in the compute dtype and rounds once, as silu's own
    backward does (upcasting it twice would round each path to e's dtype before summing)."""
    wide = e.to(compute)
    return (wide * torch.sigmoid(wide)).to(e.dtype) * g


@mirrors("transformers.models.llama.modeling_llama.LlamaMLP.forward")
def llama_mlp(x, gate_weight, up_weight, down_weight, compute=None):
    return F.linear(swiglu(F.linear(x, gate_weight), F.linear(x, up_weight)), down_weight)


# --- The truth ----------------------------------------------------------------------------------


def upcast(value):
    """A float64 copy of a floating tensor (keeping requires_grad as a fresh leaf); anything else unchanged."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().to(torch.float64).requires_grad_(value.requires_grad)
    return value


def truth(fn: Callable, *args, **kwargs):
    """``fn`` on float64 copies of its tensor arguments, computing in float64."""
    return fn(*(upcast(a) for a in args), **{k: upcast(v) for k, v in kwargs.items()}, compute=torch.float64)


def swiglu_lora_backward(DW, e, g, compute=None, forward=swiglu):
    """What the raw kernel swiglu_DWf_DW_dfg_kernel must produce: (h, df, de) by HF's autograd.

    h = silu(e) * g; df = the gradient of g; de = the gradient of e, for incoming gradient DW.
    """
    e_leaf, g_leaf = e.detach().requires_grad_(), g.detach().requires_grad_()
    with torch.enable_grad():
        h = forward(e_leaf, g_leaf, compute=compute)
        de, df = torch.autograd.grad(h, (e_leaf, g_leaf), DW)
    return h.detach(), df, de


def swiglu_lora_backward_reordered(DW, e, g, compute=torch.float32):
    return swiglu_lora_backward(DW, e, g, compute=compute, forward=swiglu_reordered)
