"""The parts of a declaration: how a size is drawn (``Dim``), a tensor argument (``Tensor``), its
integer values (``Integers``), and a parameter's forms (``Choice``, ``Fixed``, ``PerVariant``,
``DtypeChoice``). ``Op`` (op.py) puts them together; oracle re-exports each."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from oracle.declare.spec import DTYPES

PARAMETER_VALUES = {
    "weight": "1 + 0.1 N(0, 1): a norm's scale",
    "small": "0.1 N(0, 1): a bias, a Gemma-style weight",
    "positive": "|N(0, 1)| + 0.1",
    "probabilities": "a softmax of N(0, 1) over the last dim",
}



@dataclass(frozen=True, init=False)
class Choice:
    """A param drawn per case among ``values``: ``params={"eps": Choice(1e-5, 1e-6)}``. The
    report's grid takes the first value and its large-values case the last. ``passed=False``: the
    case records it, and the reference is not given it (what a tensor's values are made from: a
    rotary table's base, ``Choice(10000.0, 500000.0, passed=False)``)."""

    values: tuple
    passed: bool = field(default=True, repr=False)  # a Choice's repr reads as it is usually written

    def __init__(self, *values, passed: bool = True):
        object.__setattr__(self, "values", tuple(values))
        object.__setattr__(self, "passed", passed)


@dataclass(frozen=True)
class Fixed:
    """A param's one value, passed as it is, a tuple included: ``params={"dim": Fixed((-1,))}``,
    ``{"normalized_shape": Fixed((4096,))}``. A value that is no tuple needs no marker."""

    value: object


@dataclass(frozen=True, init=False)
class PerVariant:
    """A value that each variant gives: ``PerVariant(llama=False, gemma=True)``. As a param, it is
    passed to the reference and never recorded in the case (the case's variant says it); as a
    Tensor's ``values``, each variant's kind of values (Gemma's weight around 0, Llama's around 1)."""

    values: dict

    def __init__(self, **values):
        object.__setattr__(self, "values", dict(values))


@dataclass(frozen=True, init=False)
class DtypeChoice:
    """A tensor's dtype drawn per case and recorded in the case's params as ``param``, which is not
    passed to the reference: ``Tensor("cols", dtype=DtypeChoice("weight", same="case",
    float32="float32"))`` records ``"weight": "same"`` or ``"float32"``, a float32 weight beside
    16-bit activations. Each choice is ``"case"`` or a floating dtype's name; the first is the
    report's grid's."""

    param: str
    choices: dict

    def __init__(self, param: str, **choices):
        object.__setattr__(self, "param", param)
        object.__setattr__(self, "choices", dict(choices))


@dataclass(frozen=True)
class Dim:
    """A size the op's tensors share, drawn per case.

    - ``low``, ``high``: its range (``high`` is further capped by the device's budget);
    - ``special``: sizes that break kernels (1, primes, block edges), drawn two times in three (a
      split dim's: products of its sizes, element counts around a kernel's blocks, drawn half the time);
    - ``programs``: this size counts independent programs (rows, tokens; a string names them, for
      messages: ``programs="rows"``). It is drawn within the room the other sizes leave in the
      budget; a third of the drawn cases take it past the kernels' tiles (64, 128, 256); cases at
      scale are judged on a slice along it. Every tensor holding it holds it first;
    - ``multiple``: every size is a multiple of it (a head dim that is rotated in halves: 2);
    - ``split``: up to this many sizes whose product is the dim's size (RMSNorm's one to three
      leading dims, whose product is the row count). A tensor naming the dim holds each of them as a
      dim of its own; the case records the list (``{"lead": [2, 3]}``), and grids give one;
    - ``multiple_of``: another dim's name; every drawn size is a multiple of that dim's size (Q's
      heads of K's kv heads: grouped-query attention), rounded down to it and never below it;
    - ``at_least``: another dim's name; every drawn size is at least that dim's size (a rotary
      table's rows, at least the sequence's tokens);
    - ``per_row``: a split dim that is a whole shape, rows by columns (an element-wise op's
      ``{"shape": [4, 999]}``): two sizes or more, every one but the last counting rows. Cases at
      scale are judged on a slice of its rows, each its own program.
    """

    low: int = 1
    high: int = 1024
    special: tuple[int, ...] = ()
    programs: bool | str = False
    multiple: int = 1
    split: int = 1
    multiple_of: str | None = None
    at_least: str | None = None
    per_row: bool = False

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
class Positions:
    """Position ids of packed sequences, shape (batch, seq): per row, positions restarting at 0 at
    random segment boundaries, different in every row (several documents in one row, as packed
    training makes them). ``whole_first_row``: a case param which, where a case records it as
    ``"one document"``, makes the first row one document 0..seq-1 (positions that reach the last
    row of a table as long as the sequence). A case slice (scale) of a tensor of positions left
    out (``None``: the op's default) takes them as 0..seq-1 in every row."""

    whole_first_row: str | None = None

    def make(self, shape, params: dict, gen: torch.Generator) -> torch.Tensor:
        batch, seq = shape
        positions = torch.stack([_packed_row(seq, gen) for _ in range(batch)]) if batch else \
            torch.zeros(0, seq, dtype=torch.int64)
        if self.whole_first_row is not None and params.get(self.whole_first_row) == "one document":
            positions[0] = torch.arange(seq)
        return positions

    @staticmethod
    def default(batch: int, seq: int, device) -> torch.Tensor:
        """The positions a left-out tensor stands for: 0..seq-1 in every row."""
        return torch.arange(seq, device=device).expand(batch, -1)


def _packed_row(seq: int, gen: torch.Generator) -> torch.Tensor:
    """One row: cuts drawn among the seq - 1 places between tokens, positions counted from each."""
    n_cuts = int(torch.randint(0, max(1, seq // 2) + 1, (1,), generator=gen))
    cuts = torch.randperm(max(1, seq - 1), generator=gen)[:n_cuts] + 1 if seq > 1 else \
        torch.tensor([], dtype=torch.int64)
    starts = torch.zeros(seq, dtype=torch.int64)
    starts[cuts[cuts < seq]] = 1
    segment = starts.cumsum(0)
    index = torch.arange(seq)
    first_of_segment = torch.zeros(int(segment.max()) + 1, dtype=torch.int64).scatter_reduce(
        0, segment, index, reduce="amin", include_self=False)
    return index - first_of_segment[segment]


@dataclass(frozen=True)
class Tensor:
    """One tensor argument.

    - ``dims``: its sizes, outermost first: names of the op's ``Dim``s, ``(name, k)`` for k times a
      dim's size (a head dim twice the rotary tables' half), or fixed ints;
    - ``dtype``: ``"case"`` (the case's dtype: float16, bfloat16, float32, float64), a fixed one
      (``"float32"``, ``torch.int64``, ...), or a ``DtypeChoice`` drawn per case. A fixed floating
      dtype holds in every case but the float64 ones, where every floating input is float64
      (gradcheck's finite differences need it);
    - ``values``: ``"case"`` (the case's kind: normal, large, tiny, zero_rows, outliers, nonfinite),
      one kind always, a parameter's kind (PARAMETER_VALUES), an ``Integers``, ``Positions``, a
      callable ``(shape, dtype, generator, device) -> tensor`` (one that also takes ``params`` is
      given the case's recorded params: a table the params say how to compute), ``None`` (the
      argument is left out: passed as None), or a ``PerVariant`` of those. The named kinds
      are floating values: an integer or boolean tensor takes an ``Integers`` or a callable;
    - ``layout``: whether it is placed in the case's layout (contiguous, transposed, offset, strided);
      default: floating tensors of two or more dims.
    """

    dims: tuple
    dtype: str | torch.dtype | DtypeChoice = "case"
    values: str | Integers | Callable | PerVariant = "case"
    layout: bool | None = None

    def __init__(self, *dims, dtype="case", values="case", layout=None):
        object.__setattr__(self, "dims", tuple(dims))
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "layout", layout)

    def dtype_in(self, case_dtype: str, params: dict | None = None) -> torch.dtype:
        """Its dtype in a case of ``case_dtype`` whose params are ``params`` (a DtypeChoice's record;
        absent, its first choice)."""
        declared = self.dtype
        if isinstance(declared, DtypeChoice):
            declared = declared.choices.get((params or {}).get(declared.param), next(iter(declared.choices.values())))
        if declared == "case":
            return DTYPES[case_dtype]
        fixed = torch_dtype(declared)
        return torch.float64 if case_dtype == "float64" and fixed.is_floating_point else fixed

    @property
    def fixed_dtype(self) -> torch.dtype:
        """The declared dtype itself (raises ValueError where it names no torch dtype)."""
        return torch_dtype(self.dtype)

    @property
    def floating(self) -> bool:
        if isinstance(self.dtype, DtypeChoice):
            return all(c == "case" or torch_dtype(c).is_floating_point for c in self.dtype.choices.values())
        return self.dtype == "case" or self.fixed_dtype.is_floating_point

    def shape(self, dims: dict) -> tuple[int, ...]:
        """Its sizes; a split dim's (a list) each as a dim of its own."""
        out = []
        for d in self.dims:
            size = dims[d] if isinstance(d, str) else dims[d[0]] * d[1] if isinstance(d, tuple) else d
            out += size if isinstance(size, (list, tuple)) else [size]
        return tuple(out)


def torch_dtype(declared) -> torch.dtype:
    """A dtype given as a torch dtype or its name (raises ValueError where it names none)."""
    fixed = declared if isinstance(declared, torch.dtype) else \
        getattr(torch, declared, None) if isinstance(declared, str) else None
    if not isinstance(fixed, torch.dtype):
        raise ValueError(f"{declared!r} is not a torch dtype")
    return fixed
