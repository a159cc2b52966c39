"""Declaring an op: everything the harness needs to judge any implementation of it, as data.

Note [Declaring an op]
    An ``Op`` names the op, gives its reference (a plain PyTorch function, or HF's own code), says
    how its inputs are made (``Tensor``: which sizes, dtype and values; ``Dim``: how a size is
    drawn), which inputs are differentiable, what an implementation may overwrite, its variants and
    parameters. From that the harness builds the same ``OpSpec`` its built-in ops have
    (oracle/declare/spec.py): hypothesis cases, stratified cases, the report's grid, float64 cases, the
    scale slice (where a ``Dim`` counts programs), and the noise model of the verdict, derived from
    the reference (oracle/noise, Note [The derived noise model]). So every check runs on it:
    the verdict, aliasing, guard bands, version counters, determinism, float64 gradcheck.

    An implementation is called as the reference is: ``impl.<name>(*inputs, *params)``, in the
    declared order, and returns the outputs (one tensor, or a tuple in ``outputs``' order).
    Gradients are compared for every differentiable input, named ``"d" + input``: by default every
    floating input, a fixed-dtype one (a float32 weight beside bfloat16 activations) included.

    Every mistake in a declaration raises ``DeclarationError`` when the ``Op`` is built, naming the
    op, the field, what was given and what is expected (as Hypothesis's ``InvalidArgument`` does):
    one error class, which oracle.declare.registry re-exports and oracle.declare.implementations raises for implementations.

    Modules of declarations are found as Note [Finding declared ops] (oracle/declare/registry.py) says.

Example: LayerNorm, from a user's repository::

    import torch.nn.functional as F
    from oracle.declare import Dim, Op, Tensor

    LAYER_NORM = Op(
        "layer_norm",
        reference=lambda X, W, B, eps: F.layer_norm(X, X.shape[-1:], W, B, eps),
        inputs={"X": Tensor("rows", "cols"), "W": Tensor("cols", values="weight"),
                "B": Tensor("cols", values="small")},
        dims={"rows": Dim(1, 64, programs=True), "cols": Dim(1, 4096, special=(1, 7, 128, 1000, 4096))},
        params={"eps": Choice(1e-5, 1e-6)},
        outputs=("Y",),
    )
"""

from __future__ import annotations

import keyword
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from hypothesis import strategies as st

from oracle import cases as C
from oracle.cases import (FLOAT_DTYPES, GRAD_LAYOUTS, LAYOUTS, TILE_BOUNDARIES, VALUE_KINDS, Budget, Case, covering,
                    long_counts)
from oracle.checks.memory import FUSE_LAST_DIM
from oracle.declare.spec import DTYPES, ErrorInput, OpSpec, Programs, fill, generator, layout_last_two
from oracle.errors import DeclarationError  # noqa: F401 - raised here

# Kinds of values beside the case's own (cases.VALUE_KINDS): what parameters usually look like.
PARAMETER_VALUES = {
    "weight": "1 + 0.1 N(0, 1): a norm's scale",
    "small": "0.1 N(0, 1): a bias, a Gemma-style weight",
    "positive": "|N(0, 1)| + 0.1",
    "probabilities": "a softmax of N(0, 1) over the last dim",
}



@dataclass(frozen=True, init=False)
class Choice:
    """A param drawn per case among ``values``: ``params={"eps": Choice(1e-5, 1e-6)}``. The
    report's grid takes the first value and its large-values case the last."""

    values: tuple

    def __init__(self, *values):
        object.__setattr__(self, "values", tuple(values))


@dataclass(frozen=True)
class Fixed:
    """A param's one value, passed as it is, a tuple included: ``params={"dim": Fixed((-1,))}``,
    ``{"normalized_shape": Fixed((4096,))}``. A value that is no tuple needs no marker."""

    value: object


@dataclass(frozen=True)
class Dim:
    """A size the op's tensors share, drawn per case.

    - ``low``, ``high``: its range (``high`` is further capped by the device's budget);
    - ``special``: sizes that break kernels (1, primes, block edges), drawn two times in three;
    - ``programs``: this size counts independent programs (rows, tokens). A third of the drawn cases
      take it past the kernels' tiles (64, 128, 256); cases at scale are judged on a slice along it.
      Every tensor holding it holds it first;
    - ``multiple``: every size is a multiple of it (a head dim that is rotated in halves: 2).
    """

    low: int = 1
    high: int = 1024
    special: tuple[int, ...] = ()
    programs: bool = False
    multiple: int = 1

    def fit(self, n: int) -> int:
        """The size nearest below ``n`` that the dim allows (at least its smallest)."""
        n = (min(self.high, max(self.low, n)) // self.multiple) * self.multiple
        return n if n >= self.low else n + self.multiple


@dataclass(frozen=True)
class Integers:
    """Integer values drawn evenly from [low, high) (a Dim's name stands for its size), with
    ``sprinkle`` values (value -> share of elements) put in: ``Integers(0, "vocab", {-100: 0.1})``
    is cross-entropy's targets with a tenth of them ignored."""

    low: int | str = 0
    high: int | str = 2
    sprinkle: dict = field(default_factory=dict)

    def make(self, shape, dims: dict, gen: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
        low, high = (dims[b] if isinstance(b, str) else b for b in (self.low, self.high))
        x = torch.randint(low, max(low + 1, high), shape, generator=gen, dtype=torch.int64)
        for value, share in self.sprinkle.items():
            x = torch.where(torch.rand(shape, generator=gen) < share, torch.tensor(value), x)
        return x.to(dtype)


@dataclass(frozen=True)
class Tensor:
    """One tensor argument.

    - ``dims``: its sizes, outermost first: names of the op's ``Dim``s, ``(name, k)`` for k times a
      dim's size (a head dim twice the rotary tables' half), or fixed ints;
    - ``dtype``: ``"case"`` (the case's dtype: float16, bfloat16, float32, float64), or a fixed one
      (``"float32"``, ``torch.int64``, ...). A fixed floating dtype holds in every case but the
      float64 ones, where every floating input is float64 (gradcheck's finite differences need it);
    - ``values``: ``"case"`` (the case's kind: normal, large, tiny, zero_rows, outliers, nonfinite),
      one kind always, a parameter's kind (PARAMETER_VALUES), an ``Integers``, or a callable
      ``(shape, dtype, generator, device) -> tensor``. The named kinds are floating values: an
      integer or boolean tensor takes an ``Integers`` or a callable;
    - ``layout``: whether it is placed in the case's layout (contiguous, transposed, offset, strided);
      default: floating tensors of two or more dims.
    """

    dims: tuple
    dtype: str | torch.dtype = "case"
    values: str | Integers | Callable = "case"
    layout: bool | None = None

    def __init__(self, *dims, dtype="case", values="case", layout=None):
        object.__setattr__(self, "dims", tuple(dims))
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "layout", layout)

    def dtype_in(self, case_dtype: str) -> torch.dtype:
        if self.dtype == "case":
            return DTYPES[case_dtype]
        fixed = self.fixed_dtype
        return torch.float64 if case_dtype == "float64" and fixed.is_floating_point else fixed

    @property
    def fixed_dtype(self) -> torch.dtype:
        """The declared dtype itself (raises ValueError where it names no torch dtype)."""
        fixed = self.dtype if isinstance(self.dtype, torch.dtype) else \
            getattr(torch, self.dtype, None) if isinstance(self.dtype, str) else None
        if not isinstance(fixed, torch.dtype):
            raise ValueError(f"{self.dtype!r} is not a torch dtype")
        return fixed

    @property
    def floating(self) -> bool:
        return self.dtype == "case" or self.fixed_dtype.is_floating_point

    def shape(self, dims: dict) -> tuple[int, ...]:
        return tuple(dims[d] if isinstance(d, str) else dims[d[0]] * d[1] if isinstance(d, tuple) else d
                     for d in self.dims)


@dataclass(frozen=True, eq=False)
class Op:
    """A declared op (Note [Declaring an op]). Fields beyond the first four are optional:

    - ``params``: non-tensor arguments, each a value (passed as it is), ``Choice(a, b, ...)`` (one
      drawn per case) or ``Fixed(value)`` (a tuple passed as it is). A bare tuple of two or more
      values reads as a ``Choice`` (the older spelling); a bare tuple of one is refused, as ambiguous;
    - ``differentiable``: inputs whose gradients are compared (default: every floating input,
      whatever its dtype; ``()`` for none);
    - ``outputs``: names of what the reference returns, in order;
    - ``variants``: name -> the params it fixes (``{"tanh": {"approximate": "tanh"}, ...}``);
    - ``may_clobber``: inputs an implementation may overwrite (declared in its CLOBBERS);
      ``writes_into``: output -> the input whose buffer must hold it (a raw kernel's contract);
    - ``dtypes``, ``value_kinds``: what cases are drawn in;
    - ``sweep``, ``full_sweep``, ``scale``: the report's quick and full grids and the scale grid, each
      a tuple of dicts giving every dim's size: ``sweep=({"rows": 7, "cols": 7}, {"rows": 24, "cols":
      1000})`` (default: derived from the dims; ``full_sweep`` falls back to ``sweep``; no scale grid);
    - ``noise``, ``reordered``: a hand-written noise model and reordered reference, where one is
      tighter than the derived ones (compare.py, oracle/declare/spec.py);
    - ``error_inputs``: bad inputs and what they must give (specs.ErrorInput);
    - ``summary``: one line for tables.
    """

    name: str
    reference: Callable
    inputs: dict
    dims: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    differentiable: tuple | None = None
    outputs: tuple = ("out",)
    variants: dict = field(default_factory=lambda: {"default": {}})
    may_clobber: tuple = ()
    writes_into: dict = field(default_factory=dict)
    dtypes: tuple = FLOAT_DTYPES
    value_kinds: tuple = VALUE_KINDS
    sweep: tuple = ()
    full_sweep: tuple = ()
    scale: tuple = ()
    noise: dict = field(default_factory=dict)
    reordered: Callable | None = None
    error_inputs: tuple | Callable = ()
    summary: str = ""

    def __post_init__(self):
        _validate(self)
        for name in _NAME_TUPLES + _GRIDS:  # a list given where a tuple belongs is kept as a tuple
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "_spec", None)

    @property
    def spec(self) -> OpSpec:
        """The OpSpec the harness runs (built once)."""
        if self._spec is None:
            object.__setattr__(self, "_spec", _build(self))
        return self._spec

    # --- what the builders below read ---

    @property
    def tensor_names(self) -> tuple[str, ...]:
        return tuple(self.inputs)

    @property
    def arg_names(self) -> tuple[str, ...]:
        return tuple(self.inputs) + tuple(self.params)

    @property
    def grads(self) -> tuple[str, ...]:
        if self.differentiable is not None:
            return tuple(self.differentiable)
        return tuple(n for n, t in self.inputs.items() if t.floating)

    @property
    def programs_dim(self) -> str | None:
        return next((name for name, dim in self.dims.items() if dim.programs), None)

    def layout_tensors(self) -> tuple[str, ...]:
        return tuple(n for n, t in self.inputs.items()
                     if (t.layout if t.layout is not None else (t.floating and len(t.dims) >= 2)))


# --- validation: the first problem, naming the field ---------------------------------------------

# Fields that hold names (a tuple, or a list), and the grids (tuples of dicts of sizes).
_NAME_TUPLES = ("differentiable", "outputs", "may_clobber", "dtypes", "value_kinds")
_GRIDS = ("sweep", "full_sweep", "scale")


def _validate(op: Op) -> None:
    def fail(field_name: str, problem: str):
        raise DeclarationError(f"op {op.name!r}: {field_name}: {problem}")

    def names(field_name: str, value, what: str) -> None:
        """A tuple (or list) of strings; a bare string is refused, never split into characters."""
        if isinstance(value, str):
            fail(field_name, f"must be a tuple of {what}, got the string {value!r}; for one name write ({value!r},)")
        if not isinstance(value, (tuple, list)):
            fail(field_name, f"must be a tuple of {what}, got {type(value).__name__} {value!r}")
        stray = [v for v in value if not isinstance(v, str)]
        if stray:
            fail(field_name, f"must be a tuple of {what}, got {tuple(value)!r}, where {stray[0]!r} is not a name")

    if not isinstance(op.name, str) or not op.name.isidentifier() or keyword.iskeyword(op.name):
        raise DeclarationError(f"op name must be a Python identifier (an implementation's attribute), got {op.name!r}")
    if not callable(op.reference):
        fail("reference", f"must be callable, got {type(op.reference).__name__}")
    if not isinstance(op.dims, dict):
        fail("dims", f"must be a dict of name -> Dim, got {type(op.dims).__name__}")
    if not isinstance(op.inputs, dict) or not op.inputs:
        fail("inputs", "must be a non-empty dict of name -> Tensor")
    for name, tensor in op.inputs.items():
        if not isinstance(tensor, Tensor):
            fail(f"inputs[{name!r}]", f"must be an oracle.declare.Tensor, got {type(tensor).__name__}")
        if not isinstance(name, str) or not name.isidentifier():
            fail(f"inputs[{name!r}]", "the name must be an identifier")
        for d in tensor.dims:
            scaled = isinstance(d, tuple) and len(d) == 2 and isinstance(d[1], int) and d[1] >= 1
            named = d[0] if scaled else d
            if isinstance(named, str) and named not in op.dims:
                fail(f"inputs[{name!r}].dims", f"{named!r} is not one of dims ({', '.join(op.dims) or 'none declared'})")
            if not (scaled and isinstance(named, str)) and (not isinstance(d, (str, int)) or isinstance(d, bool)):
                fail(f"inputs[{name!r}].dims", f"{d!r} must be a dim's name, (a name, a factor) or an int")
        if tensor.dtype != "case":
            try:
                tensor.fixed_dtype
            except ValueError:
                fail(f"inputs[{name!r}].dtype", f"{tensor.dtype!r} is not a torch dtype ('case', 'float32', "
                                                f"torch.int64, ...)")
        values = tensor.values
        if isinstance(values, str):
            if values != "case" and values not in VALUE_KINDS and values not in PARAMETER_VALUES:
                fail(f"inputs[{name!r}].values", f"{values!r} is none of 'case', {', '.join(VALUE_KINDS)}, "
                                                 f"{', '.join(PARAMETER_VALUES)}")
            if not tensor.floating:
                fail(f"inputs[{name!r}].values", f"{values!r} draws floating values, and the dtype is "
                                                 f"{tensor.fixed_dtype}: an integer or boolean tensor takes "
                                                 f"Integers(low, high) or a callable (shape, dtype, generator, "
                                                 f"device) -> tensor")
        elif isinstance(values, Integers):
            for bound in (values.low, values.high):
                if isinstance(bound, str) and bound not in op.dims:
                    fail(f"inputs[{name!r}].values", f"Integers bound {bound!r} is not one of dims "
                                                     f"({', '.join(op.dims) or 'none declared'})")
                if not isinstance(bound, (str, int)) or isinstance(bound, bool):
                    fail(f"inputs[{name!r}].values", f"Integers bounds are ints or dims' names, got {bound!r}")
        elif not callable(values):
            fail(f"inputs[{name!r}].values", f"must be a kind's name, an Integers or a callable, got "
                                             f"{type(values).__name__} {values!r}")
        if tensor.layout is not None and not isinstance(tensor.layout, bool):
            fail(f"inputs[{name!r}].layout", f"must be True, False or None, got {tensor.layout!r}")
    for name, dim in op.dims.items():
        if not isinstance(dim, Dim):
            fail(f"dims[{name!r}]", f"must be an oracle.declare.Dim, got {type(dim).__name__}")
        if not 1 <= dim.low <= dim.high:
            fail(f"dims[{name!r}]", f"needs 1 <= low <= high, got low={dim.low} high={dim.high}")
        if not isinstance(dim.multiple, int) or dim.multiple < 1 or dim.fit(dim.low) > dim.high:
            fail(f"dims[{name!r}]", f"multiple={dim.multiple!r} leaves no size in [{dim.low}, {dim.high}]")
        odd = [size for size in dim.special if size % dim.multiple]
        if odd:
            fail(f"dims[{name!r}]", f"special sizes {odd} are not multiples of {dim.multiple}")
    if sum(dim.programs for dim in op.dims.values()) > 1:
        fail("dims", "at most one Dim counts programs")
    if not isinstance(op.params, dict):
        fail("params", f"must be a dict of name -> a value, Choice(...) or Fixed(...), got {type(op.params).__name__}")
    for name, value in op.params.items():
        if not isinstance(name, str) or name in op.inputs or not name.isidentifier():
            fail(f"params[{name!r}]", "must be an identifier that is not also an input")
        if isinstance(value, Choice) and not value.values:
            fail(f"params[{name!r}]", "Choice() needs at least one value to draw")
        if isinstance(value, tuple) and len(value) < 2:
            fail(f"params[{name!r}]", f"the bare tuple {value!r} is ambiguous (a bare tuple reads as a choice "
                                      f"among its values): write Fixed({value!r}) to pass the tuple itself, or "
                                      f"Choice(...) to draw one of several values")
    for field_name in _NAME_TUPLES:
        value = getattr(op, field_name)
        if value is not None or field_name != "differentiable":
            names(field_name, value, "input names" if field_name in ("differentiable", "may_clobber") else
                  "output names" if field_name == "outputs" else field_name.replace("_", " "))
    floating = {n for n, t in op.inputs.items() if t.floating}
    for name in op.grads:
        if name not in floating:
            fail("differentiable", f"{name!r} is not a floating input ({', '.join(sorted(floating))})")
    if not op.outputs or len(set(op.outputs)) != len(op.outputs):
        fail("outputs", f"must be distinct names, got {tuple(op.outputs)!r}")
    if not isinstance(op.variants, dict) or not op.variants:
        fail("variants", "must be a non-empty dict of name -> the params it fixes")
    for variant, fixed in op.variants.items():
        if not isinstance(fixed, dict):
            fail(f"variants[{variant!r}]", f"must be a dict of param -> its value, got {fixed!r}")
        stray = set(fixed) - set(op.params)
        if stray:
            fail(f"variants[{variant!r}]", f"fixes {sorted(stray)}, which are not params")
        for name, value in fixed.items():
            if isinstance(value, Choice):
                fail(f"variants[{variant!r}][{name!r}]", f"a variant fixes one value (passed as it is), got {value!r}")
    for name in op.may_clobber:
        if name not in op.inputs:
            fail("may_clobber", f"{name!r} is not an input")
    if not isinstance(op.writes_into, dict):
        fail("writes_into", f"must be a dict of output -> input, got {type(op.writes_into).__name__}")
    for output, buffer in op.writes_into.items():
        if output not in op.outputs or buffer not in op.may_clobber:
            fail("writes_into", f"{output!r} -> {buffer!r} needs an output and an input in may_clobber")
    stray = set(op.dtypes) - set(FLOAT_DTYPES)
    if stray or not op.dtypes:
        fail("dtypes", f"must be some of {', '.join(FLOAT_DTYPES)}, got {tuple(op.dtypes)!r}")
    stray = set(op.value_kinds) - set(VALUE_KINDS)
    if stray or not op.value_kinds:
        fail("value_kinds", f"must be some of {', '.join(VALUE_KINDS)}, got {tuple(op.value_kinds)!r}")
    for grid in _GRIDS:
        entries = getattr(op, grid)
        if isinstance(entries, dict):
            fail(grid, f"must be a tuple of dicts (one per point of the grid), got one dict; write ({entries!r},)")
        if not isinstance(entries, (tuple, list)):
            fail(grid, f"must be a tuple of dicts of dim -> size, got {type(entries).__name__} {entries!r}")
        for sizes in entries:
            if not isinstance(sizes, dict) or set(sizes) != set(op.dims):
                fail(grid, f"each entry must give every dim ({', '.join(op.dims)}), got {sizes!r}")
            bad = {d: size for d, size in sizes.items() if not isinstance(size, int) or isinstance(size, bool)
                   or size < 1 or size % op.dims[d].multiple}
            if bad:
                fail(grid, f"sizes must be positive ints, each a multiple of its Dim's multiple; got {bad} in {sizes!r}")
    if op.scale and op.programs_dim is None:
        fail("scale", "a scale grid needs a Dim with programs=True to judge it on a slice")
    if not isinstance(op.noise, dict):
        fail("noise", f"must be a dict of compared tensor -> noise rule, got {type(op.noise).__name__}")
    stray = set(op.noise) - {*op.outputs, *("d" + n for n in op.grads)}
    if stray:
        fail("noise", f"names {sorted(stray)}, which are not compared tensors")
    if op.reordered is not None and not callable(op.reordered):
        fail("reordered", f"must be callable or None, got {type(op.reordered).__name__}")
    if not callable(op.error_inputs) and not isinstance(op.error_inputs, (tuple, list)):
        fail("error_inputs", f"must be a tuple of ErrorInput or a callable, got {type(op.error_inputs).__name__}")
    if not isinstance(op.summary, str):
        fail("summary", f"must be a string, got {type(op.summary).__name__}")


# --- the OpSpec --------------------------------------------------------------------------------------


def _build(op: Op) -> OpSpec:
    layout_args = op.layout_tensors()
    return OpSpec(
        name=op.name, variants=tuple(op.variants), summary=op.summary or f"declared op {op.name}",
        arg_names=op.arg_names, call=_caller(op), outputs=tuple(op.outputs), differentiable=op.grads,
        reference=op.reference, reference_reordered=op.reordered, takes_compute=False,
        cases=lambda budget, dtypes=FLOAT_DTYPES: _cases(op, budget, dtypes), stratified=lambda dtype, budget:
        _stratified(op, dtype, budget), make_args=lambda case, device: _make_args(op, case, device),
        layout_args=layout_args, layout_of=layout_last_two, sweep=lambda full: _sweep(op, full),
        scale=lambda: _scale(op), programs=_programs(op),
        float64_cases=tuple(_float64_cases(op)), buffers_hold_outputs=dict(op.writes_into),
        may_clobber=tuple(op.may_clobber), fusion=_fusion(op, layout_args),
        error_inputs=op.error_inputs if callable(op.error_inputs) else (lambda: list(op.error_inputs)),
        noise=dict(op.noise), long=lambda case: _is_long(op, case),
    )


def _caller(op: Op) -> Callable:
    names = op.arg_names

    def call(fn, args):
        out = fn(*[args[n] for n in names])
        out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        if len(out) != len(op.outputs):
            raise TypeError(f"{op.name} returned {len(out)} value(s); the declaration names {len(op.outputs)} "
                            f"({', '.join(op.outputs)})")
        return out

    return call


# --- cases ----------------------------------------------------------------------------------------------


def _largest(op: Op, dims: dict) -> int:
    return max(math.prod(t.shape(dims)) for t in op.inputs.values())


def _fit(op: Op, dims: dict, elements: int, programs: int | None) -> dict:
    """Halve sizes (the largest first, the programs dim last) until every tensor holds at most
    ``elements`` and the programs dim at most ``programs``."""
    dims = dict(dims)
    p = op.programs_dim
    if p is not None and programs is not None:
        dims[p] = op.dims[p].fit(min(dims[p], programs))
    while _largest(op, dims) > elements:
        halvable = [n for n in dims if op.dims[n].fit(dims[n] // 2) < dims[n]]
        shrinkable = [n for n in halvable if n != p] or halvable
        if not shrinkable:
            break
        biggest = max(shrinkable, key=lambda n: dims[n])
        dims[biggest] = op.dims[biggest].fit(dims[biggest] // 2)
    return dims


def _size(dim: Dim) -> st.SearchStrategy[int]:
    special = [s for s in dim.special if dim.low <= s <= dim.high]
    m = dim.multiple
    plain = st.integers(-(-dim.low // m), dim.high // m).map(lambda k: k * m)
    return st.one_of(st.sampled_from(special), st.sampled_from(special), plain) if special else plain


def _params(op: Op, variant: str, choose: Callable[[str, tuple], object]) -> dict:
    """The case's params: a variant's fixed ones, ``choose(name, values)`` for each choice (a
    ``Choice``, or a bare tuple: its older spelling), the rest as declared (``Fixed`` unwrapped)."""
    out = {}
    for name, value in op.params.items():
        if name in op.variants[variant]:
            value = op.variants[variant][name]
            out[name] = value.value if isinstance(value, Fixed) else value
        elif isinstance(value, Choice):
            out[name] = choose(name, value.values)
        elif isinstance(value, tuple):
            out[name] = choose(name, value)
        else:
            out[name] = value.value if isinstance(value, Fixed) else value
    return out


def _cases(op: Op, budget: Budget, dtypes) -> st.SearchStrategy[Case]:
    dtypes = [d for d in dtypes if d in op.dtypes or d == "float64"] or list(op.dtypes)
    layouts = LAYOUTS if op.layout_tensors() else ("contiguous",)
    grad_layouts = GRAD_LAYOUTS if op.grads else ("contiguous",)

    @st.composite
    def draw(draw):
        variant = draw(st.sampled_from(tuple(op.variants)))
        p = op.programs_dim
        long = p is not None and draw(C.is_long())
        sizes = {name: draw(_size(dim)) for name, dim in op.dims.items()}
        if long:
            sizes[p] = op.dims[p].fit(draw(long_counts(budget)))
            sizes = _fit(op, sizes, budget.long_elements, None)
        else:
            sizes = _fit(op, sizes, budget.elements, budget.programs)
        return Case(op=op.name, variant=variant, dtype=draw(st.sampled_from(dtypes)), dims=sizes,
                    layout=draw(st.sampled_from(layouts)), values=draw(st.sampled_from(op.value_kinds)),
                    params=_params(op, variant, lambda name, choices: draw(st.sampled_from(choices))),
                    seed=draw(C.seeds()), grad_layout=draw(st.sampled_from(grad_layouts)))

    return draw()


_SHORT_SIZES = (7, 129, 33, 64, 255, 5)


def _short(op: Op, i: int) -> dict:
    sizes = {}
    for j, (name, dim) in enumerate(op.dims.items()):
        size = 3 if dim.programs else _SHORT_SIZES[(i + j) % len(_SHORT_SIZES)]
        sizes[name] = dim.fit(size)
    if op.programs_dim is None:  # short as _is_long measures it: at most four 1024-element blocks
        sizes = _fit(op, sizes, 4 * 1024, None)
    return sizes


def _long(op: Op, i: int, budget: Budget) -> dict:
    """Past the tiles: the programs dim just past a tile boundary, the others small; with no
    programs dim, every size doubled until a tensor holds more than four 1024-element blocks."""
    sizes = {name: dim.fit(5 + i) for name, dim in op.dims.items()}
    p = op.programs_dim
    if p is not None:
        sizes[p] = op.dims[p].fit(C.long_rows(i // 2, budget))
        return _fit(op, sizes, budget.long_elements, None)
    while _largest(op, sizes) <= 4 * 1024 and any(op.dims[n].fit(2 * s) > s for n, s in sizes.items()):
        sizes = {n: op.dims[n].fit(2 * s) for n, s in sizes.items()}
    return sizes


def _is_long(op: Op, case: Case) -> bool:
    p = op.programs_dim
    if p is not None:
        return case.dims.get(p, 0) > TILE_BOUNDARIES[0]
    return _largest(op, case.dims) > 4 * 1024


def _stratified(op: Op, dtype: str, budget: Budget) -> list[Case]:
    """Every variant, layout, gradient layout and kind of values; every other case long."""
    names = tuple(op.variants)
    cycle = tuple(names[i % len(names)] for i in (0, 1, 1, 0)) if len(names) > 1 else names
    layouts = LAYOUTS if op.layout_tensors() else ("contiguous",)
    grad_layouts = GRAD_LAYOUTS if op.grads else ("contiguous",)
    rows = covering(cycle, layouts, grad_layouts, op.value_kinds)
    out = []
    for i, (variant, layout, grad_layout, values) in enumerate(rows):
        sizes = _long(op, i, budget) if i % 2 else _short(op, i)
        params = _params(op, variant, lambda name, choices: choices[i % len(choices)])
        out.append(Case(op.name, variant, dtype, sizes, layout, values, params, seed=1000 + i, grad_layout=grad_layout))
    return out


def _default_grid(op: Op, full: bool) -> list[dict]:
    """Small, medium and long sizes: every dim at a small size, at a medium one, and (with a
    programs dim) many programs of small rows; the full grid's are larger."""
    medium = 4097 if full else 1000
    grids = [{n: d.fit(7) for n, d in op.dims.items()},
             {n: d.fit(24 if d.programs else medium) for n, d in op.dims.items()}]
    p = op.programs_dim
    if p is not None:
        grids.append({n: d.fit((4100 if full else 300) if d.programs else 16) for n, d in op.dims.items()})
    budget = C.GPU_BUDGET if full else C.CPU_BUDGET
    return [_fit(op, g, budget.elements if full else 2**15, None) for g in grids]


def _past_the_medium(op: Op, full: bool) -> list[dict]:
    """The default grid's special sizes: each size a dim declares special above the medium one (the
    block edges a declaration names, 1025 or 4097 columns: where a kernel that drops its last partial
    block goes wrong, and the medium 1000 never reaches), the other dims small, shrunk (never the
    special one) to the grid's budget. A size no tensor of that budget can hold is left out."""
    medium, elements = (4097, C.GPU_BUDGET.elements) if full else (1000, 2**15)
    small = {n: d.fit(7) for n, d in op.dims.items()}
    out = []
    for name, dim in op.dims.items():
        for size in sorted({s for s in dim.special if s > medium and dim.low <= s <= dim.high}):
            sizes = {**small, name: size}
            while _largest(op, sizes) > elements:
                others = [n for n in sizes if n != name and op.dims[n].fit(sizes[n] // 2) < sizes[n]]
                if not others:
                    break
                biggest = max(others, key=sizes.get)
                sizes[biggest] = op.dims[biggest].fit(sizes[biggest] // 2)
            if _largest(op, sizes) <= elements:
                out.append(sizes)
    return out


def _sweep(op: Op, full: bool) -> list[Case]:
    grids = list(op.full_sweep if full and op.full_sweep else op.sweep) or _default_grid(op, full)
    layouts = op.layout_tensors()
    out = []
    for variant in op.variants:
        for dtype in op.dtypes:
            for sizes in grids:
                out.append(Case(op.name, variant, dtype, dict(sizes), "contiguous", "normal",
                                _params(op, variant, lambda n, c: c[0]), seed=len(out)))
            if layouts:  # the medium size in HF's column-major layout, with a strided gradient
                out.append(Case(op.name, variant, dtype, dict(grids[min(1, len(grids) - 1)]), "transposed", "normal",
                                _params(op, variant, lambda n, c: c[0]), seed=len(out),
                                grad_layout="strided" if op.grads else "contiguous"))
            out.append(Case(op.name, variant, dtype, dict(grids[0]), "contiguous",
                            "large" if "large" in op.value_kinds else op.value_kinds[0],
                            _params(op, variant, lambda n, c: c[-1]), seed=len(out)))
    if not (op.full_sweep if full and op.full_sweep else op.sweep):  # appended: the cases above keep their seeds
        out += [Case(op.name, variant, dtype, sizes, "contiguous", "normal", _params(op, variant, lambda n, c: c[0]),
                     seed=len(out) + i) for i, (variant, dtype, sizes) in
                enumerate((v, d, s) for v in op.variants for d in op.dtypes for s in _past_the_medium(op, full))]
    return out


def _scale(op: Op) -> list[Case]:
    return [Case(op.name, variant, dtype, dict(sizes), "contiguous", "normal", _params(op, variant, lambda n, c: c[0]),
                 seed=i) for i, (variant, dtype, sizes) in
            enumerate((v, d, s) for v in op.variants for d in op.dtypes for s in op.scale)]


def _float64_cases(op: Op) -> list[Case]:
    return [Case(op.name, variant, "float64", _short(op, 0), "contiguous", "normal",
                 _params(op, variant, lambda n, c: c[0]), seed=1) for variant in op.variants]


# --- tensors ---------------------------------------------------------------------------------------------


def _make_args(op: Op, case: Case, device) -> dict:
    args = {}
    for name, tensor in op.inputs.items():
        shape, dtype = tensor.shape(case.dims), tensor.dtype_in(case.dtype)
        gen = generator(case, name)
        values = tensor.values
        if isinstance(values, Integers):
            args[name] = values.make(shape, case.dims, gen, dtype).to(device)
        elif callable(values):
            args[name] = values(shape, dtype, gen, torch.device(device))
        elif values in PARAMETER_VALUES:
            args[name] = _parameter(values, shape, gen).to(dtype).to(device)
        else:
            args[name] = fill(shape, dtype, case.values if values == "case" else values, gen, device)
    return args | {name: _plain(value) for name, value in case.params.items()}


def _parameter(kind: str, shape, gen) -> torch.Tensor:
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    if kind == "weight":
        return 1 + 0.1 * x
    if kind == "small":
        return 0.1 * x
    if kind == "positive":
        return x.abs() + 0.1
    return torch.softmax(x, dim=-1)  # probabilities


def _plain(value):
    """Case params come back from JSON: lists for tuples."""
    return tuple(value) if isinstance(value, list) else value


# --- programs (scale), fusion ------------------------------------------------------------------------


def _programs(op: Op) -> Programs | None:
    """Along the programs dim, for an op with a scale grid (the only cases judged on a slice):
    every tensor holding that dim holds it first, and so does every output."""
    p = op.programs_dim
    if p is None or not op.scale:
        return None
    if any(p in t.dims[1:] for t in op.inputs.values()):
        raise DeclarationError(f"op {op.name!r}: scale: the programs dim {p!r} must come first in every tensor")
    holders = {n for n, t in op.inputs.items() if t.dims[:1] == (p,)}

    def size(case: Case) -> tuple[int, int]:
        return case.dims[p], _largest(op, case.dims)

    def args(a: dict, index: torch.Tensor) -> dict:
        return {n: v.index_select(0, index.to(v.device)) if n in holders else v for n, v in a.items()}

    return Programs(unit=p, size=size, args=args, tensor=lambda t, index: t.index_select(0, index.to(t.device)),
                    summed=tuple("d" + n for n in op.grads if n not in holders))


def _fusion(op: Op, layout_args: tuple[str, ...]):
    """Column blocks of one buffer, where the layout tensors share every dim but the last."""
    leading = {op.inputs[n].dims[:-1] for n in layout_args}
    return FUSE_LAST_DIM if layout_args and len(leading) == 1 else None


# --- a KernelBench-style problem ---------------------------------------------------------------------


def from_module(name: str, model: Callable[..., torch.nn.Module], get_inputs: Callable[[], list],
                get_init_inputs: Callable[[], list] = list, outputs: tuple = ("out",), **options) -> Op:
    """An op from a reference ``nn.Module`` and ``get_inputs()`` (a KernelBench problem): the
    forward's inputs keep get_inputs()'s shapes and dtypes, the module's parameters become inputs
    too (so that an implementation is handed the same weights), drawn as the module initialises them.
    Call an implementation module the same way with ``call_module``."""
    torch.manual_seed(0)
    module = model(*get_init_inputs())
    example = get_inputs()
    parameters = dict(module.named_parameters())
    inputs = {}
    for i, x in enumerate(example):
        floating = x.is_floating_point()
        inputs[f"x{i}"] = Tensor(*x.shape, dtype="case" if floating else x.dtype,
                                 values="case" if floating else _example_values(get_inputs, i))
    for pname, p in parameters.items():
        inputs[pname.replace(".", "_")] = Tensor(*p.shape, values=_initial_values(model, get_init_inputs, pname))
    count = len(example)

    def reference(*tensors):
        return call_module(module, tensors[:count], tensors[count:])

    return Op(name, reference=reference, inputs=inputs, outputs=outputs, **options)


def call_module(module: torch.nn.Module, inputs, parameters):
    """``module(*inputs)`` with its parameters replaced by ``parameters``, in ``named_parameters`` order."""
    names = [n for n, _ in module.named_parameters()]
    return torch.func.functional_call(module, dict(zip(names, parameters)), tuple(inputs))


def _example_values(get_inputs, index: int) -> Callable:
    def make(shape, dtype, gen, device):
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
        return get_inputs()[index].to(dtype).to(device)

    return make


def _initial_values(model, get_init_inputs, pname: str) -> Callable:
    def make(shape, dtype, gen, device):
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
        value = dict(model(*get_init_inputs()).named_parameters())[pname]
        return value.detach().to(dtype).to(device)

    return make
