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

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from . import rounding as R

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
    if schema is None:
        return []
    args, kwargs = tree_unflatten(call.leaves, call.spec)
    bound = bind(func, args, kwargs)
    targets = [bound.get(a.name) for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    return [i for i, leaf in enumerate(call.leaves) if any(leaf is t for t in targets if t is not None)]


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
            stored = getattr(leaf, kind, None)
            leaves.append(stored if stored is not None else torch.zeros_like(value))
    return tree_unflatten(leaves, call.spec)


def _bound(call, kind: str) -> dict:
    args, kwargs = _as(call, kind)
    return bind(call.func, args, kwargs)


# --- propagation (variance mode) ---------------------------------------------------------------


def propagate(call, outs: list, dtypes: list, floating: list, state) -> list[tuple]:
    """(var, order, own) per output leaf (None for non-floating ones): Note [Propagation rules]."""
    func = call.func
    if is_view(func):
        return _views(call, outs, floating)
    exact = _EXACT.get(func)
    if exact is not None and exact.applies(call):
        var, order = exact(call, outs, dtypes)
    else:
        var, order = finite_difference(call, outs, floating)
        if func not in MOVES_DATA and func not in CASTS and torch.Tag.pointwise not in getattr(func, "tags", ()):
            state.generic[str(func)] += 1
    result = []
    for j, (o, d, is_float) in enumerate(zip(outs, dtypes, floating)):
        if not is_float:
            result.append((None, None, None))
            continue
        own = _own_rounding(call, o, d)
        result.append((var[j] + own, order[j], own))
    return result


def _views(call, outs, floating) -> list[tuple]:
    out = []
    per_kind = {}
    for kind in ("var", "order", "own"):
        args, kwargs = _as(call, kind)
        per_kind[kind] = tree_flatten(call.func(*args, **kwargs))[0]
    for j, is_float in enumerate(floating):
        out.append(tuple(per_kind[k][j] for k in ("var", "order", "own")) if is_float else (None, None, None))
    return out


def _own_rounding(call, value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    func = call.func
    if func in MOVES_DATA:
        return torch.zeros_like(value)
    if func in CASTS:
        source = _cast_source(call)
        if source is None or torch.finfo(dtype).eps <= torch.finfo(source).eps:
            return torch.zeros_like(value)
    ulps = _function_ulps(call)
    if ulps is not None and dtype != torch.float64:
        # computed in the opmath dtype, then (16-bit outputs) rounded to the nominal dtype
        name = call.func.__name__.split(".")[0]
        computed = R.function_variance(value, R.accumulator(dtype), ulps, R.FUNCTION_ABSOLUTE_U.get(name, 0.0))
        return computed + (R.rounding_variance(value, dtype) if R.accumulator(dtype) != dtype else 0)
    return R.rounding_variance(value, dtype)


def _function_ulps(call) -> float | None:
    """Note [Elementary functions]: the op's accuracy in ulps, None for a correctly rounded one.
    ``pow`` by 2 is a product; by 0.5 a square root."""
    name = call.func.__name__.split(".")[0]
    if name == "pow" and call.func is aten.pow.Tensor_Scalar:
        exponent = _bound(call, "value")["exponent"]
        if exponent in (2, 0.5, 1):
            return None
    return R.FUNCTION_ULPS.get(name)


def _cast_source(call) -> torch.dtype | None:
    """The nominal dtype a cast reads (``copy_`` reads ``src``, the others their first argument)."""
    args, kwargs = tree_unflatten(call.leaves, call.spec)
    bound = bind(call.func, args, kwargs) if hasattr(call.func, "_schema") else {}
    source = bound.get("src", args[0] if args else None)
    if isinstance(source, torch.Tensor) and source.is_floating_point():
        return source.dtype
    return None


def _groups(call, kind: str) -> list[tuple[list[int], torch.Tensor]]:
    """Shadow leaves with an error to propagate, those that are the same tensor grouped together
    (``x * x`` moves both factors at once)."""
    groups: list[tuple[list[int], torch.Tensor]] = []
    for i, variance in call.variances(kind).items():
        if variance is None or not bool((variance > 0).any()):
            continue
        for indices, _ in groups:
            if call.leaves[indices[0]] is call.leaves[i]:
                indices.append(i)
                break
        else:
            groups.append(([i], variance))
    return groups


def finite_difference(call, outs: list, floating: list) -> tuple[list, list]:
    """Each input moved by one standard deviation of its error, up and down; the mean square change
    of each output (Note [Propagation rules])."""
    result = {}
    for kind in ("var", "order"):
        acc = [torch.zeros_like(o) if f else None for o, f in zip(outs, floating)]
        for indices, variance in _groups(call, kind):
            step = variance.sqrt()
            moved = []
            for sign in (1.0, -1.0):
                values = list(call.values)
                for i in indices:
                    values[i] = call.values[i] + sign * step
                moved.append(tree_flatten(call.run(values))[0])
            for j, is_float in enumerate(floating):
                if is_float:
                    acc[j] = acc[j] + _spread(outs[j], moved[0][j], moved[1][j])
        result[kind] = acc
    return result["var"], result["order"]


def _spread(out: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """Mean square of the two one-sided changes; one side where the other is not finite."""
    a, b = (up - out).square(), (down - out).square()
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    both = torch.where(fa & fb, (a + b) / 2, torch.where(fa, a, torch.where(fb, b, torch.inf)))
    return torch.where(torch.isfinite(out), both, 0.0)


# --- the exact rules ---------------------------------------------------------------------------------


class _Rule:
    def __init__(self, fn, applies=lambda call: True):
        self.fn, self.applies = fn, applies

    def __call__(self, call, outs, dtypes):
        return self.fn(call, outs, dtypes)


def _terms(x: torch.Tensor, out: torch.Tensor) -> float:
    return x.numel() / max(1, out.numel())


def _sum_rule(call, outs, dtypes):
    """sum: the variances summed; its accumulation from the sum and the sum of squares."""
    (x, *rest), kwargs = _as(call, "value")
    (vx, *_), _ = _as(call, "var")
    (ox, *_), _ = _as(call, "order")
    total = outs[0]
    squares = call.func(x * x, *rest, **kwargs)
    acc = R.accumulation_variance(total, squares, _terms(x, total), dtypes[0])
    return [call.func(vx, *rest, **kwargs) + acc], [call.func(ox, *rest, **kwargs) + acc]


def _mean_rule(call, outs, dtypes):
    """mean = sum / n: the sum's variance and accumulation over n^2."""
    (x, *rest), kwargs = _as(call, "value")
    (vx, *_), _ = _as(call, "var")
    (ox, *_), _ = _as(call, "order")
    n = _terms(x, outs[0])
    mean_squares = call.func(x * x, *rest, **kwargs)
    acc = R.accumulation_variance(outs[0] * n, mean_squares * n, n, dtypes[0]) / n ** 2
    return [call.func(vx, *rest, **kwargs) / n + acc], [call.func(ox, *rest, **kwargs) / n + acc]


def _cumsum_rule(call, outs, dtypes):
    """cumsum: each prefix's variances summed; each partial sum is an output, rounded once each."""
    bound = _bound(call, "value")
    dim = bound["dim"]
    partial = outs[0]
    u = R.unit_roundoff(R.accumulator(dtypes[0]))
    step = R.PARTIAL_SUM_VARIANCE * u * u * partial.square()
    acc = step.cumsum(dim) - step.narrow(dim, 0, 1) if R.accumulator(dtypes[0]) != torch.float64 else 0 * step
    var, order = _bound(call, "var")["self"], _bound(call, "order")["self"]
    return [torch.cumsum(var, dim) + acc], [torch.cumsum(order, dim) + acc]


def _bilinear(product, a_name: str, b_name: str, terms):
    """C = product(a, b) (mm, bmm, mv, dot): var(C) = product(a^2, var b) + product(var a, b^2),
    and the accumulation of its ``terms(a)`` products."""
    def rule(call, outs, dtypes):
        value, square = _bound(call, "value"), _bound(call, "square")
        var, order = _bound(call, "var"), _bound(call, "order")
        a, b = value[a_name], value[b_name]
        squares = product(square[a_name], square[b_name])
        acc = R.accumulation_variance(outs[0], squares, terms(a), dtypes[0])
        return ([product(square[a_name], var[b_name]) + product(var[a_name], square[b_name]) + acc],
                [product(square[a_name], order[b_name]) + product(order[a_name], square[b_name]) + acc])

    return rule


def _scaled_bilinear(product, bias: str, a_name: str, b_name: str):
    """beta * bias + alpha * product(a, b) (addmm, baddbmm, addmv)."""
    def rule(call, outs, dtypes):
        value, square = _bound(call, "value"), _bound(call, "square")
        var, order = _bound(call, "var"), _bound(call, "order")
        beta, alpha = float(value.get("beta", 1)), float(value.get("alpha", 1))
        a, b = value[a_name], value[b_name]
        exact = product(a, b)
        acc = R.accumulation_variance(exact, product(square[a_name], square[b_name]), a.shape[-1], dtypes[0])
        shape = outs[0].shape

        def total(kind):
            other = var if kind == "var" else order
            return (beta ** 2 * other[bias].expand(shape)
                    + alpha ** 2 * (product(square[a_name], other[b_name]) + product(other[a_name], square[b_name])
                                    + acc))

        return [total("var")], [total("order")]

    return rule


def _accumulating(call, outs, dtypes):
    """index_put(accumulate=True), index_add, scatter_add: linear in ``self`` and the added values,
    with unit coefficients (alpha^2 for index_add's), plus the accumulation of what lands on each
    element."""
    args_v, kw_v = _as(call, "value")
    squares = call.func(*_as(call, "square")[0], **_as(call, "square")[1])
    counts = call.func(*_as(call, "ones")[0], **_as(call, "ones")[1])
    acc = R.accumulation_variance(outs[0], squares, counts, dtypes[0])
    var = call.func(*_as(call, "var")[0], **_as(call, "var")[1])
    order = call.func(*_as(call, "order")[0], **_as(call, "order")[1])
    alpha = float(_bound(call, "value").get("alpha", 1))
    if alpha != 1:  # applied once by the op to the added variances: it needs alpha^2
        raise NotImplementedError("index_add with alpha != 1")
    return [var + acc], [order + acc]


def _accumulates(call) -> bool:
    return bool(_bound(call, "value").get("accumulate", True))


_EXACT = {
    aten.sum.dim_IntList: _Rule(_sum_rule), aten.sum.default: _Rule(_sum_rule),
    aten.mean.dim: _Rule(_mean_rule), aten.mean.default: _Rule(_mean_rule),
    aten.cumsum.default: _Rule(_cumsum_rule),
    aten.mm.default: _Rule(_bilinear(torch.mm, "self", "mat2", lambda a: a.shape[-1])),
    aten.bmm.default: _Rule(_bilinear(torch.bmm, "self", "mat2", lambda a: a.shape[-1])),
    aten.mv.default: _Rule(_bilinear(torch.mv, "self", "vec", lambda a: a.shape[-1])),
    aten.dot.default: _Rule(_bilinear(torch.dot, "self", "tensor", lambda a: a.numel())),
    aten.addmm.default: _Rule(_scaled_bilinear(torch.mm, "self", "mat1", "mat2")),
    aten.baddbmm.default: _Rule(_scaled_bilinear(torch.bmm, "self", "batch1", "batch2")),
    aten.addmv.default: _Rule(_scaled_bilinear(torch.mv, "self", "mat", "vec")),
    aten.index_put.default: _Rule(_accumulating, _accumulates),
    aten.index_put_.default: _Rule(_accumulating, _accumulates),
    aten._unsafe_index_put.default: _Rule(_accumulating, _accumulates),
    aten.index_add.default: _Rule(_accumulating), aten.scatter_add.default: _Rule(_accumulating),
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
    # In sample mode the inputs carry no variances, so the exact rule gives the accumulation alone.
    variance = _EXACT[call.func](call, [out], [dtype])[0][0]
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
