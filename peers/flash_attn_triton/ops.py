"""What flash-attn's Triton kernels compute, declared for the harness: each reference is the maths of
flash-attn's own test references (``apply_rotary_emb_torch``; ``rms_norm_ref``/``layer_norm_ref`` with
``upcast=True``), written here in plain torch."""

from __future__ import annotations

import torch

from oracle import Dim, Op, Tensor

ROTARY_BASE = 10000.0
HEAD_HALVES = Dim(1, 128, special=(1, 4, 16, 32, 40, 48, 64, 128))  # head dims 2..256; 80 and 96 included
INTERLEAVING = {"plain": {"interleaved": False}, "interleaved": {"interleaved": True}}


def rotary_angles(positions: int, half: int) -> torch.Tensor:
    inverse_frequency = ROTARY_BASE ** (-torch.arange(half, dtype=torch.float64) / half)
    return torch.arange(positions, dtype=torch.float64)[:, None] * inverse_frequency


def _cos(shape, dtype, generator, device):
    return rotary_angles(*shape).cos().to(dtype=dtype, device=device)


def _sin(shape, dtype, generator, device):
    return rotary_angles(*shape).sin().to(dtype=dtype, device=device)


def _rotated(x, cos, sin, interleaved: bool):
    """x * cos + rotate(x) * sin, with (…, half) tables widened as flash-attn's reference widens them."""
    if interleaved:
        cos, sin = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
        pairs = x.unflatten(-1, (-1, 2))
        rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), -1).flatten(-2)
    else:
        cos, sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
        first, second = x.chunk(2, -1)
        rotated = torch.cat((-second, first), -1)
    return x * cos + rotated * sin


def rotary(x, cos, sin, interleaved):
    """x: (batch, seq, heads, 2 half); cos, sin: (seq, half), in x's dtype."""
    return _rotated(x, cos[:, None, :], sin[:, None, :], interleaved)


def segments(tokens: int) -> list[int]:
    """How a packed batch of ``tokens`` splits into sequences (lengths 1, 7, 64, 3, 129, 30, ... in
    turn; the last takes what is left): the same for the reference and the adapter."""
    lengths, pattern = [], (1, 7, 64, 3, 129, 30)
    while sum(lengths) < tokens:
        lengths.append(min(pattern[len(lengths) % len(pattern)], tokens - sum(lengths)))
    return lengths


def rotary_varlen(x, cos, sin, interleaved):
    """x: (tokens, heads, 2 half), packed sequences; each sequence's positions start at 0."""
    positions = torch.cat([torch.arange(n, device=x.device) for n in segments(x.shape[0])])
    return _rotated(x, cos[positions][:, None, :], sin[positions][:, None, :], interleaved)


def add_rms_norm(x, residual, W, eps):
    """The residual added in x's dtype (flash-attn stores it so), then RMSNorm in fp32, one rounding."""
    summed = x + residual
    h = summed.float()
    y = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + eps) * W.float()
    return y.to(x.dtype), summed


def add_layer_norm(x, residual, W, B, eps):
    summed = x + residual
    h = summed.float()
    centred = h - h.mean(-1, keepdim=True)
    y = centred * torch.rsqrt(centred.square().mean(-1, keepdim=True) + eps) * W.float() + B.float()
    return y.to(x.dtype), summed


TABLES = {"cos": Tensor("seq", "half", values=_cos), "sin": Tensor("seq", "half", values=_sin)}

FA_ROTARY = Op(
    "fa_rotary", reference=rotary,
    inputs={"x": Tensor("batch", "seq", "heads", ("half", 2)), **TABLES},
    dims={"batch": Dim(1, 4, special=(1, 3)), "seq": Dim(1, 512, special=(1, 7, 8, 9, 257)),
          "heads": Dim(1, 16, special=(1, 2, 3, 5)), "half": HEAD_HALVES},
    params={"interleaved": False}, variants=INTERLEAVING, differentiable=("x",), outputs=("y",),
    summary="flash_attn.layers.rotary.apply_rotary_emb",
)

FA_ROTARY_VARLEN = Op(
    "fa_rotary_varlen", reference=rotary_varlen,
    inputs={"x": Tensor("tokens", "heads", ("half", 2)),
            "cos": Tensor("tokens", "half", values=_cos), "sin": Tensor("tokens", "half", values=_sin)},
    dims={"tokens": Dim(1, 2048, special=(1, 8, 72, 204, 1000), programs=True),
          "heads": Dim(1, 16, special=(1, 2, 3, 5)), "half": HEAD_HALVES},
    params={"interleaved": False}, variants=INTERLEAVING, differentiable=("x",), outputs=("y",),
    summary="apply_rotary_emb with cu_seqlens (packed sequences)",
)

ROWS, WIDTH = Dim(1, 4096, programs=True), Dim(1, 8192, special=(1, 7, 128, 1000, 1023, 4097, 8192))

FA_ADD_RMS_NORM = Op(
    "fa_add_rms_norm", reference=add_rms_norm,
    inputs={"x": Tensor("rows", "cols"), "residual": Tensor("rows", "cols"), "W": Tensor("cols", values="weight")},
    dims={"rows": ROWS, "cols": WIDTH}, params={"eps": 1e-6}, outputs=("y", "residual_out"),
    summary="flash_attn.ops.triton.layer_norm.rms_norm_fn(residual=..., prenorm=True)",
)

FA_ADD_LAYER_NORM = Op(
    "fa_add_layer_norm", reference=add_layer_norm,
    inputs={"x": Tensor("rows", "cols"), "residual": Tensor("rows", "cols"), "W": Tensor("cols", values="weight"),
            "B": Tensor("cols", values="small")},
    dims={"rows": ROWS, "cols": WIDTH}, params={"eps": 1e-5}, outputs=("y", "residual_out"),
    summary="flash_attn.ops.triton.layer_norm.layer_norm_fn(residual=..., prenorm=True)",
)
