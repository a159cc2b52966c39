"""GeGLU's hand-written noise model: the error analysis of HF's evaluation, per compared tensor, for
the autograd op and its raw LoRA-MLP kernels. oracle/ops/geglu.py declares it as each Op's ``noise``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from oracle.declare.spec import compute_dtype, rounding_error, unit_roundoff, wide

# the tanh approximation's constants: GeLU(x) ~ 0.5 x (1 + tanh(BETA (x + KAPPA x^3)))
BETA = math.sqrt(2 / math.pi)
KAPPA = 0.044715


class _GegluParts:
    """GeGLU's float64 intermediates, shared by its noise models.

    Error analysis of HF's evaluation (torch's gelu and its backward, in the compute dtype):
    f = 0.5 e (1 + s), s = tanh(u) or erf(e / sqrt 2): 1 + s cancels where e is very negative, so f's
    error is a few u_c at the scale of its terms, 0.5 |e| (1 + |s|), not of f; then f is rounded to
    the model dtype d and multiplied by g. The slope f'(e) = 0.5 (1 + s) + e s'(e) / 2 is a sum of
    terms formed in the compute dtype (1 - s^2 cancels for the tanh form), and autograd rounds
    dh * g to d before multiplying by it.
    """

    def __init__(self, args: dict, upstream: dict, incoming: str, approximate: str):
        e = wide(args["e"])
        self.g = wide(args["g"])
        self.dtype = args["e"].dtype
        self.u_c = unit_roundoff(compute_dtype(self.dtype))
        if approximate == "tanh":
            inner = BETA * (e + KAPPA * e ** 3)
            s = torch.tanh(inner)
            # |terms| of the slope: 0.5 (1 + s), and 0.5 e (1 - s^2) beta (1 + 3 kappa e^2), whose 1 - s^2
            # is formed from a rounded s
            chain = 0.5 * e.abs() * BETA * (1 + 3 * KAPPA * e * e)
            self.slope_terms = 0.5 * (1 + s.abs()) + chain * ((1 - s * s).abs() + 2 * self.u_c)
        else:
            s = torch.erf(e / math.sqrt(2))
            pdf = torch.exp(-0.5 * e * e) / math.sqrt(2 * math.pi)
            self.slope_terms = 0.5 * (1 + s.abs()) + e.abs() * pdf
        self.f = 0.5 * e * (1 + s)
        self.f_terms = 0.5 * e.abs() * (1 + s.abs())
        incoming = upstream.get(incoming, args.get(incoming))
        self.dh = wide(incoming) if incoming is not None else None


def _geglu_noise(tensor: str, approximate: str | None, incoming: str = "h") -> Callable[[dict, dict], torch.Tensor]:
    """h = f g and g's gradient dh f: f formed to a few u_c of its terms, then rounded to d. e's
    gradient (dh g rounded to d) f'(e): the slope's terms to a few u_c. ``approximate`` None: the
    case's own (the autograd op's variant, passed as an argument)."""
    def noise(args: dict, upstream: dict) -> torch.Tensor:
        p = _GegluParts(args, upstream, incoming, approximate or args.get("approximate", "tanh"))
        if tensor in ("h", "dg"):
            other = p.g if tensor == "h" else p.dh
            return other.abs() * (rounding_error(p.f.abs(), p.dtype) + 6 * p.u_c * p.f_terms)
        dh_g = (p.dh * p.g).abs()
        return rounding_error(dh_g, p.dtype) * p.slope_terms + 8 * p.u_c * p.slope_terms * dh_g

    return noise


def noise_model(approximate: str | None) -> dict:
    return {"h": _geglu_noise("h", approximate), "de": _geglu_noise("de", approximate),
            "dg": _geglu_noise("dg", approximate)}


def raw_backward_noise(approximate: str) -> dict:
    # the raw backward's df is g's gradient and de is e's, for the incoming gradient DW
    return {"h": _geglu_noise("h", approximate, "DW"), "df": _geglu_noise("dg", approximate, "DW"),
            "de": _geglu_noise("de", approximate, "DW")}
