"""Cases: what one differential run is made of, and the hypothesis strategies that draw them.

A Case holds only small, structural data (op, variant, dtype, dimensions, layout, kind of values,
parameters, seed); torch makes the tensors from it (specs.py), so a case is a line of JSON that
reruns exactly (``python -m oracle.repro``) and hypothesis shrinks the structure, not the numbers.

The strategies below are small named pieces; each op module (oracle/ops/) combines them into its
own ``@composite`` strategy and its stratified cases. Each says what it yields and what it shrinks
toward.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

from hypothesis import strategies as st

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
LAYOUTS = ("contiguous", "transposed", "offset", "strided")
# How the gradient handed to backward sits in memory, as real graphs hand it: dense, transposed,
# sliced out of a wider buffer (row stride larger than the row), or row-broadcast (``(y * v).sum()``
# gives every row the same storage: stride 0 on all but the last dim).
GRAD_LAYOUTS = ("contiguous", "transposed", "offset", "strided", "broadcast")
VALUE_KINDS = ("normal", "large", "tiny", "zero_rows", "outliers", "nonfinite")
# Kinds of incoming gradient, drawn as input values are (oracle/declare/spec.py, upstream_gradient):
# independent normal values; the output itself ("aligned": the direction a norm's backward projects out,
# so its row sum cancels) and the output plus a little noise; 16-bit overflow and underflow inside the
# backward; rows of zeros (ignored tokens); a few outliers.
GRAD_KINDS = ("normal", "aligned", "aligned_noisy", "large", "tiny", "zero_rows", "outliers")
# Input values that already take 16-bit products to their range's end: a gradient larger than a normal
# one on them makes HF's own backward overflow where the truth is a number, a case that judges nothing.
NEAR_RANGE_VALUES = ("large", "outliers", "nonfinite")
# The kinds of gradient no larger than a normal one: the ones NEAR_RANGE_VALUES may take.
MODEST_GRAD_KINDS = ("normal", "tiny", "zero_rows")


def grad_kind_for(values: str, drawn: str) -> str:
    """The kind of incoming gradient a case takes: the one drawn, or normal where the drawn one is
    larger than normal on NEAR_RANGE_VALUES."""
    return "normal" if values in NEAR_RANGE_VALUES and drawn not in MODEST_GRAD_KINDS else drawn


def spread_grad_kinds(values: list[str], kinds: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """Kinds of incoming gradient for rows of the given kinds of values: the first row of normal values
    keeps a normal gradient (the case every kernel is first written for); each other kind is taken
    once where a row allows it (grad_kind_for), the rows near their range first; then the kinds no
    row took, for rows of normal values to be added. Rows beyond the kinds take normal."""
    plain = values.index("normal") if "normal" in values else None
    left, taken = [k for k in kinds if k != "normal" or plain is None], ["normal"] * len(values)
    for near in (True, False):
        for i, kind_of_values in enumerate(values):
            if (kind_of_values in NEAR_RANGE_VALUES) == near and left and i != plain:
                fits = [k for k in left if grad_kind_for(kind_of_values, k) == k]
                if fits:
                    taken[i] = fits[0]
                    left.remove(fits[0])
    return taken, left


MAX_COLUMNS = 65536


@dataclass(frozen=True)
class Budget:
    """How big drawn cases may get: elements per tensor, and programs (rows, tokens) per launch.
    Under the interpreter every program is a Python-level loop iteration, so rows cost far more
    than columns; on a GPU both are cheap. ``long_*``: the "long" regime, a share of the drawn
    cases with many programs and few elements each (many narrow rows, long sequences of small
    heads), which crosses the kernels' tiling and program boundaries (64, 128, 256 rows or tokens)
    at a cost the interpreter can afford."""

    elements: int
    programs: int
    long_programs: int
    long_elements: int


CPU_BUDGET = Budget(elements=2**17, programs=48, long_programs=300, long_elements=2**13)
GPU_BUDGET = Budget(elements=2**22, programs=2**14, long_programs=2**17, long_elements=2**22)
# Row and token counts past which the kernels' tiles and program groups wrap (RMSNorm's backward
# rows per program and per step, RoPE's tokens): the long regime draws just past them.
TILE_BOUNDARIES = (64, 128, 256)
# The elements one program of an element-wise kernel takes: a flat block (past_tiles counts in them).
FLAT_BLOCK = 1024


@dataclass(frozen=True)
class Case:
    op: str  # spec name = the implementation's attribute (rms_norm, rope, swiglu, ...)
    variant: str  # rms_norm: llama | gemma; rope: plain | packed; others: default
    dtype: str  # float32 | float16 | bfloat16 | float64
    dims: dict = field(default_factory=dict)  # op-specific sizes
    layout: str = "contiguous"  # of the main inputs; see LAYOUTS
    values: str = "normal"  # see VALUE_KINDS
    params: dict = field(default_factory=dict)  # eps, theta, rope_type, table dtype, ...
    seed: int = 0
    grad_layout: str = "contiguous"  # of the gradient handed to backward; see GRAD_LAYOUTS
    grad_values: str = "normal"  # the kind of gradient handed to backward; see GRAD_KINDS

    def record(self) -> dict:
        """The case as plain data, as documents store it: a normal gradient is left out, so a case keeps
        the identity it had before gradients had kinds (stored baselines still match it)."""
        data = asdict(self)
        if data["grad_values"] == "normal":
            del data["grad_values"]
        return data

    def to_json(self) -> str:
        """One line of JSON (``record``)."""
        return json.dumps(self.record(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Case:
        try:
            data = json.loads(text)
            return cls(**data)
        except (json.JSONDecodeError, TypeError) as exc:
            raise ValueError(f"not a case: {exc}: {text[:200]}") from exc

    def summary(self) -> str:
        dims = " ".join(f"{k}={v}" for k, v in self.dims.items())
        params = " ".join(f"{k}={v}" for k, v in self.params.items())
        grad = f" grad_layout={self.grad_layout}" if self.grad_layout != "contiguous" else ""
        grad += f" grad_values={self.grad_values}" if self.grad_values != "normal" else ""
        return (f"{self.op}[{self.variant}] {self.dtype} {dims} layout={self.layout}{grad} values={self.values} "
                f"{params} seed={self.seed}")

    @property
    def label(self) -> str:
        """A short, stable name for tables and test ids (a dense gradient is not named, so labels
        of cases made before gradient layouts existed are unchanged)."""
        dims = "x".join(str(v) if not isinstance(v, list) else "x".join(map(str, v)) for v in self.dims.values())
        grad = f"-grad_{self.grad_layout}" if self.grad_layout != "contiguous" else ""
        grad += f"-dy_{self.grad_values}" if self.grad_values != "normal" else ""
        return f"{self.op}-{self.variant}-{self.dtype}-{dims}-{self.layout}{grad}-{self.values}"


# --- pieces -------------------------------------------------------------------------------------

# Column counts that break kernels: tiny, primes, around powers of two (block boundaries), the maximum.
SPECIAL_COLUMNS = (1, 2, 3, 5, 7, 13, 31, 63, 64, 65, 127, 129, 255, 257, 509, 1000, 1023, 1025, 2047, 4093,
                   4096, 4097, 8191, 16383, 32769, 65521, 65535, MAX_COLUMNS)


def n_cols(max_cols: int = MAX_COLUMNS) -> st.SearchStrategy[int]:
    """A column count in [1, max_cols]: two in three from SPECIAL_COLUMNS, else uniform; shrinks toward 1."""
    special = [c for c in SPECIAL_COLUMNS if c <= max_cols]
    return st.one_of(st.sampled_from(special), st.sampled_from(special), st.integers(1, max_cols))


@st.composite
def leading_dims(draw, max_rows: int) -> list[int]:
    """1 to 3 leading sizes whose product is at most max_rows (at least 1 each); shrinks toward [1]."""
    dims, room = [], max(1, max_rows)
    for _ in range(draw(st.integers(1, 3))):
        dims.append(draw(st.integers(1, room)))
        room = max(1, room // dims[-1])
    return dims


def layouts() -> st.SearchStrategy[str]:
    """A memory layout for the main inputs; shrinks toward contiguous."""
    return st.sampled_from(LAYOUTS)


def grad_layouts() -> st.SearchStrategy[str]:
    """A memory layout for the gradient handed to backward; shrinks toward contiguous."""
    return st.sampled_from(GRAD_LAYOUTS)


def grad_kinds() -> st.SearchStrategy[str]:
    """A kind of gradient handed to backward (GRAD_KINDS); shrinks toward normal."""
    return st.sampled_from(GRAD_KINDS)


def long_counts(budget: Budget) -> st.SearchStrategy[int]:
    """A row or token count just past one of TILE_BOUNDARIES (within the budget), or anywhere up to
    the budget's long_programs; shrinks toward the first boundary + 1."""
    past = [b + d for b in TILE_BOUNDARIES for d in (1, 7) if b + d <= budget.long_programs]
    return st.one_of(st.sampled_from(past), st.integers(past[0], budget.long_programs))


def is_long() -> st.SearchStrategy[bool]:
    """Whether a case takes the long regime (one in three); shrinks toward short."""
    return st.sampled_from((False, False, True))


def value_kinds() -> st.SearchStrategy[str]:
    """The kind of values drawn (VALUE_KINDS, made by oracle.declare.spec.fill); shrinks toward normal."""
    return st.sampled_from(VALUE_KINDS)


def eps_values() -> st.SearchStrategy[float]:
    """eps of a norm: HF's usual values, a tiny one and a dominating one; shrinks toward 1e-6."""
    return st.sampled_from((1e-6, 1e-5, 1e-12, 0.1))


def seeds() -> st.SearchStrategy[int]:
    return st.integers(0, 2**31 - 1)


# --- where cases go past the kernels' tiles, and stratified cases ------------------------------


def past_tiles(case: Case) -> bool:
    """Whether a case goes past the kernels' first tiling boundary: more than 64 rows or tokens, or
    more than four 1024-element blocks."""
    dims = case.dims
    if "lead" in dims:
        return math.prod(dims["lead"]) > TILE_BOUNDARIES[0]
    if "seq" in dims:
        return dims["seq"] > TILE_BOUNDARIES[0]
    return math.prod(dims.get("shape", [])) > 4 * FLAT_BLOCK


def covering(*axes: tuple) -> list[tuple]:
    """Rows that together take every value of every axis at least once: row i takes each axis's
    i-th value, wrapping around the shorter axes. As many rows as the longest axis has values."""
    return [tuple(axis[i % len(axis)] for axis in axes) for i in range(max(len(axis) for axis in axes))]


def long_rows(i: int, budget: Budget) -> int:
    """Rows or tokens just past the i-th tile boundary the budget allows."""
    past = [b + 1 for b in TILE_BOUNDARIES if b + 1 <= budget.long_programs]
    return past[i % len(past)]
