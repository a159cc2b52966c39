"""SwiGLU's hand-written noise model: the error analysis of HF's evaluation, per compared tensor, for
the autograd op and its raw LoRA-MLP backward. oracle/ops/swiglu.py declares it as each Op's ``noise``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from oracle.declare.spec import compute_dtype, rounding_error, unit_roundoff, wide


class _SwigluParts:
    """SwiGLU's float64 intermediates and unit roundoffs, shared by its noise models.

    Error analysis of HF's evaluation (F.silu(e) * g and its autograd): silu is evaluated in the
    compute dtype (exp, a division: a few u_c) and rounded to the model dtype d (u_d); the product
    with g is the final rounding. Autograd forms dh * g in d (u_d), then silu's derivative
    s (1 + e (1 - s)) in the compute dtype (a few u_c more) and rounds the product.
    """

    def __init__(self, args: dict, upstream: dict, incoming: str):
        e = wide(args["e"])
        self.g = wide(args["g"])
        self.dtype = args["e"].dtype
        compute = compute_dtype(self.dtype)
        self.u_c = unit_roundoff(compute)
        # exp(-e) overflows the compute dtype below e ~ -88 (fp32): sigmoid flushes to 0, losing up to
        # the compute dtype's smallest normal number, times |e| in silu and its slope.
        self.flushed = torch.finfo(compute).smallest_normal * (1 + e.abs())
        self.sig = torch.sigmoid(e)
        self.f = e * self.sig
        self.silu_slope = self.sig * (1 + e.abs() * (1 - self.sig))  # |terms| of silu'(e)
        # 1 - s is formed from the rounded s: an absolute error of u_c, times |e| s in the slope
        self.slope_noise = self.u_c * (8 * self.silu_slope + 2 * e.abs() * self.sig)
        # the incoming gradient: upstream's for the autograd op, the DW argument for the raw backward
        incoming = upstream.get(incoming, args.get(incoming))
        self.dh = wide(incoming) if incoming is not None else None


def _swiglu_noise(tensor: str, incoming: str = "h") -> Callable[[dict, dict], torch.Tensor]:
    """h = f g and the gradient of g, dh f: f rounded to d after a few u_c. The gradient of e,
    dh g silu'(e): dh g rounded to d, the slope's terms in the compute dtype."""
    def noise(args: dict, upstream: dict) -> torch.Tensor:
        p = _SwigluParts(args, upstream, incoming)
        if tensor in ("h", "dg"):
            other = p.g if tensor == "h" else p.dh
            f_err = rounding_error(p.f.abs(), p.dtype) + 4 * p.u_c * p.f.abs() + p.flushed
            return other.abs() * f_err
        dh_g = (p.dh * p.g).abs()
        return rounding_error(dh_g, p.dtype) * p.silu_slope + (p.slope_noise + p.flushed) * dh_g

    return noise


SWIGLU_NOISE = {"h": _swiglu_noise("h"), "de": _swiglu_noise("de"), "dg": _swiglu_noise("dg")}
# The raw backward's df is the gradient of g and de of e, for the incoming gradient DW.
RAW_BACKWARD_NOISE = {"h": _swiglu_noise("h", "DW"), "df": _swiglu_noise("dg", "DW"), "de": _swiglu_noise("de", "DW")}
