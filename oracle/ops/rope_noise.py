"""RoPE's hand-written noise model (declared as the op's ``noise=``): HF's rounding in the model dtype,
tighter than the derived model for an output that is a small difference of two large products."""

from __future__ import annotations

from collections.abc import Callable

import torch

from oracle.declare.spec import rounding_error, wide


def _rope_noise(tensor: str, backward: bool) -> Callable[[dict, dict], torch.Tensor]:
    """HF rotates in the model dtype d: the table rows are rounded to d, each of the two products
    x c and rotate_half(x) s is rounded to d, then their sum (the final rounding, ulp(t)). So the
    noise is 2 u_d at the scale of the two products, which is what lets an output that is a small
    difference of two large products differ from the truth by their rounding. Backward is the same
    rotation with -sin applied to the incoming gradient."""
    def noise(args: dict, upstream: dict) -> torch.Tensor:
        Q = args["Q"]
        c, s = _rows(Q, args["cos"], args["sin"], args["position_ids"])
        c, s = wide(c).unsqueeze(1), wide(s).unsqueeze(1)
        d = Q.dtype
        x = wide(upstream[tensor] if backward else args[tensor])
        rotated = _swapped(x)  # rotate_half (forward) and its transpose (backward), up to sign: only |.| is used
        if backward:
            s = _swapped(s)  # the sin each of those elements was scaled by
        table = x.abs() * rounding_error(c.abs(), d) + rotated.abs() * rounding_error(s.abs(), d)
        return table + rounding_error((x * c).abs(), d) + rounding_error((rotated * s).abs(), d)

    return noise


def _rows(Q, cos, sin, position_ids):
    """Each token's table rows in Q's dtype, as HF rounds them (rope.table_rows)."""
    if position_ids is None:
        position_ids = torch.arange(Q.shape[2], device=Q.device).expand(Q.shape[0], -1)
    return cos[position_ids].to(Q.dtype), sin[position_ids].to(Q.dtype)


def _swapped(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((x[..., half:], x[..., :half]), -1)


# Per compared tensor: the noise of HF's evaluation (forward on the inputs, backward on the gradients).
NOISE = {"Q_out": _rope_noise("Q", False), "K_out": _rope_noise("K", False),
         "dQ": _rope_noise("Q_out", True), "dK": _rope_noise("K_out", True)}
