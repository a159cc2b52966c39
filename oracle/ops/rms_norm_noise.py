"""RMSNorm's hand-written noise model: the error analysis of HF's evaluation, per compared tensor.

The derived model (oracle/noise) judges RMSNorm by default; this one judges under ``--noise-model
declared``, and the tests that compare the two (tests/test_noise.py, tests/test_gate.py) need an op
that has one. oracle/ops/rms_norm.py declares it as the Op's ``noise``, ``order_noise`` and ``summed``.
"""

from __future__ import annotations

import math

import torch

from oracle.cases.scale import chunks
from oracle.declare.spec import compute_dtype, rounding_error, unit_roundoff, wide


def _rms_norm_dW_terms(args: dict, upstream: dict) -> tuple[torch.Tensor, int]:
    """dW_j = sum over rows of dY_rj * normed_rj: sum of |terms| per column, and the row count."""
    _, total, rows = _rms_norm_dW_sums(args, upstream)
    return total, rows


def _rms_norm_dX_terms(args: dict, upstream: dict) -> tuple[torch.Tensor, int]:
    """dX = r*g - normed*r*mean(g*normed): a difference of two terms (each a product of rounded
    factors). With one or two columns they nearly cancel, so dX's noise sits at the terms' scale;
    rsqrt's last-bit error on a GPU is enough to move it."""
    p = _RmsNormParts(args, upstream)
    _, first, second = _rms_norm_dX_magnitudes(p)
    return (first + second).reshape(-1, p.n), 3


class _RmsNormParts:
    """RMSNorm's float64 intermediates and unit roundoffs, shared by its noise models.

    Error analysis of HF's evaluation (reference.llama_rms_norm / gemma_rms_norm and their autograd):
    - 1/rms: a sum of n squares in the compute dtype (relative error ~ sqrt(n) u_c typically, n u_c at
      worst) and an rsqrt (correctly rounded on the CPU, ~2 ULPs on a GPU's approximate rsqrt):
      ``rho = u_c * (2 sqrt(n) + 4)`` relative, shared by every element of the row.
    - Llama rounds normed to X's dtype before scaling by W (u_x), and its autograd forms
      g = dY * W in X's dtype (u_x again); Gemma keeps both in the compute dtype (u_c).
    - Of rho, the part another valid order of the sum of squares moves: a sequential sum of n
      positive terms is off by ~sqrt(n/3) u_c relative, and the square root halves it:
      ``rho_order = u_c sqrt(n) / 2`` (the order noise of the distribution judgement).
    """

    def __init__(self, args: dict, upstream: dict):
        X, W = args["X"], args["W"]
        self._constants(X, args)
        x, w = wide(X), wide(W)
        self.r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + args["eps"])
        self.normed = x * self.r
        self.scale = 1.0 + w if self.gemma else w
        self.dy = wide(upstream["Y"]) if "Y" in upstream else None
        self.x_dtype, self.y_dtype = X.dtype, torch.promote_types(X.dtype, W.dtype)

    def _constants(self, X: torch.Tensor, args: dict) -> None:
        self.gemma = bool(args["gemma"])
        self.n = X.shape[-1]
        self.u_x, self.u_c = unit_roundoff(X.dtype), unit_roundoff(compute_dtype(X.dtype))
        self.rho = self.u_c * (2 * math.sqrt(self.n) + 4)
        self.rho_order = self.u_c * math.sqrt(self.n) / 2

    @classmethod
    def of_shape(cls, args: dict) -> _RmsNormParts:
        """Only what depends on X's width and dtype (rho, u_c), without touching its values."""
        parts = cls.__new__(cls)
        parts._constants(args["X"], args)
        return parts


def _rms_norm_noise_Y(args: dict, upstream: dict) -> torch.Tensor:
    """|Y| times 1/rms's relative error and the product's rounding in the compute dtype, plus
    (Llama) normed rounded to X's dtype before it is scaled by W."""
    p = _RmsNormParts(args, upstream)
    noise = (p.rho + p.u_c) * (p.normed * p.scale).abs()
    return noise if p.gemma else noise + rounding_error(p.normed.abs(), p.x_dtype) * p.scale.abs()


def _rms_norm_order_Y(args: dict, upstream: dict) -> torch.Tensor:
    p = _RmsNormParts(args, upstream)
    return p.rho_order * (p.normed * p.scale).abs()


def _rms_norm_dX_magnitudes(p: _RmsNormParts) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """g = dY * W, and the magnitudes of dX's two terms r g and normed r mean(g normed)."""
    g = p.dy * p.scale
    return g, (p.r * g).abs(), p.normed.abs() * p.r * (g * p.normed).abs().mean(-1, keepdim=True)


def _rms_norm_noise_dX(args: dict, upstream: dict) -> torch.Tensor:
    """dX = r g - normed r mean(g normed), g = dY * W: both terms' magnitudes times 1/rms's relative
    error and the row mean's summation noise (sqrt(n) u_c), plus (Llama) g's rounding to X's dtype
    carried through both terms. Under cancellation (one or two columns) the terms' scale, not dX's,
    is the room."""
    p = _RmsNormParts(args, upstream)
    g, first, second = _rms_norm_dX_magnitudes(p)
    noise = (p.rho + p.u_c * (math.sqrt(p.n) + 2)) * (first + second)
    if p.gemma:
        return noise
    g_err = rounding_error(g.abs(), p.x_dtype)
    return noise + p.r * g_err + p.normed.abs() * p.r * (g_err * p.normed.abs()).mean(-1, keepdim=True)


def _rms_norm_order_dX(args: dict, upstream: dict) -> torch.Tensor:
    """1/rms's order noise in both terms, and the row mean's (sqrt(n) u_c) in the second."""
    p = _RmsNormParts(args, upstream)
    _, first, second = _rms_norm_dX_magnitudes(p)
    return p.rho_order * (first + second) + p.u_c * math.sqrt(p.n) * second


def _rms_norm_dW_sums(args: dict, upstream: dict) -> tuple[torch.Tensor, torch.Tensor, int]:
    """dW_j = sum over rows of dY * normed. Per column, the sum over rows of each term's rounding
    (Llama: normed to X's dtype, then the product in Y's dtype; Gemma: the product in the compute
    dtype) and of the |terms|; and the row count. Chunk by chunk of rows: a case at scale has 2^31
    elements, whose float64 intermediates would not fit (oracle/cases/scale.py)."""
    n = args["X"].shape[-1]
    X, dY = args["X"].reshape(-1, n), upstream["Y"].reshape(-1, n)
    rounding = total = torch.zeros(n, dtype=torch.float64, device=X.device)
    for index in chunks(X.shape[0], n):
        p = _RmsNormParts(args | {"X": X[index.to(X.device)]}, {"Y": dY[index.to(X.device)]})
        terms = (p.dy * p.normed).abs()
        if p.gemma:
            per_term = 2 * p.u_c * terms
        else:
            per_term = p.dy.abs() * rounding_error(p.normed.abs(), p.x_dtype) + rounding_error(terms, p.y_dtype)
        rounding, total = rounding + per_term.sum(0), total + terms.sum(0)
    return rounding, total, X.shape[0]


def _rms_norm_noise_dW(args: dict, upstream: dict) -> torch.Tensor:
    """dW_j = sum over rows of dY * normed: each term's rounding, 1/rms's relative error, and the
    sum's noise (2 sqrt(m) u_c for m rows in any order), summed over the rows."""
    p = _RmsNormParts.of_shape(args)
    rounding, total, rows = _rms_norm_dW_sums(args, upstream)
    return rounding + (p.rho + 2 * math.sqrt(rows) * p.u_c) * total


def _rms_norm_order_dW(args: dict, upstream: dict) -> torch.Tensor:
    """Each row's 1/rms order noise, and the column sum's own (sqrt(m) u_c)."""
    p = _RmsNormParts.of_shape(args)
    _, total, rows = _rms_norm_dW_sums(args, upstream)
    return (p.rho_order + math.sqrt(rows) * p.u_c) * total


# Per compared tensor: the noise of HF's evaluation, the part another order moves, and the sums.
NOISE = {"Y": _rms_norm_noise_Y, "dX": _rms_norm_noise_dX, "dW": _rms_norm_noise_dW}
ORDER_NOISE = {"Y": _rms_norm_order_Y, "dX": _rms_norm_order_dX, "dW": _rms_norm_order_dW}
SUMMED = {"dW": _rms_norm_dW_terms, "dX": _rms_norm_dX_terms}
