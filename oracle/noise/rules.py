"""How each aten op moves rounding error, for the shadow evaluation (oracle/noise/shadow.py).

Note [Propagation rules]
    First order: an op's output error is its inputs' errors through its local sensitivity, plus its
    own rounding. Errors of different inputs are taken as independent, so variances add:

    - views (``view``, ``transpose``, ``expand``, ...) apply themselves to the variances, which stay
      views of their inputs' (an in-place write through a view then reaches the base's variance);
    - sums (``sum``, ``mean``, ``cumsum``), products of matrices (``mm``, ``bmm``, ``addmm``, ``mv``,
      ``dot``, ...) and accumulating scatters (``index_put(accumulate=True)``, ``index_add``,
      ``scatter_add``) are linear or bilinear: the same op applied to the variances (and to the
      squares of the other factor) gives the propagated variance exactly, and Note [Accumulation]
      (rounding.py) adds what their accumulation rounds;
    - every other op (element-wise maths, indexing, concatenation, selection) is treated by finite
      differences: each input moved by one standard deviation of its error, both ways, and the mean
      square of the output's change taken (``finite_difference``). For an op whose output elements
      each depend on one element of each input, that is (∂f/∂x)^2 var(x) wherever f is smooth at
      the scale of the error, and the op's real spread where it is not (a kink, a clamp). Ops of
      other kinds reaching this rule are counted in the evaluation's ``generic``, so a derived
      model says where it had no exact rule.

    Ops that only move data round nothing; a cast rounds where it narrows; every other op rounds
    its exact result to its nominal dtype, unless that result is representable there.
"""

from __future__ import annotations

import functools
import math

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from oracle.noise import rounding as R

aten = torch.ops.aten
prims = torch.ops.prims

# Ops whose floating outputs are some of their inputs' elements (or constants): no rounding.
MOVES_DATA = {
    aten.clone.default, aten.copy.default, aten.index.Tensor, aten.index_select.default, aten.gather.default,
    aten.embedding.default, aten.cat.default, aten.stack.default, aten.flip.default, aten.roll.default,
    aten.repeat.default, aten.constant_pad_nd.default, aten.where.self, aten.masked_fill.Scalar,
    aten.masked_fill.Tensor, aten.masked_scatter.default, aten.scatter.src, aten.scatter.value,
    aten.slice_scatter.default, aten.select_scatter.default, aten.diagonal_scatter.default, aten.neg.default,
    aten.abs.default, aten.amax.default, aten.amin.default, aten.max.dim, aten.min.dim, aten.max.default,
    aten.min.default, aten.maximum.default, aten.minimum.default, aten.clamp.default, aten.clamp_min.default,
    aten.clamp_max.default, aten.relu.default, aten.threshold_backward.default, aten.sort.default,
    aten.topk.default, aten.triu.default, aten.tril.default, aten.zeros_like.default, aten.ones_like.default,
    aten.full_like.default, aten.empty_like.default, aten.new_zeros.default, aten.new_ones.default,
    aten.new_full.default, aten.new_empty.default, aten.new_empty_strided.default, aten.fill.Scalar,
    aten.fill_.Scalar, aten.zero_.default, aten.lift_fresh_copy.default, aten.expand_copy.default,
    aten.squeeze_copy.dim, aten.sign.default, aten.floor.default, aten.ceil.default, aten.round.default,
    aten.trunc.default,
}
# Casts: round where the target dtype is coarser than the source.
CASTS = {aten._to_copy.default, aten.copy_.default, prims.convert_element_type.default}


def is_view(func) -> bool:
    """Whether the op returns a view of an input (its schema says the output aliases it)."""
    try:
        return _is_view(func)
    except TypeError:  # not hashable: not remembered
        return _is_view.__wrapped__(func)


@functools.cache  # per op: the schema is read on every call the shadow evaluates
def _is_view(func) -> bool:
    schema = getattr(func, "_schema", None)
    return bool(schema and schema.returns and schema.returns[0].alias_info is not None
                and not schema.returns[0].alias_info.is_write)


def bind(func, args, kwargs) -> dict:
    """Arguments by their schema names, defaults filled in."""
    bound = {}
    for position, argument in enumerate(func._schema.arguments):
        if position < len(args) and not argument.kwarg_only:
            bound[argument.name] = args[position]
        elif argument.name in kwargs:
            bound[argument.name] = kwargs[argument.name]
        elif argument.has_default_value():
            bound[argument.name] = argument.default_value
    return bound


def written_leaves(func, call) -> list[int]:
    """Indices of the call's leaves that the op writes into (``self`` of ``add_``, ``out=``)."""
    schema = getattr(func, "_schema", None)
    if schema is None or not _writes(func):
        return []
    args, kwargs = tree_unflatten(call.leaves, call.spec)
    bound = bind(func, args, kwargs)
    targets = [bound.get(a.name) for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    return [i for i, leaf in enumerate(call.leaves) if any(leaf is t for t in targets if t is not None)]


@functools.cache
def _writes(func) -> bool:
    """Whether the op writes into any of its arguments (remembered per op)."""
    return any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)


# --- what the rules read of a call ---------------------------------------------------------------


def _as(call, kind: str):
    """The call's (args, kwargs) with each floating tensor replaced by its exact value, its square,
    its ``var`` or ``order`` (zeros for plain tensors, which are exact constants), or ones."""
    leaves = []
    for leaf, value in zip(call.leaves, call.values):
        is_float = isinstance(value, torch.Tensor) and value.is_floating_point()
        if not is_float:
            leaves.append(value)
        elif kind == "value":
            leaves.append(value)
        elif kind == "square":
            leaves.append(value * value)
        elif kind == "ones":
            leaves.append(torch.ones_like(value))
        else:
            stored = vars(leaf).get(kind) if isinstance(leaf, torch.Tensor) else None  # a plain tensor: none
            leaves.append(stored if stored is not None else torch.zeros_like(value))
    return tree_unflatten(leaves, call.spec)


def _bound(call, kind: str) -> dict:
    args, kwargs = _as(call, kind)
    return bind(call.func, args, kwargs)


# --- propagation (variance mode) ---------------------------------------------------------------


# The variances a shadow carries: of the whole error, of the part that sums' accumulation order
# contributes, and of the part only fast GPU maths entitles (Note [Elementary functions]).
KINDS = ("var", "order", "fast")
ACCUMULATING = ("var", "order")  # the kinds a sum's accumulation adds to


class Accumulated:
    """What a sum's accumulation variance was computed from (Note [One long sum]): per output
    element the exact sum, the sum of its terms' squares and their count, in the accumulator of
    ``dtype``, times ``scale`` (a product's alpha squared). Carried by the sum's output, and by its
    views and casts, so that the same sum taken over several parts can be modelled as one."""

    def __init__(self, total: torch.Tensor, squares: torch.Tensor, terms: float, dtype: torch.dtype,
                 scale: float | None = None, writes: tuple | None = None):
        if squares.stride() != total.stride():  # laid out as total, so that a view of one is a view of the other
            try:
                squares = torch.empty_strided(total.shape, total.stride(), dtype=squares.dtype,
                                              device=squares.device).copy_(squares)
            except RuntimeError:  # total overlaps itself: left as it is (a view may then drop the record)
                pass
        self.total, self.squares, self.terms, self.dtype, self.scale = total, squares, terms, dtype, scale
        self.writes = writes  # (the evaluation's log of in-place writes, total's storage, its count then)

    def watch(self, log) -> None:
        """Note the evaluation's writes so far into the sum's value (``total`` is it, or a view of it)."""
        storage = self.total.untyped_storage().data_ptr()
        self.writes = (log, storage, log[storage])

    def variance(self) -> torch.Tensor:
        variance = R.accumulation_variance(self.total, self.squares, self.terms, self.dtype)
        return variance if self.scale is None else self.scale * variance

    def holds(self, value: torch.Tensor) -> bool:
        """Whether ``value`` is still this sum's output: equal, and the sum's value not written since
        (an in-place write through a view changes ``total`` too)."""
        if self.writes is not None:
            log, storage, count = self.writes
            if log[storage] != count:
                return False
        return torch.equal(self.total, value)

    def joined(self, other: Accumulated) -> Accumulated | None:
        """The record of one sum over this one's terms and ``other``'s (None where the two are not
        the same sum over other terms)."""
        if (self.dtype, self.scale) != (other.dtype, other.scale) or self.total.shape != other.total.shape:
            return None
        return Accumulated(self.total + other.total, self.squares + other.squares, self.terms + other.terms,
                           self.dtype, self.scale)


def propagate(call, outs: list, dtypes: list, floating: list, state) -> list[dict | None]:
    """Per output leaf, its variances by kind and ``own`` (None for non-floating ones): Note
    [Propagation rules]."""
    func = call.func
    if is_view(func):
        return _views(call, outs, floating)
    exact = _EXACT.get(func)
    accumulated = [None] * len(outs)
    if exact is not None and exact.applies(call):
        propagated = exact(call, outs, dtypes)
        records = propagated.pop("accumulated", accumulated)
        if getattr(state, "records", False):  # kept only where asked (noise.derive_summed)
            accumulated = records
            for record in accumulated:
                if record is not None:
                    record.watch(state.writes)
    else:
        propagated = finite_difference(call, outs, floating)
        if func not in MOVES_DATA and func not in CASTS and torch.Tag.pointwise not in getattr(func, "tags", ()):
            state.generic[str(func)] += 1
    # a cast or copy of a sum's output keeps its record (its variance passes unchanged)
    copied = _mapped_sum(call, len(outs)) if (func in CASTS or func is aten.clone.default) and not call.written \
        else [None] * len(outs)
    result = []
    for j, (o, d, is_float) in enumerate(zip(outs, dtypes, floating)):
        if not is_float:
            result.append(None)
            continue
        own, fast = _own_rounding(call, o, d)
        result.append({"var": propagated["var"][j] + own, "order": propagated["order"][j],
                       "fast": propagated["fast"][j] + fast, "own": own,
                       "accumulated": accumulated[j] if accumulated[j] is not None else copied[j]})
    return result


def _views(call, outs, floating) -> list[dict | None]:
    per_kind = {}
    for kind in (*KINDS, "own"):
        args, kwargs = _as(call, kind)
        per_kind[kind] = tree_flatten(call.func(*args, **kwargs))[0]
    accumulated = _mapped_sum(call, len(outs))
    return [{**{k: per_kind[k][j] for k in per_kind}, "accumulated": accumulated[j]} if is_float else None
            for j, is_float in enumerate(floating)]


def _mapped_sum(call, count: int) -> list:
    """A view, cast or copy of a sum's output (a single shadow input carrying a record): the same op
    on its record's tensors (in float64, as the exact values are)."""
    records = [(i, vars(call.leaves[i]).get("accumulated")) for i in call.shadows]
    if len(records) != 1 or records[0][1] is None:
        return [None] * count
    index, record = records[0]

    def view(tensor):
        leaves = list(call.values)
        leaves[index] = tensor
        args, kwargs = tree_unflatten(leaves, call.spec)
        return tree_flatten(call.func(*args, **kwargs))[0]

    try:
        totals, squares = view(record.total), view(record.squares)
    except RuntimeError:  # a view torch cannot take of the record (e.g. a sum's output that overlaps itself)
        return [None] * count
    return [Accumulated(t, q, record.terms, record.dtype, record.scale, record.writes)
            if isinstance(t, torch.Tensor) else None for t, q in zip(totals, squares)][:count]


def _own_rounding(call, value: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The variance of the op's own rounding, and the more that fast GPU maths entitles it to."""
    func = call.func
    if func in MOVES_DATA:
        none = torch.zeros_like(value)
        return none, none
    if func in CASTS:
        source = _cast_source(call)
        if source is None or torch.finfo(dtype).eps <= torch.finfo(source).eps:
            none = torch.zeros_like(value)
            return none, none
    ulps = _function_ulps(call)
    fast = _fast_maths(call, value, dtype)
    if ulps is not None and dtype != torch.float64:
        # computed in the opmath dtype, then (16-bit outputs) rounded to the nominal dtype
        name = call.func.__name__.split(".")[0]
        computed = R.function_variance(value, R.accumulator(dtype), ulps, R.FUNCTION_ABSOLUTE_U.get(name, 0.0))
        return computed + (R.rounding_variance(value, dtype) if R.accumulator(dtype) != dtype else 0), fast
    return R.rounding_variance(value, dtype), fast


def _fast_maths(call, value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Note [Fast maths]: what evaluating the op the way Triton's own functions do on a GPU adds."""
    acc = R.accumulator(dtype)
    if acc == torch.float64:
        return torch.zeros_like(value)
    name = call.func.__name__.split(".")[0]
    if name == "exp":  # exp2 of x log2(e), that product rounded to the compute dtype
        x = _bound(call, "value")["self"]
        return R.fast_exp_variance(value, x, acc)
    return torch.zeros_like(value)  # no other function's fast form is known to be coarser than its library's


def _cast_source(call) -> torch.dtype | None:
    """The nominal dtype a cast reads (``copy_`` reads ``src``, the others their first argument)."""
    args, kwargs = tree_unflatten(call.leaves, call.spec)
    bound = bind(call.func, args, kwargs) if hasattr(call.func, "_schema") else {}
    source = bound.get("src", args[0] if args else None)
    if isinstance(source, torch.Tensor) and source.is_floating_point():
        return source.dtype
    return None


def _function_ulps(call) -> float | None:
    """Note [Elementary functions]: the op's accuracy in ulps, None for a correctly rounded one.
    ``pow`` by 2 is a product; by 0.5 a square root."""
    name = call.func.__name__.split(".")[0]
    if name == "pow" and call.func is aten.pow.Tensor_Scalar:
        exponent = _bound(call, "value")["exponent"]
        if exponent in (2, 0.5, 1):
            return None
    return R.FUNCTION_ULPS.get(name)


def _groups(call, kind: str) -> list[tuple[list[int], torch.Tensor]]:
    """Shadow leaves with an error to propagate, those that are the same tensor grouped together
    (``x * x`` moves both factors at once)."""
    groups: list[tuple[list[int], torch.Tensor]] = []
    for i, variance in call.variances(kind).items():
        if variance is None or not _positive(variance):
            continue
        for indices, _ in groups:
            if call.leaves[indices[0]] is call.leaves[i]:
                indices.append(i)
                break
        else:
            groups.append(([i], variance))
    return groups


def _positive(variance: torch.Tensor) -> bool:
    """Whether any element of a variance is positive, remembered on the tensor for its current
    version (an in-place write, through any view of it, bumps that): a leaf's variance is read by
    every op that uses it, for each kind."""
    try:
        version = variance._version
    except RuntimeError:  # an inference tensor keeps no version: not remembered
        return bool((variance > 0).any())
    known = variance.__dict__.get("_oracle_positive")
    if known is not None and known[0] == version:
        return known[1]
    positive = bool((variance > 0).any())
    variance.__dict__["_oracle_positive"] = (version, positive)
    return positive


def finite_difference(call, outs: list, floating: list) -> dict[str, list]:
    """Each input moved by one standard deviation of its error, up and down; the mean square change
    of each output (Note [Propagation rules]).

    Note [Cheap finite differences]
        Most of a derived model's time is spent here, so this avoids work without changing a bit:
        the moves are ``value + step`` and ``value - step`` (bitwise ``value + sign * step``); an
        output's spread over its first group is its variance itself (``0 + s`` is ``s``: a spread is
        never -0), later groups are added in place; and ``_spread`` takes a fast path where every
        change is finite."""
    result = {}
    for kind in KINDS:
        acc = [None] * len(outs)
        for indices, variance in _groups(call, kind):
            step = variance.sqrt()
            moved = []
            for sign in (1.0, -1.0):
                values = list(call.values)
                for i in indices:
                    values[i] = call.values[i] + step if sign > 0 else call.values[i] - step
                moved.append(tree_flatten(call.run(values))[0])
            for j, is_float in enumerate(floating):
                if is_float:
                    spread = _spread(outs[j], moved[0][j], moved[1][j])
                    acc[j] = _first_sum(outs[j], spread) if acc[j] is None else _add(acc[j], spread)
        result[kind] = [(torch.zeros_like(o) if a is None else a) if f else None
                        for o, f, a in zip(outs, floating, acc)]
    return result


def _first_sum(out: torch.Tensor, spread: torch.Tensor) -> torch.Tensor:
    """``zeros_like(out) + spread`` (its values, shape and strides) without the zeros, where the
    spread already has them."""
    return spread if _same_layout(spread, out) else torch.zeros_like(out) + spread


def _add(total: torch.Tensor, spread: torch.Tensor) -> torch.Tensor:
    """``total + spread``, in place (``total`` is this function's own) where that keeps its layout."""
    return total.add_(spread) if _same_layout(spread, total) else total + spread


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype


def _spread(out: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """Mean square of the two one-sided changes; one side where the other is not finite."""
    a = up - out
    a.square_()
    b = down - out
    b.square_()
    a.add_(b)
    # Both changes finite everywhere (then so is ``out``): the mean, as _spread_masked computes it.
    # A finite sum of non-negative terms says each is finite; a NaN or an overflow takes the slow path.
    if math.isfinite(float(a.sum())):
        return a.div_(2)
    return _spread_masked(out, up, down)


def _spread_masked(out: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    a, b = (up - out).square(), (down - out).square()
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    both = torch.where(fa & fb, (a + b) / 2, torch.where(fa, a, torch.where(fb, b, torch.inf)))
    return torch.where(torch.isfinite(out), both, 0.0)


# --- the exact rules ---------------------------------------------------------------------------------


class _Rule:
    """A rule per kind of variance, ``fn(call, outs, dtypes, kind) -> [variance per output]``, plus
    ``accumulation(call, outs, dtypes) -> [variance]`` (the sums' own), added to var and order."""

    def __init__(self, fn, accumulation, applies=lambda call: True, records=None):
        """``records(call, outs, dtypes) -> [Accumulated]``, where given, is what ``accumulation``
        computes from (it then need not be given)."""
        self.fn, self.applies, self.records = fn, applies, records
        self.accumulation = accumulation if records is None else \
            (lambda call, outs, dtypes: [record.variance() for record in records(call, outs, dtypes)])

    def __call__(self, call, outs, dtypes) -> dict[str, list]:
        records = self.records(call, outs, dtypes) if self.records is not None else None
        acc = self.accumulation(call, outs, dtypes) if records is None else [r.variance() for r in records]
        result = {kind: [None if v is None else v + (a if kind in ACCUMULATING else 0)  # None: an output not asked for
                         for v, a in zip(self.fn(call, outs, dtypes, kind), acc)] for kind in KINDS}
        if records is not None:
            result["accumulated"] = records
        return result


def _terms(x: torch.Tensor, out: torch.Tensor) -> float:
    return x.numel() / max(1, out.numel())


def _linear_in_self(call, outs, dtypes, kind):
    """sum, cumsum: the op applied to the variances (unit coefficients)."""
    (v, *rest), kwargs = _as(call, kind)
    return [call.func(v, *rest, **kwargs)]


def _sum_record(call, outs, dtypes):
    (x, *rest), kwargs = _as(call, "value")
    total = outs[0]
    return [Accumulated(total, call.func(x * x, *rest, **kwargs), _terms(x, total), dtypes[0])]


def _mean_variances(call, outs, dtypes, kind):
    """mean = sum / n: the variances' mean over n."""
    (x, *_), _ = _as(call, "value")
    (v, *rest), kwargs = _as(call, kind)
    return [call.func(v, *rest, **kwargs) / _terms(x, outs[0])]


def _mean_accumulation(call, outs, dtypes):
    (x, *rest), kwargs = _as(call, "value")
    n = _terms(x, outs[0])
    mean_squares = call.func(x * x, *rest, **kwargs)
    return [R.accumulation_variance(outs[0] * n, mean_squares * n, n, dtypes[0]) / n ** 2]


def _cumsum_accumulation(call, outs, dtypes):
    """Each partial sum is an output, rounded once each (STEP_ROUNDINGS times)."""
    dim = _bound(call, "value")["dim"]
    partial = outs[0]
    if R.accumulator(dtypes[0]) == torch.float64:
        return [torch.zeros_like(partial)]
    u = R.unit_roundoff(R.accumulator(dtypes[0]))
    step = R.PARTIAL_SUM_VARIANCE * u * u * partial.square()
    return [step.cumsum(dim) - step.narrow(dim, 0, 1)]


def _bilinear(product, a_name: str, b_name: str, terms, bias: str | None = None):
    """beta * bias + alpha * product(a, b) (mm, bmm, mv, dot; addmm, baddbmm, addmv with a bias):
    var = beta^2 var(bias) + alpha^2 (product(a^2, var b) + product(var a, b^2)); the accumulation
    of its ``terms(a)`` products."""
    def variances(call, outs, dtypes, kind):
        square, var, value = _bound(call, "square"), _bound(call, kind), _bound(call, "value")
        beta, alpha = float(value.get("beta", 1)), float(value.get("alpha", 1))
        out = alpha ** 2 * (product(square[a_name], var[b_name]) + product(var[a_name], square[b_name]))
        return [out + beta ** 2 * var[bias].expand(out.shape) if bias else out]

    def records(call, outs, dtypes):
        square, value = _bound(call, "square"), _bound(call, "value")
        alpha = float(value.get("alpha", 1))
        total = product(value[a_name], value[b_name])
        return [Accumulated(total, product(square[a_name], square[b_name]), terms(value[a_name]), dtypes[0],
                            alpha ** 2)]

    return variances, None, lambda call: True, records


def _convolve(v: dict, x, w):
    """The convolution of ``x`` by ``w`` with the call's strides, padding, groups... (``v``: its
    bound values), without bias."""
    return aten.convolution.default(x, w, None, v["stride"], v["padding"], v["dilation"], v["transposed"],
                                    v["output_padding"], v["groups"])


def _convolution_variances(call, outs, dtypes, kind):
    """Bilinear in input and weight, as mm is (``_bilinear``), plus the bias along the channels."""
    value, square, var = _bound(call, "value"), _bound(call, "square"), _bound(call, kind)
    out = _convolve(value, square["input"], var["weight"]) + _convolve(value, var["input"], square["weight"])
    bias = var["bias"]
    return [out if bias is None else out + bias.view(1, -1, *[1] * (out.dim() - 2))]


def _convolution_accumulation(call, outs, dtypes):
    """Each output element sums the products its window covers: the convolution of the squares, and
    of ones for their count (padding and strides counted exactly)."""
    value, square, ones = _bound(call, "value"), _bound(call, "square"), _bound(call, "ones")
    total = _convolve(value, value["input"], value["weight"])
    return [R.accumulation_variance(total, _convolve(value, square["input"], square["weight"]),
                                    _convolve(value, ones["input"], ones["weight"]), dtypes[0])]


def _convolve_backward(v: dict, go, x, w):
    return aten.convolution_backward.default(go, x, w, v["bias_sizes"], v["stride"], v["padding"], v["dilation"],
                                             v["transposed"], v["output_padding"], v["groups"], v["output_mask"])


def _convolution_backward_variances(call, outs, dtypes, kind):
    """grad_input is bilinear in (grad_output, weight), grad_weight in (grad_output, input), and
    grad_bias sums grad_output: each output of the op applied to squares and variances."""
    value, square, var = _bound(call, "value"), _bound(call, "square"), _bound(call, kind)
    by_grad = _convolve_backward(value, var["grad_output"], square["input"], square["weight"])
    by_operand = _convolve_backward(value, square["grad_output"], var["input"], var["weight"])
    grad_input, grad_weight, grad_bias = by_grad
    return [None if grad_input is None else grad_input + by_operand[0],
            None if grad_weight is None else grad_weight + by_operand[1],
            grad_bias]  # linear in grad_output alone


def _convolution_backward_accumulation(call, outs, dtypes):
    value, square, ones = _bound(call, "value"), _bound(call, "square"), _bound(call, "ones")
    squares = _convolve_backward(value, square["grad_output"], square["input"], square["weight"])
    counts = _convolve_backward(value, ones["grad_output"], ones["input"], ones["weight"])
    return [None if o is None else R.accumulation_variance(o, q, n, d)
            for o, q, n, d in zip(outs, squares, counts, dtypes)]


def _scattered_variances(call, outs, dtypes, kind):
    """index_put(accumulate=True), index_add, scatter_add: linear in ``self`` and the added values
    with unit coefficients: the op applied to the variances."""
    if float(_bound(call, "value").get("alpha", 1)) != 1:  # the op would scale the variances by alpha, not alpha^2
        raise NotImplementedError("index_add with alpha != 1")
    args, kwargs = _as(call, kind)
    return [call.func(*args, **kwargs)]


def _scattered_accumulation(call, outs, dtypes):
    """What lands on each element is accumulated: the op on squares and on ones gives Q and n."""
    squares = call.func(*_as(call, "square")[0], **_as(call, "square")[1])
    counts = call.func(*_as(call, "ones")[0], **_as(call, "ones")[1])
    return [R.accumulation_variance(outs[0], squares, counts, dtypes[0])]


def _accumulates(call) -> bool:
    return bool(_bound(call, "value").get("accumulate", True))


_SUM = _Rule(_linear_in_self, None, records=_sum_record)
_MEAN = _Rule(_mean_variances, _mean_accumulation)
_SCATTERED = (_scattered_variances, _scattered_accumulation)
_EXACT = {
    aten.sum.dim_IntList: _SUM, aten.sum.default: _SUM, aten.mean.dim: _MEAN, aten.mean.default: _MEAN,
    aten.cumsum.default: _Rule(_linear_in_self, _cumsum_accumulation),
    aten.mm.default: _Rule(*_bilinear(torch.mm, "self", "mat2", lambda a: a.shape[-1])),
    aten.bmm.default: _Rule(*_bilinear(torch.bmm, "self", "mat2", lambda a: a.shape[-1])),
    aten.mv.default: _Rule(*_bilinear(torch.mv, "self", "vec", lambda a: a.shape[-1])),
    aten.dot.default: _Rule(*_bilinear(torch.dot, "self", "tensor", lambda a: a.numel())),
    aten.addmm.default: _Rule(*_bilinear(torch.mm, "mat1", "mat2", lambda a: a.shape[-1], bias="self")),
    aten.baddbmm.default: _Rule(*_bilinear(torch.bmm, "batch1", "batch2", lambda a: a.shape[-1], bias="self")),
    aten.addmv.default: _Rule(*_bilinear(torch.mv, "mat", "vec", lambda a: a.shape[-1], bias="self")),
    aten.index_put.default: _Rule(*_SCATTERED, _accumulates),
    aten.index_put_.default: _Rule(*_SCATTERED, _accumulates),
    aten._unsafe_index_put.default: _Rule(*_SCATTERED, _accumulates),
    aten.index_add.default: _Rule(*_SCATTERED), aten.scatter_add.default: _Rule(*_SCATTERED),
    aten.convolution.default: _Rule(_convolution_variances, _convolution_accumulation),
    aten.convolution_backward.default: _Rule(_convolution_backward_variances, _convolution_backward_accumulation),
}


# --- rounded values (sample and nearest modes) ----------------------------------------------------


def round_values(call, outs: list, dtypes: list, floating: list, state) -> list:
    """The outputs as the mode rounds them: each rounding drawn at random (sample) or to nearest
    (nearest); sums accumulated in a random order (sample) or pairwise (nearest)."""
    func = call.func
    if is_view(func):
        return outs
    rounded = []
    for o, d, is_float in zip(outs, dtypes, floating):
        if not is_float:
            rounded.append(o)
            continue
        if func in MOVES_DATA or (func in CASTS and not _narrows(call, d)):
            rounded.append(o)
            continue
        if func in _ORDERED and state.mode == "nearest":
            o = _ORDERED[func](call, d)
        elif func in _EXACT and _EXACT[func].applies(call) and state.mode == "sample":
            o = o + _accumulation_sample(call, o, d, state.generator)
        elif state.mode == "sample" and _function_ulps(call) is not None:  # Note [Elementary functions]
            o = o + _function_error_sample(call, o, d, state.generator)
        rounded.append(R.to_nearest(o, d) if state.mode == "nearest" else R.rounding_sample(o, d, state.generator))
    return rounded


def _function_error_sample(call, out, dtype, generator) -> torch.Tensor:
    """An elementary function's error, drawn evenly within its accuracy (the variance it is granted)."""
    name = call.func.__name__.split(".")[0]
    acc = R.accumulator(dtype)
    bound = (3 * R.function_variance(out, acc, _function_ulps(call), R.FUNCTION_ABSOLUTE_U.get(name, 0.0))).sqrt()
    return bound * (2 * torch.rand(out.shape, generator=generator, dtype=torch.float64).to(out.device) - 1)


def _narrows(call, dtype) -> bool:
    source = _cast_source(call)
    return source is not None and torch.finfo(dtype).eps > torch.finfo(source).eps


def _accumulation_sample(call, out, dtype, generator) -> torch.Tensor:
    """A sum's accumulation error, drawn: for ``sum`` over one dim, the terms added in a random order
    with each partial sum rounded at random; for the other sums, a normal draw of their variance."""
    acc = R.accumulator(dtype)
    if acc == torch.float64:
        return torch.zeros_like(out)
    bound = _bound(call, "value")
    if call.func is aten.sum.dim_IntList and bound.get("dim") is not None and len(bound["dim"]) == 1:
        dim = bound["dim"][0]
        x = bound["self"].movedim(dim, -1)
        order = torch.rand(x.shape, generator=generator, dtype=torch.float64).argsort(-1)
        partial = torch.gather(x, -1, order.to(x.device)).cumsum(-1)[..., 1:]
        noise = (torch.rand(partial.shape, generator=generator, dtype=torch.float64).to(x.device) - 0.5)
        # each step's roundings (STEP_ROUNDINGS of them, Note [Accumulation]) drawn as one of their variance
        error = (noise * R.spacing(partial, acc)).sum(-1) * R.STEP_ROUNDINGS ** 0.5
        return error.reshape(out.shape) if not bound.get("keepdim") else error.unsqueeze(dim).reshape(out.shape)
    variance = _EXACT[call.func].accumulation(call, [out], [dtype])[0]
    return variance.sqrt() * torch.randn(out.shape, generator=generator, dtype=torch.float64).to(out.device)


def _pairwise_sum(call, dtype):
    """sum / mean in nearest mode: the terms added pairwise, each level rounded in the accumulator."""
    bound = _bound(call, "value")
    x = bound["self"]
    dims = bound.get("dim")
    dims = list(range(x.dim())) if not dims else [d % max(1, x.dim()) for d in dims]
    keepdim = bool(bound.get("keepdim", False))
    acc = R.accumulator(dtype)
    moved = x.movedim(dims, list(range(x.dim() - len(dims), x.dim()))) if x.dim() else x.reshape(1)
    flat = moved.reshape(*moved.shape[:moved.dim() - len(dims)], -1) if x.dim() else moved
    n = flat.shape[-1]
    while flat.shape[-1] > 1:
        if flat.shape[-1] % 2:
            flat = torch.cat([flat, torch.zeros_like(flat[..., :1])], -1)
        flat = R.to_nearest(flat[..., 0::2] + flat[..., 1::2], acc)
    total = flat[..., 0] if n else flat.sum(-1)
    if call.func in (aten.mean.dim, aten.mean.default):
        total = R.to_nearest(total, acc) / max(1, n)
    if keepdim:
        for d in sorted(dims):
            total = total.unsqueeze(d)
    return total


def _blocked_product(product, a_name, b_name, block: int = 32):
    """mm / bmm in nearest mode: blocks of ``block`` products summed exactly, block sums added one
    after another in the accumulator (a GPU kernel's K loop)."""
    def ordered(call, dtype):
        bound = _bound(call, "value")
        a, b = bound[a_name], bound[b_name]
        acc = R.accumulator(dtype)
        k = a.shape[-1]
        total = None
        for start in range(0, k, block):
            part = product(a[..., start:start + block], b[..., start:start + block, :])
            total = part if total is None else R.to_nearest(total + part, acc)
        return total if total is not None else product(a, b)

    return ordered


_ORDERED = {
    aten.sum.dim_IntList: _pairwise_sum, aten.sum.default: _pairwise_sum,
    aten.mean.dim: _pairwise_sum, aten.mean.default: _pairwise_sum,
    aten.mm.default: _blocked_product(torch.mm, "self", "mat2"),
    aten.bmm.default: _blocked_product(torch.bmm, "self", "mat2"),
}
