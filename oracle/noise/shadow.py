"""The shadow tensor: a reference's maths run exactly, with what each rounding would cost beside it.

Note [Shadow evaluation]
    A ``Shadow`` looks like a tensor of its *nominal* dtype (bf16, fp32, ...) to the code that uses it,
    so a reference written for real tensors (``x.to(torch.float32)``, ``w * h.to(input_dtype)``,
    autograd included) runs unchanged. Underneath, every aten operation reaching it is evaluated in
    float64 on exact values (``value``), and its nominal output dtype is read from the operation's
    meta kernel. Three modes (``evaluating``):

    - ``variance`` (the noise model): values stay exact, so they are the float64 truth. Beside each
      value the shadow carries ``var``, the variance of the rounding error the nominal evaluation
      would have accumulated there, to first order: each operation propagates its inputs' variances
      through its local sensitivity (oracle/noise/rules.py) and adds the variance of its own rounding
      to the nominal dtype (``own``, NEAREST_VARIANCE ulp^2 where the exact result is not
      representable), and a sum adds its accumulation (rounding.py, Note [Accumulation]). ``order``
      is the part of ``var`` that the accumulation of sums contributes: what another valid order of
      those sums moves.
    - ``sample``: one Monte Carlo sample of the same model (Parker's Monte Carlo arithmetic): each
      rounding is drawn at random with the variance of rounding to nearest, each sum is accumulated
      in a random order with a rounding drawn at every partial sum. The spread of many samples is
      what ``variance`` computes in closed form (tests/test_noise.py checks that they agree).
    - ``nearest``: each operation rounded to nearest in its nominal dtype, sums added pairwise (and
      products blockwise) in their accumulator: HF's maths in another valid order.

    Operations that only move data (copies, views, indexing, concatenation, selection, negation)
    round nothing. Fused operations that torch ships decompositions for (layer and group norms,
    softmax, losses, GeLU and SiLU and their backwards, norms) are decomposed first, so that their
    internal roundings are modelled too.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch._decomp import decomposition_table
from torch.utils._pytree import tree_flatten, tree_unflatten

from oracle.noise import rounding
from oracle.noise import rules

aten = torch.ops.aten
prims = torch.ops.prims

MODES = ("variance", "sample", "nearest")


@dataclass
class Evaluation:
    """What one shadow evaluation is doing, and what it saw."""

    mode: str = "variance"
    generator: torch.Generator | None = None  # sample mode's randomness
    generic: Counter = field(default_factory=Counter)  # ops modelled by the generic rule (rules.py)
    records: bool = False  # whether sums' outputs carry rules.Accumulated (Note [One long sum])
    writes: Counter = field(default_factory=Counter)  # in-place writes per storage (rules.Accumulated.holds)


_ACTIVE: list[Evaluation] = []


@contextlib.contextmanager
def evaluating(mode: str = "variance", seed: int = 0, records: bool = False):
    """Shadows created and used inside evaluate in ``mode`` (Note [Shadow evaluation]); with
    ``records``, a sum's output carries what its accumulation came from (Note [One long sum])."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    state = Evaluation(mode, torch.Generator().manual_seed(seed) if mode == "sample" else None, records=records)
    _ACTIVE.append(state)
    try:
        yield state
    finally:
        _ACTIVE.pop()


def active() -> Evaluation:
    if not _ACTIVE:
        raise RuntimeError("a Shadow is used outside oracle.noise.shadow.evaluating()")
    return _ACTIVE[-1]


class Shadow(torch.Tensor):
    """A tensor of a nominal dtype whose value is held exactly in float64 (Note [Shadow evaluation]).
    ``var``, ``order``, ``fast`` and ``own`` (variances, float64, the value's shape and strides; see
    rules.KINDS) exist in variance mode only."""

    value: torch.Tensor
    var: torch.Tensor | None
    order: torch.Tensor | None
    fast: torch.Tensor | None
    own: torch.Tensor | None
    accumulated: rules.Accumulated | None  # a sum's output (or a view or cast of one): what its accumulation came from

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, value: torch.Tensor, dtype: torch.dtype, var=None, order=None, fast=None, own=None,
                accumulated=None, requires_grad: bool = False):
        return torch.Tensor._make_wrapper_subclass(
            cls, value.shape, strides=value.stride(), storage_offset=value.storage_offset(), dtype=dtype,
            device=value.device, requires_grad=requires_grad)

    def __init__(self, value, dtype, var=None, order=None, fast=None, own=None, accumulated=None, requires_grad=False):
        self.value = value
        self.var, self.order, self.fast, self.own = var, order, fast, own
        self.accumulated = accumulated

    @classmethod
    def of(cls, tensor: torch.Tensor, requires_grad: bool = False) -> Shadow:
        """An exact shadow of a real floating tensor: its values, no rounding error yet."""
        value = tensor.detach().to(torch.float64)
        variance = active().mode == "variance"
        zeros = (lambda: torch.zeros_like(value)) if variance else (lambda: None)
        return cls(value, tensor.dtype, zeros(), zeros(), zeros(), zeros(), requires_grad=requires_grad)

    def __repr__(self):
        return f"Shadow({self.dtype}, shape={tuple(self.shape)}, value={self.value!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten._local_scalar_dense.default:
            return args[0].value.item()
        if func is aten.sigmoid.default:  # as kernels evaluate it (Note [Elementary functions])
            x = args[0]
            wide = x.to(rounding.accumulator(x.dtype))
            return torch.reciprocal(torch.exp(torch.neg(wide)) + 1).to(x.dtype)
        if func in _PRIMS:  # torch's references reach prims: their aten forms have rules
            return _PRIMS[func](*args, **kwargs)
        if _decomposes(func):  # torch's own decomposition, which computes where the kernel computes
            return decomposition_table[func](*args, **kwargs)
        if _composite(func):  # aten.to and other ops made of ops (below autograd they reach here)
            result = func.decompose(*args, **kwargs)
            if result is not NotImplemented:
                return result
        return _evaluate(func, args, kwargs, active())


# --- which ops are decomposed --------------------------------------------------------------------

# Handled as they are (rules.py has their rule); everything else torch can decompose is decomposed.
_NATIVE = {
    aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar, aten.rsub.Tensor, aten.rsub.Scalar,
    aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.neg.default,
    aten.reciprocal.default, aten.sqrt.default, aten.rsqrt.default, aten.exp.default, aten.exp2.default,
    aten.expm1.default, aten.log.default, aten.log2.default, aten.log1p.default, aten.sin.default,
    aten.cos.default, aten.tanh.default, aten.erf.default, aten.pow.Tensor_Scalar,
    aten.pow.Tensor_Tensor, aten.pow.Scalar, aten.abs.default, aten.clamp.default, aten.clamp_min.default,
    aten.clamp_max.default, aten.maximum.default, aten.minimum.default, aten.where.self, aten.masked_fill.Scalar,
    aten.masked_fill.Tensor, aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.mean.default,
    aten.cumsum.default, aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default,
    aten.mv.default, aten.dot.default, aten.addmv.default, aten._to_copy.default, aten.clone.default,
    aten.copy_.default, aten.copy.default, aten.fill_.Scalar, aten.fill.Scalar, aten.zero_.default,
    aten.index_put.default, aten.index_put_.default, aten._unsafe_index_put.default, aten.scatter_add.default,
    aten.index_add.default, aten.amax.default, aten.amin.default, aten.max.dim, aten.min.dim,
    aten.max.default, aten.min.default, aten.cat.default, aten.stack.default, aten.index.Tensor,
    aten.index_select.default, aten.gather.default, aten.embedding.default, aten.flip.default,
    aten.roll.default, aten.repeat.default, aten.constant_pad_nd.default, aten.relu.default,
    aten.threshold_backward.default, aten.sign.default, aten.square.default, aten.zeros_like.default,
    aten.ones_like.default, aten.full_like.default, aten.empty_like.default, aten.new_zeros.default,
    aten.new_ones.default, aten.new_full.default, aten.new_empty.default, aten.new_empty_strided.default,
    aten.slice_scatter.default, aten.select_scatter.default, aten.diagonal_scatter.default,
    aten.sort.default, aten.topk.default, aten.lift_fresh_copy.default, aten.triu.default, aten.tril.default,
    aten.squeeze_copy.dim, aten.expand_copy.default, aten.masked_scatter.default, aten.logical_not.default,
    aten.eq.Tensor, aten.eq.Scalar, aten.ne.Tensor, aten.ne.Scalar, aten.lt.Tensor, aten.lt.Scalar,
    aten.le.Tensor, aten.le.Scalar, aten.gt.Tensor, aten.gt.Scalar, aten.ge.Tensor, aten.ge.Scalar,
    aten.isnan.default, aten.isinf.default, aten.floor.default, aten.ceil.default, aten.round.default,
    aten.trunc.default, aten.convolution.default, aten.convolution_backward.default, aten.scatter.src,
    aten.scatter.value, aten.any.default, aten.any.dim, aten.all.default, aten.argmax.default, aten.argmin.default,
    aten.isfinite.default,
}


def _prims_var(x, dims, correction=1, output_dtype=None):
    n = 1
    for d in dims:
        n *= x.shape[d]
    mean = torch.sum(x, dims, keepdim=True) / n
    centred = x - mean
    return torch.sum(centred * centred, dims) / max(0, n - correction)


def _tensors(a, b):
    """Python numbers beside a tensor as 0-d tensors of its dtype (aten.where.self wants tensors)."""
    like = a if isinstance(a, torch.Tensor) else b
    return tuple(x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=like.dtype, device=like.device)
                 for x in (a, b))


# prims ops that torch's decompositions call (var_mean, layer norm), as the aten ops rules.py knows.
_PRIMS = {
    prims.sum.default: lambda x, dims, output_dtype=None: aten.sum.dim_IntList(x, dims, dtype=output_dtype),
    prims.var.default: _prims_var,
    prims.div.default: lambda a, b: aten.div.Tensor(a, b),
    prims.mul.default: lambda a, b: aten.mul.Tensor(a, b),
    prims.add.default: lambda a, b: aten.add.Tensor(a, b),
    prims.sub.default: lambda a, b: aten.sub.Tensor(a, b),
    prims.where.default: lambda condition, a, b: aten.where.self(condition, *_tensors(a, b)),
    prims.convert_element_type.default: lambda a, dtype: aten._to_copy.default(a, dtype=dtype),
}


def _composite(func) -> bool:
    return func not in _NATIVE and isinstance(func, torch._ops.OpOverload) and torch._C._dispatch_has_kernel_for_dispatch_key(
        func.name(), torch._C.DispatchKey.CompositeImplicitAutograd)


def _decomposes(func) -> bool:
    if func in _NATIVE or rules.is_view(func) or func not in decomposition_table:
        return False
    return not isinstance(func, torch._ops.OpOverload) or func.namespace == "aten"


# --- evaluating one op -----------------------------------------------------------------------------


class Call:
    """One op call with shadow arguments, flattened: its leaves' exact values and variances, and a
    way to evaluate it again on other values (the rules' finite differences) without side effects."""

    def __init__(self, func, args, kwargs):
        self.func = func
        self.leaves, self.spec = tree_flatten((args, kwargs))
        self.shadows = [i for i, leaf in enumerate(self.leaves) if isinstance(leaf, Shadow)]
        self.values = [_value(leaf) for leaf in self.leaves]
        self.written = rules.written_leaves(func, self)

    def variances(self, name: str) -> dict[int, torch.Tensor]:
        """Per shadow leaf, its ``var`` or ``order``."""
        return {i: getattr(self.leaves[i], name) for i in self.shadows}

    def run(self, values: list | None = None):
        """The op on these leaf values (default: the exact ones), written arguments cloned first."""
        values = list(self.values if values is None else values)
        for i in self.written:
            values[i] = values[i].clone()
        args, kwargs = tree_unflatten(values, self.spec)
        return self.func(*args, **kwargs)

    def nominal_dtypes(self) -> list:
        """The dtype of each output of the op on meta tensors of the nominal dtypes (a real evaluation
        where an op has no meta kernel), None for what is not a tensor: what dtype each output has in
        the evaluation being modelled. Remembered per op and key of its leaves (Note [Nominal dtypes])."""
        key = self._key()
        if key is not None:
            known = _NOMINAL_DTYPES.get(key)
            if known is not None:
                return list(known)
        try:
            args, kwargs = tree_unflatten([_meta(leaf) for leaf in self.leaves], self.spec)
            nominal = tree_flatten(self.func(*args, **kwargs))[0]
        except (NotImplementedError, RuntimeError):
            key = None  # an op without a meta kernel: evaluated for real, every time
            args, kwargs = tree_unflatten([_nominal(leaf) for leaf in self.leaves], self.spec)
            nominal = tree_flatten(self.func(*args, **kwargs))[0]
        dtypes = [m.dtype if isinstance(m, torch.Tensor) else None for m in nominal]
        if key is not None and len(_NOMINAL_DTYPES) < _NOMINAL_DTYPES_SIZE:
            _NOMINAL_DTYPES[key] = tuple(dtypes)
        return dtypes

    def _key(self):
        parts = [self.func, self.spec]
        for leaf in self.leaves:
            if isinstance(leaf, torch.Tensor):
                parts.append((type(leaf) is Shadow, leaf.dtype, tuple(leaf.shape), leaf.stride(), leaf.device.type))
            elif leaf is None or isinstance(leaf, (bool, int, float, str, torch.dtype, torch.device, torch.layout,
                                                   torch.memory_format)):
                parts.append((type(leaf), leaf))
            else:
                return None  # anything else (a SymInt, a generator): not remembered
        return tuple(parts)


# Note [Nominal dtypes]
#     An op's output dtypes are read from its meta kernel on every call, which costs more than many
#     of the float64 evaluations themselves. They depend only on the op and on what the meta
#     kernel sees: its tensors' dtypes, shapes and strides, and the other leaves by type and value;
#     so they are remembered under exactly that key. Ops whose meta kernel raises are not.
_NOMINAL_DTYPES: dict = {}
_NOMINAL_DTYPES_SIZE = 1 << 16


def _value(leaf):
    if isinstance(leaf, Shadow):
        return leaf.value
    if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
        return leaf.to(torch.float64)
    if isinstance(leaf, torch.dtype) and leaf.is_floating_point:
        return torch.float64
    return leaf


def _meta(leaf):
    if isinstance(leaf, Shadow):
        return torch.empty_strided(leaf.shape, leaf.stride(), dtype=leaf.dtype, device="meta")
    if isinstance(leaf, torch.Tensor):
        return leaf.to("meta")
    if isinstance(leaf, torch.device):
        return torch.device("meta")
    return leaf


def _nominal(leaf):
    return leaf.value.to(leaf.dtype) if isinstance(leaf, Shadow) else leaf


def _evaluate(func, args, kwargs, state: Evaluation):
    call = Call(func, args, kwargs)
    dtypes = call.nominal_dtypes()
    out = call.run()
    out_leaves, out_spec = tree_flatten(out)
    floating = [isinstance(o, torch.Tensor) and d is not None and d.is_floating_point
                for o, d in zip(out_leaves, dtypes)]

    if state.mode == "variance":
        variances = rules.propagate(call, out_leaves, dtypes, floating, state)
    else:
        out_leaves = rules.round_values(call, out_leaves, dtypes, floating, state)
        variances = [None] * len(out_leaves)

    wrapped = []
    for o, d, is_float, kinds in zip(out_leaves, dtypes, floating, variances):
        wrapped.append(Shadow(o, d, **(kinds or {})) if is_float else o)
    if call.written:
        return _write_back(call, tree_unflatten(wrapped, out_spec), out_spec)
    return tree_unflatten(wrapped, out_spec)


def _write_back(call: Call, result, out_spec):
    """An op that writes into an argument (``add_``, ``copy_``, ``out=``): its results go into that
    argument's value and variances, so that views of it see them, and the argument is returned."""
    targets = [call.leaves[i] for i in call.written]
    results = tree_flatten(result)[0]
    writes = active().writes
    for target, new in zip(targets, results):
        if not isinstance(target, Shadow):
            continue
        target.value.copy_(new.value)
        writes[target.value.untyped_storage().data_ptr()] += 1
        for name in (*rules.KINDS, "own"):
            if getattr(target, name) is not None:
                getattr(target, name).copy_(getattr(new, name))
        target.accumulated = None  # written in place: no longer one sum's output (nor are its views and base)
    return targets[0] if len(targets) == 1 else tuple(targets)
