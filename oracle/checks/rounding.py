"""HF's rounding steps, nudged: the evaluations the weaker exactness contract compares with
(docs/design.md §3, exactness; the judgement is in oracle/checks/exact.py).

Note [HF's rounding steps, given float32 values within K ULPs]
    A kernel that follows HF's cast order rounds to the 16-bit dtype where HF rounds, from float32
    values that are HF's up to what the kernel may legitimately compute otherwise: a reduction in
    another order, a library's exp or erf. So its bits are HF's except where that float32 value lies
    within a few float32 ULPs of a 16-bit rounding boundary. The contract: HF's maths re-evaluated
    twice on the same inputs under ``Nudged``, which at every rounding to a 16-bit dtype first moves
    the float32 value by -K and by +K float32 ULPs (``ROUNDING_ULPS``). An element keeps it where the
    implementation's value lies between the lowest and the highest of HF's, the down and the up
    evaluations' (one of their bits, where they differ by an ULP of the 16-bit dtype). A 16-bit ULP
    is 2^13 (float16) or 2^16 (bfloat16) float32 ULPs, so K = 32 lets through only the elements
    within 0.4% (float16) or 0.05% (bfloat16) of an ULP of a boundary: a cast-order change (a
    product rounded once where HF rounds twice) moves about a quarter of the elements by a whole
    ULP, and fails.

    The rounding steps ``Nudged`` moves:

    - casts into a 16-bit dtype from float32 or float64 (``_to_copy``, ``copy_``, ``index_put_``);
    - library functions (``LIBRARY``: exp, erf, tanh, silu, gelu, rsqrt, ...), reductions and
      products of matrices whose output is 16-bit: torch computes them in float32 and rounds, so
      they are evaluated in float32 explicitly, nudged, then rounded. Each moves by K ULPs of the
      size of the terms its float32 value is computed from, not of the value itself: GeLU for a
      negative x is x/2 (1 + erf(x/sqrt2)), a small difference of terms of size |x|/2, and an erf
      one ULP off moves it by an ULP of |x|/2, thousands of ULPs of the result (measured: the
      kernels' GeLU on a CPU differs from torch's by millions of ULPs of the value near 0, and by
      at most 8 ULPs of |x|/2). A sum's terms are its inputs' magnitudes.

    Arithmetic on 16-bit values (``w * h``, ``x * cos + rotate_half(x) * sin``) is not moved: IEEE
    rounds its float32 value correctly, so a kernel that keeps HF's order computes the same one.
    The nudges of one evaluation all go one way; a chain through a decreasing function may bring
    two of them to cancel, so K is chosen well above the distances measured (``ROUNDING_ULPS``).
    A reference that computes an ill-conditioned function in float32 and casts afterwards is moved
    at the cast, by K ULPs of the value: only a function torch evaluates on the 16-bit tensor
    itself is moved by the size of its terms.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

aten = torch.ops.aten

# K of Note [HF's rounding steps, given float32 values within K ULPs]: four times the largest distance
# measured between the kernels' float32 values before a 16-bit rounding and torch's on the same
# inputs (CPU, 10 seeds of every stratified 16-bit case, scripts/rounding_distance.py): RMSNorm 4
# (its sum of squares in another order), SwiGLU 4 (exp), GeGLU 8 ULPs of |x|/2 (erf and tanh). The
# smallest K every case keeps the contract under was 4 (GeGLU, float16). On a GPU, measure again.
ROUNDING_ULPS = 32

SIXTEEN_BIT = (torch.float16, torch.bfloat16)
WIDE = (torch.float32, torch.float64)


def nudged(values: torch.Tensor, steps: int, size: torch.Tensor | None = None) -> torch.Tensor:
    """``values`` (float32 or float64) moved by ``steps`` float32 ULPs of ``size`` (default: the
    values themselves), in their dtype; non-finite values stay. The ULP of a size is 2^(e - 24) for
    a size in [2^(e-1), 2^e), and float32's smallest subnormal below the normal range (and at 0)."""
    wide = values.detach().double()
    size = (values if size is None else size).detach().double().abs()
    exponent = torch.frexp(size).exponent.double()
    ulp = torch.where(size > 0, torch.exp2((exponent - 24).clamp(min=-149)), 2.0 ** -149)
    moved = (wide + steps * ulp).to(values.dtype)
    return torch.where(torch.isfinite(values), moved, values)


def _abs(value):
    return value.abs() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def _result_size(args, kwargs, out):
    return out


def _same_op_on_magnitudes(func):
    """A sum's or a product's terms: the op applied to its inputs' magnitudes."""
    return lambda args, kwargs, out: func(*tree_map(_abs, args), **tree_map(_abs, kwargs)).abs()


def _gelu_size(args, kwargs, out):
    """x/2 (1 + erf(x/sqrt2)) (or the tanh form): terms of size |x|/2."""
    return torch.maximum(out.abs(), args[0].abs() / 2)


def _silu_slope_size(args, kwargs, out):
    """silu_backward: g s (1 + x (1 - s)), whose terms are g s and g s x (1 - s)."""
    grad, x = args[0], args[1]
    s = torch.sigmoid(x)
    return grad.abs() * s * (1 + x.abs() * (1 - s))


def _gelu_slope_size(args, kwargs, out):
    """gelu_backward: g (Phi(x) + x phi(x)) (or the tanh form), terms of size |g| (1 + |x|)."""
    return torch.maximum(out.abs(), args[0].abs() * (1 + args[1].abs()))


# Functions whose float32 value a library computes to within a few ULPs of itself: moved by K ULPs of it.
_ACCURATE_TO_ITSELF = (
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sigmoid", "silu", "tanh", "erf", "erfc", "erfinv",
    "rsqrt", "sqrt", "reciprocal", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh",
    "atanh", "softplus", "mish", "elu", "selu", "celu", "logit", "pow", "sigmoid_backward", "tanh_backward",
    "_softmax", "_log_softmax", "logsumexp", "var", "std", "linalg_vector_norm", "norm")
# Sums and products of matrices, whose order is the implementation's: moved by K ULPs of their terms.
_SUMS = ("sum", "mean", "cumsum", "mm", "bmm", "addmm", "baddbmm", "mv", "addmv", "dot")


def _library() -> dict:
    """Overload packet -> how large the terms of its float32 value are (out-of-place ops; an
    in-place one is evaluated through its out-of-place twin)."""
    table = dict.fromkeys(_ACCURATE_TO_ITSELF, _result_size)
    table.update({name: _same_op_on_magnitudes(getattr(aten, name)) for name in _SUMS})
    table.update(gelu=_gelu_size, gelu_backward=_gelu_slope_size, silu_backward=_silu_slope_size)
    return {getattr(aten, name): size for name, size in table.items() if hasattr(aten, name)}


# The library functions, reductions and products Note [HF's rounding steps, ...] nudges.
LIBRARY = _library()


def _upcast(value):
    return value.float() if isinstance(value, torch.Tensor) and value.dtype in SIXTEEN_BIT else value


def _is_sixteen_bit(value) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype in SIXTEEN_BIT


def _is_wide(value) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype in WIDE


class Nudged(TorchDispatchMode):
    """Every rounding to a 16-bit dtype of what runs under it moved first by ``steps`` float32 ULPs
    (Note [HF's rounding steps, given float32 values within K ULPs]); with ``steps`` 0, torch's own
    rounding steps, library functions evaluated in float32 explicitly."""

    def __init__(self, steps: int):
        super().__init__()
        self.steps = steps

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        cast = self._nudged_cast(func, args, kwargs)
        if cast is not None:
            return func(*cast, **kwargs)
        packet = func.overloadpacket
        name = packet.__name__
        twin = getattr(aten, name[:-1], None) if name.endswith("_") else None
        if packet in LIBRARY or twin in LIBRARY:
            return self._library(func, twin, args, kwargs)
        return func(*args, **kwargs)

    def _nudged_cast(self, func, args, kwargs) -> tuple | None:
        """A cast's arguments with its wide source moved, or None where func is no such cast."""
        if func is aten._to_copy.default and kwargs.get("dtype") in SIXTEEN_BIT and _is_wide(args[0]):
            return (nudged(args[0], self.steps), *args[1:])
        if func in (aten.copy_.default, aten.copy.default) and _is_sixteen_bit(args[0]) and _is_wide(args[1]):
            return (args[0], nudged(args[1], self.steps), *args[2:])
        if func in (aten.index_put_.default, aten.index_put.default) and _is_sixteen_bit(args[0]) and \
                _is_wide(args[2]):
            return (*args[:2], nudged(args[2], self.steps), *args[3:])
        return None

    def _library(self, func, twin, args, kwargs):
        """func in float32, each 16-bit output moved by ``steps`` ULPs of its terms, then rounded; an
        in-place func (``twin``: its out-of-place packet) writes that into its first argument."""
        if twin is not None:
            if not _is_sixteen_bit(args[0]):
                return func(*args, **kwargs)
            return args[0].copy_(self._evaluated(twin, twin, args, kwargs))
        if func._schema.is_mutable:  # an out= overload: left as torch computes it
            return func(*args, **kwargs)
        return self._evaluated(func, func.overloadpacket, args, kwargs)

    def _evaluated(self, compute, packet, args, kwargs):
        out = compute(*args, **kwargs)
        outs, spec = tree_flatten(out)
        if not any(_is_sixteen_bit(t) for t in outs):
            return out
        wide_args, wide_kwargs = tree_map(_upcast, args), tree_map(_upcast, kwargs)
        wides, _ = tree_flatten(compute(*wide_args, **wide_kwargs))
        size = LIBRARY[packet]
        return tree_unflatten([self._rounded(o, w, size, wide_args, wide_kwargs) for o, w in zip(outs, wides)], spec)

    def _rounded(self, original, wide, size, args, kwargs):
        if not _is_sixteen_bit(original) or not _is_wide(wide):
            return original  # not a 16-bit output, or one whose float32 value torch does not give
        return nudged(wide, self.steps, size(args, kwargs, wide)).to(original.dtype)


def rounds_to_sixteen_bit(*tensors) -> bool:
    """Whether a case rounds to a 16-bit dtype at all: some of its floating tensors are 16-bit.
    Where none is, there is nothing to nudge, and its float32 values are what the contract lets
    differ (docs/design.md §3)."""
    return any(_is_sixteen_bit(t) for t in tensors)
