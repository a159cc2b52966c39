"""Roundings: the one place the harness defines a dtype's spacing (its ULP) at a value, its unit
roundoff and the dtype sums accumulate in, used by the verdict (oracle/verdict/), the hand-written
noise models (oracle/declare/spec.py re-exports ``unit_roundoff``, ``rounding_error`` and ``compute_dtype``
for oracle/ops/) and the derived model; and, for the derived model, the variance of rounding to
nearest and the variance a long sum accumulates (Note [Accumulation]).

The tensor functions work on float64 tensors holding exact values (oracle/noise/shadow.py): the
value an operation would round, not a value already rounded.
"""

from __future__ import annotations

import math

import torch

# --- spacings and unit roundoff: the definitions every other module imports ----------------------


def unit_roundoff(dtype: torch.dtype) -> float:
    """u: the largest relative error of rounding to ``dtype``, half its spacing at 1 (half its epsilon)."""
    return torch.finfo(dtype).eps / 2


def accumulator(dtype: torch.dtype) -> torch.dtype:
    """The dtype torch accumulates sums of ``dtype`` in (its opmath type), which is also what HF
    upcasts to: float32 below float64, float64 for float64."""
    return torch.promote_types(dtype, torch.float32)


compute_dtype = accumulator  # the name the hand-written noise models use (oracle/declare/spec.py)


def ulp_of(value: float, dtype: torch.dtype) -> float:
    """Spacing of ``dtype`` at |value| (its ULP there), for one number; infinite for a non-finite one."""
    info = torch.finfo(dtype)
    value = abs(value)
    if not math.isfinite(value):
        return math.inf
    if value < info.tiny:
        return info.smallest_normal * info.eps  # subnormal spacing
    return info.eps * 2.0 ** math.floor(math.log2(value))


def spacing(value: torch.Tensor, dtype: torch.dtype, saturate: bool = True) -> torch.Tensor:
    """The spacing of ``dtype`` at each |value| (float64); the subnormal spacing below its normals.
    ``saturate``: beyond the dtype's largest number, the spacing there (what rounding to the dtype
    can lose before it overflows); without it, the spacing the exponent would have (the verdict's
    scale of an element whose truth lies past the dtype's range)."""
    info = torch.finfo(dtype)
    magnitude = value.abs().to(torch.float64).clamp(min=info.smallest_normal, max=info.max if saturate else None)
    _, exponent = torch.frexp(magnitude)  # magnitude = m 2^exponent, m in [0.5, 1)
    return info.eps * torch.exp2((exponent - 1).to(torch.float64))


def rounding_error(magnitude: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The most that rounding values of this magnitude to ``dtype`` can lose: u |v| while they are
    normal numbers, and half the subnormal spacing where they underflow."""
    info = torch.finfo(dtype)
    return unit_roundoff(dtype) * magnitude + info.smallest_normal * info.eps / 2


# --- the derived model's roundings -------------------------------------------------------------

# The variance of rounding to nearest at a value whose spacing is ``ulp``: an error spread evenly
# over (-ulp/2, ulp/2).
NEAREST_VARIANCE = 1 / 12

# Note [Accumulation]
#     A sum of n terms in an accumulator of unit roundoff u rounds each partial sum s_k (k = 2..n).
#     Rounding to nearest at s_k has variance ulp(s_k)^2 / 12, and ulp(s) = 2u 2^-f |s| for the
#     fraction f of log2|s|; taken evenly over f (mantissas spread over their binade),
#     E[4^-f] = (1 - 1/4) / ln 4, so one rounding of a partial sum of size s has variance
#     PARTIAL_SUM_VARIANCE * u^2 s^2.
#
#     Which partial sums occur depends on the order, and any order is valid; so the model takes the
#     expectation over orders of the same terms. For n terms of mean m and variance v (those of one
#     output element), the first k of a random order have E[s_k^2] = k^2 m^2 + v k (n - k) / (n - 1)
#     (a sample without replacement: the partial sums are a bridge that ends at the sum), so
#
#         Var(accumulation) = PARTIAL_SUM_VARIANCE u^2 sum_{k=2..n} (k^2 m^2 + v k (n - k) / (n - 1))
#
#     It grows like n^3 m^2 for terms of one sign (a sum of squares) and like n^2 v for terms of
#     mixed signs: a standard deviation of about sqrt(n/3) u |sum| or sqrt(n/6) u sqrt(sum of
#     squares), the probabilistic bound of Higham and Mary (2019) rather than the worst case
#     n u sum|terms|. tests/test_noise.py checks it against real float32 sums in random orders.
#     m and v come from the sum S and the sum of squares Q of the terms: m = S / n, v = Q / n - m^2.
#
#     A sum is not the only valid way to accumulate: Welford's streaming mean and variance (torch's
#     CUDA LayerNorm, Inductor's reductions) update a running mean per term with a subtraction, a
#     product by 1/k and an addition, each rounded. So each accumulation step is granted
#     STEP_ROUNDINGS roundings (measured on LayerNorm rows of 7 columns, tests/test_noise.py: a
#     Welford loop 1.7 times a two-pass sum's largest element error, Inductor's vectorised masked
#     Welford 3.7 times).
STEP_ROUNDINGS = 3
PARTIAL_SUM_VARIANCE = (1 - 1 / 4) / math.log(4) * 4 * NEAREST_VARIANCE * STEP_ROUNDINGS


# Note [Elementary functions]
#     +, - and * round correctly (IEEE 754): error within half a spacing, NEAREST_VARIANCE.
#     Elementary functions do not: the libraries kernels use are accurate to a few ulps. The model
#     grants each the maximum error of CUDA's single-precision library (the CUDA C Programming Guide's
#     table of maximum ulp errors; torch's CPU kernels are within it: tests/test_noise.py measures
#     them), as an error spread evenly over that many spacings either side: variance (b ulp)^2 / 3.
#     Division and square roots are granted what Triton compiles them to, float32 division to
#     div.full (2 ulps) and tl.sqrt to sqrt.approx (1 ulp): every Triton kernel divides that way.
#     erf and tanh, bounded by 1, are also granted an absolute error: torch's own CPU GeLU kernels
#     evaluate 1 + erf(x / sqrt 2) to 12 u and 1 + tanh(...) to 4.3 u (u = unit roundoff, measured
#     on every CPU capability), whatever the size of erf or tanh itself.
#     sigmoid is decomposed as 1 / (1 + exp(-x)), as kernels evaluate it, so it inherits exp's error.
FUNCTION_ULPS = {
    "exp": 2, "exp2": 2, "expm1": 1, "log": 1, "log2": 1, "log1p": 1, "sin": 2, "cos": 2, "tanh": 2,
    "erf": 2, "rsqrt": 2, "pow": 4, "div": 2, "reciprocal": 2, "sqrt": 1,
}
FUNCTION_ABSOLUTE_U = {"erf": 12, "tanh": 4.5}  # absolute error, in units of the compute dtype's u


def function_variance(value: torch.Tensor, dtype: torch.dtype, ulps: float, absolute_u: float = 0.0) -> torch.Tensor:
    """The variance of an elementary function accurate to ``ulps`` spacings of ``dtype`` at
    ``value`` or ``absolute_u`` units of its roundoff, whichever is larger."""
    if dtype == torch.float64:
        return torch.zeros_like(value)
    gap = _masked_spacing(value, dtype)  # non-finite values are masked below
    error = torch.maximum(ulps * gap, torch.full_like(value, absolute_u * unit_roundoff(dtype)))
    return torch.where(torch.isfinite(value), error, 0.0).square() / 3


# Note [Fast maths]
#     Triton's own tl.exp(x) is faster and less exact than CUDA's library: it is the hardware's
#     exp2 of x * log2(e), that product first rounded to float32, so exp carries the rounding of an
#     intermediate as large as |x| (at x = -80, about 45 ulps of the result); tl.sigmoid, as
#     1 / (1 + exp(-x)), inherits it. That is standard practice (Liger's and Unsloth's kernels
#     compute so), not a bug: by default the verdict grants it (the ``fast`` variance a shadow
#     carries), and an implementation that declares EXACT_MATHS (it calls libdevice's expf) is held
#     to the library's accuracy alone.


def fast_exp_variance(y: torch.Tensor, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Note [Fast maths]: exp(x) as exp2(fl(x log2 e)): the product's rounding to nearest in
    ``dtype``, through d exp2(t) / dt = y ln 2."""
    t = x * (1 / math.log(2))
    gap = _masked_spacing(t, dtype)  # where t is NaN so is y, masked
    return torch.where(torch.isfinite(y), (y * math.log(2) * gap).square() * NEAREST_VARIANCE, 0.0)


def to_nearest(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``value`` rounded to nearest in ``dtype``, back in float64."""
    return value.to(dtype).to(torch.float64)


def representable(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Where ``value`` is exactly a ``dtype`` number (no rounding happens there), or not finite."""
    return (to_nearest(value, dtype) == value) | ~torch.isfinite(value)


def rounding_variance(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The variance of rounding ``value`` to nearest in ``dtype``: 0 where it is representable.

    Bit for bit ``where(representable(value, dtype), 0, spacing(value, dtype)^2 NEAREST_VARIANCE)``,
    in fewer passes: not representable is ``to_nearest(v) != v`` where v is not NaN (an infinity
    rounds to itself; a finite value past the dtype's range rounds to an infinity), and where it is
    not, |v| is a finite number inside the dtype's normal range once clamped, so its spacing is
    eps times |v| with its mantissa cleared (``_spacing_of_finite``), exactly frexp's."""
    if dtype == torch.float64 or value.dtype != torch.float64:
        return _rounding_variance(value, dtype)
    rounds = (to_nearest(value, dtype) != value) & (value == value)
    return torch.where(rounds, _spacing_of_finite(value, dtype).square() * NEAREST_VARIANCE, 0.0)


def _rounding_variance(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.float64:
        return torch.zeros_like(value)
    return torch.where(representable(value, dtype), 0.0, spacing(value, dtype).square() * NEAREST_VARIANCE)


_EXPONENT_BITS = 0x7FF0000000000000


def _spacing_of_finite(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``spacing(value, dtype)`` wherever ``value`` (float64) is not NaN; anything at a NaN (the
    caller masks it). |v| clamped to the dtype's normal range is a normal float64, and its spacing
    in the dtype is eps 2^floor(log2 |v|): the float64 of |v|'s exponent bits alone, times eps."""
    info = torch.finfo(dtype)
    magnitude = value.abs().clamp_(min=info.smallest_normal, max=info.max)
    power = magnitude.view(torch.int64).bitwise_and_(_EXPONENT_BITS).view(torch.float64)
    return power.mul_(info.eps)


def _masked_spacing(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``spacing(value, dtype)`` for a caller that masks every non-finite place of its result: in
    float64 the spacing may then be the exponent bits' (``_spacing_of_finite``), which is cheaper."""
    return _spacing_of_finite(value, dtype) if value.dtype == torch.float64 else spacing(value, dtype)


def rounding_sample(value: torch.Tensor, dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """One random rounding with the variance of rounding to nearest: ``value`` plus an error drawn
    evenly from half a spacing on either side, where ``value`` is not representable."""
    if dtype == torch.float64:
        return value
    noise = (torch.rand(value.shape, generator=generator, dtype=torch.float64).to(value.device) - 0.5)
    return torch.where(representable(value, dtype), value, value + noise * spacing(value, dtype))


def accumulation_variance(total: torch.Tensor, squares: torch.Tensor, terms: torch.Tensor | float,
                          dtype: torch.dtype) -> torch.Tensor:
    """Note [Accumulation]: the variance of summing ``terms`` terms (per element) whose sum is
    ``total`` and sum of squares ``squares``, in the accumulator of ``dtype``."""
    acc = accumulator(dtype)
    if acc == torch.float64:
        return torch.zeros_like(total)
    n = torch.as_tensor(terms, dtype=torch.float64, device=total.device)
    mean = total / n.clamp(min=1)
    spread = (squares / n.clamp(min=1) - mean.square()).clamp(min=0)
    # sums over k = 2..n of k^2 and of k (n - k) / (n - 1)
    k2 = n * (n + 1) * (2 * n + 1) / 6 - 1
    bridge = (n * (n * (n + 1) / 2 - 1) - k2) / (n - 1).clamp(min=1)
    variance = PARTIAL_SUM_VARIANCE * unit_roundoff(acc) ** 2 * (mean.square() * k2 + spread * bridge)
    return torch.where(n > 1, variance, 0.0)
