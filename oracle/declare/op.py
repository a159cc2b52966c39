"""Declaring an op: everything the harness needs to judge any implementation of it, as data (the
classes a user writes; validate.py checks a declaration, build.py makes its OpSpec).

Note [Declaring an op]
    An ``Op`` names the op, gives its reference (a plain PyTorch function, or HF's own code), says
    how its inputs are made (``Tensor``: which sizes, dtype and values; ``Dim``: how a size is
    drawn), which inputs are differentiable, what an implementation may overwrite, its variants and
    parameters. From that the harness builds the same ``OpSpec`` its built-in ops have
    (oracle/declare/spec.py): hypothesis cases, stratified cases, the report's grid, float64 cases, the
    scale slice (where a ``Dim`` counts programs), and the noise model of the verdict, derived from
    the reference (oracle/noise, Note [The derived noise model]). So every check runs on it:
    the verdict, aliasing, guard bands, version counters, determinism, the float64 check.

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

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from oracle.cases import FLOAT_DTYPES, GRAD_KINDS, VALUE_KINDS
from oracle.declare.build import build_spec
from oracle.declare.parts import (PARAMETER_VALUES, Choice, Dim, DtypeChoice, Fixed, Integers, PerVariant,  # noqa: F401
                                  Positions, Tensor)
from oracle.declare.spec import OpSpec
from oracle.declare.validate import LISTED_FIELDS, validate
from oracle.errors import DeclarationError  # noqa: F401 - raised here, and where its users look for it

# The declaration API, which ``oracle`` re-exports; the rest is internal.
__all__ = ["PARAMETER_VALUES", "Choice", "Dim", "DtypeChoice", "Fixed", "Integers", "Op", "PerVariant", "Positions",
           "Tensor", "call_module", "from_module"]

# Kinds of values beside the case's own (cases.VALUE_KINDS): what parameters usually look like.
@dataclass(frozen=True, eq=False)
class Op:
    """A declared op (Note [Declaring an op]). Fields beyond the first four are optional:

    - ``params``: non-tensor arguments, each a value (passed as it is), ``Choice(a, b, ...)`` (one
      drawn per case), ``Fixed(value)`` (a tuple passed as it is) or ``PerVariant(...)`` (the
      variant's value, not recorded in the case). A bare tuple of two or more values reads as a
      ``Choice`` (the older spelling); a bare tuple of one is refused, as ambiguous;
    - ``differentiable``: inputs whose gradients are compared (default: every floating input,
      whatever its dtype; ``()`` for none);
    - ``outputs``: names of what the reference returns, in order;
    - ``variants``: name -> the params it fixes (``{"tanh": {"approximate": "tanh"}, ...}``), or a
      tuple of names where ``PerVariant`` params say what differs;
    - ``exact``: compared tensors (outputs, ``"d" + input``) every implementation must give with the
      reference's exact bits (a copy, a gather; oracle/checks/exact.py), or a dict of them ->
      ``"bits"`` or ``"rounding"`` (HF's rounding steps, given float32 values within K ULPs: Note
      [Two contracts]);
    - ``may_clobber``: inputs an implementation may overwrite (declared in its CLOBBERS);
      ``writes_into``: output -> the input whose buffer must hold it (a raw kernel's contract);
    - ``dtypes``, ``value_kinds``, ``grad_kinds``: what cases are drawn in (``grad_kinds``: the kinds of
      incoming gradient, cases.GRAD_KINDS: normal, along the output, 16-bit overflow and underflow,
      zero rows, outliers);
    - ``sweep``, ``full_sweep``, ``scale``: the report's quick and full grids and the scale grid, each
      a tuple of dicts giving every dim's size: ``sweep=({"rows": 7, "cols": 7}, {"rows": 24, "cols":
      1000})`` (default: derived from the dims; ``full_sweep`` falls back to ``sweep``; no scale grid).
      A grid of points (dicts with ``"dims"``, and any of ``layout``, ``values``, ``params``,
      ``grad_layout``, ``dtypes``, ``variants``) is taken as written: one case per point, variant and
      dtype (of those the point names);
    - ``noise``, ``order_noise``, ``summed``, ``reordered``: a hand-written noise model (per compared
      tensor, and the part of it another order moves), the sums among the compared tensors
      (OpSpec.summed) and a reordered reference, where one is tighter than the derived ones
      (oracle/verdict, oracle/declare/spec.py);
    - ``error_inputs``: bad inputs and what they must give (specs.ErrorInput);
    - ``regressions``, ``float64_cases``: cases pinned as @example in every run (once failed), and
      the float64 check's cases (default: one small one per variant); each a dict of
      ``variant``, ``dtype`` (not for float64 cases), ``dims``, ``layout``, ``values``, ``params``,
      ``seed``, ``grad_layout``, of which ``dims`` is needed;
    - ``summary``: one line for tables;
    - ``layout_of``: how a case's layout places a tensor (oracle/declare/spec.py): by default
      ``layout_last_two`` ('transposed' stores the last dim outermost); ``layout_bshd`` for
      (batch, heads, seq, head_dim) tensors, whose 'transposed' is HF's (batch, seq, heads,
      head_dim) storage and whose layout tensors may be heads of one fused QKV projection;
    - ``hf``: HF's maths as the contract's callable (``--impl hf``), where the reference is not one: a
      raw kernel's, outside autograd or writing into its buffers (default: the reference itself).
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
    exact: tuple | dict = ()
    writes_into: dict = field(default_factory=dict)
    dtypes: tuple = FLOAT_DTYPES
    value_kinds: tuple = VALUE_KINDS
    grad_kinds: tuple = GRAD_KINDS
    sweep: tuple = ()
    full_sweep: tuple = ()
    scale: tuple = ()
    noise: dict = field(default_factory=dict)
    order_noise: dict = field(default_factory=dict)
    summed: dict = field(default_factory=dict)
    reordered: Callable | None = None
    error_inputs: tuple | Callable = ()
    regressions: tuple = ()
    float64_cases: tuple = ()
    summary: str = ""
    layout_of: Callable | None = None
    hf: Callable | None = None

    def __post_init__(self):
        if isinstance(self.variants, (tuple, list)) and all(isinstance(v, str) for v in self.variants):
            object.__setattr__(self, "variants", {name: {} for name in self.variants})
        validate(self)
        for name in LISTED_FIELDS:  # a list given where a tuple belongs is kept as a tuple
            if getattr(self, name) is not None and not isinstance(getattr(self, name), dict):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "_spec", None)

    @property
    def spec(self) -> OpSpec:
        """The OpSpec the harness runs (built once)."""
        if self._spec is None:
            object.__setattr__(self, "_spec", build_spec(self))
        return self._spec

    # --- what the builders below read ---

    @property
    def tensor_names(self) -> tuple[str, ...]:
        return tuple(self.inputs)

    @property
    def arg_names(self) -> tuple[str, ...]:
        """The reference's arguments: the inputs, then the params it is passed (not a Choice(passed=False))."""
        return tuple(self.inputs) + tuple(n for n, v in self.params.items() if getattr(v, "passed", True))

    @property
    def grads(self) -> tuple[str, ...]:
        if self.differentiable is not None:
            return tuple(self.differentiable)
        return tuple(n for n, t in self.inputs.items() if t.floating)

    @property
    def programs_dim(self) -> str | None:
        return next((name for name, dim in self.dims.items() if dim.programs), None)

    def dtype_choices(self) -> dict[str, DtypeChoice]:
        """The case params that DtypeChoices record, by name."""
        return {t.dtype.param: t.dtype for t in self.inputs.values() if isinstance(t.dtype, DtypeChoice)}

    def layout_tensors(self) -> tuple[str, ...]:
        return tuple(n for n, t in self.inputs.items()
                     if (t.layout if t.layout is not None else (t.floating and len(t.dims) >= 2)))


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
