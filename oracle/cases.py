"""Cases: what one differential run is made of, and the hypothesis strategies that draw them.

A Case holds only small, structural data (op, variant, dtype, dimensions, layout, kind of values,
parameters, seed); torch makes the tensors from it (specs.py), so a case is a line of JSON that
reruns exactly (``python -m oracle.repro``) and hypothesis shrinks the structure, not the numbers.

The strategies below are small named pieces, combined per op by the ``@composite`` functions at
the bottom. Each says what it yields and what it shrinks toward.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from hypothesis import strategies as st

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
LAYOUTS = ("contiguous", "transposed", "offset", "strided")
# How the gradient handed to backward sits in memory, as real graphs hand it: dense, transposed,
# sliced out of a wider buffer (row stride larger than the row), or row-broadcast (``(y * v).sum()``
# gives every row the same storage: stride 0 on all but the last dim).
GRAD_LAYOUTS = ("contiguous", "transposed", "offset", "strided", "broadcast")
VALUE_KINDS = ("normal", "large", "tiny", "zero_rows", "outliers", "nonfinite")
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

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

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
        return (f"{self.op}[{self.variant}] {self.dtype} {dims} layout={self.layout}{grad} values={self.values} "
                f"{params} seed={self.seed}")

    @property
    def label(self) -> str:
        """A short, stable name for tables and test ids (a dense gradient is not named, so labels
        of cases made before gradient layouts existed are unchanged)."""
        dims = "x".join(str(v) if not isinstance(v, list) else "x".join(map(str, v)) for v in self.dims.values())
        grad = f"-grad_{self.grad_layout}" if self.grad_layout != "contiguous" else ""
        return f"{self.op}-{self.variant}-{self.dtype}-{dims}-{self.layout}{grad}-{self.values}"


# --- pieces -------------------------------------------------------------------------------------

# Column counts that break kernels: tiny, primes, around powers of two (block boundaries), the maximum.
SPECIAL_COLUMNS = (1, 2, 3, 5, 7, 13, 31, 63, 64, 65, 127, 129, 255, 257, 509, 1000, 1023, 1025, 2047, 4093,
                   4096, 4097, 8191, 16383, 32769, 65521, 65535, MAX_COLUMNS)


def float_dtypes(include_fp64: bool = False) -> st.SearchStrategy[str]:
    """A dtype name; shrinks toward float32."""
    return st.sampled_from(FLOAT_DTYPES + (("float64",) if include_fp64 else ()))


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


def long_counts(budget: Budget) -> st.SearchStrategy[int]:
    """A row or token count just past one of TILE_BOUNDARIES (within the budget), or anywhere up to
    the budget's long_programs; shrinks toward the first boundary + 1."""
    past = [b + d for b in TILE_BOUNDARIES for d in (1, 7) if b + d <= budget.long_programs]
    return st.one_of(st.sampled_from(past), st.integers(past[0], budget.long_programs))


def is_long() -> st.SearchStrategy[bool]:
    """Whether a case takes the long regime (one in three); shrinks toward short."""
    return st.sampled_from((False, False, True))


def value_kinds() -> st.SearchStrategy[str]:
    """The kind of values drawn (see specs.fill_values); shrinks toward normal."""
    return st.sampled_from(VALUE_KINDS)


def eps_values() -> st.SearchStrategy[float]:
    """eps of a norm: HF's usual values, a tiny one and a dominating one; shrinks toward 1e-6."""
    return st.sampled_from((1e-6, 1e-5, 1e-12, 0.1))


def seeds() -> st.SearchStrategy[int]:
    return st.integers(0, 2**31 - 1)


# --- per-op cases -------------------------------------------------------------------------------


@st.composite
def rms_norm_cases(draw, budget: Budget, dtypes=FLOAT_DTYPES) -> Case:
    """RMSNorm cases within the budget (rows are programs); in the long regime, more rows than the
    kernels' tiles hold, with at most budget.long_elements / rows columns."""
    if draw(is_long()):
        rows = draw(long_counts(budget))
        cols = draw(n_cols(max(1, budget.long_elements // rows)))
        lead = [rows] if draw(st.booleans()) else [2, -(-rows // 2)]
    else:
        cols = draw(n_cols(min(MAX_COLUMNS, budget.elements)))
        lead = draw(leading_dims(min(budget.programs, max(1, budget.elements // cols))))
    return Case(
        op="rms_norm", variant=draw(st.sampled_from(("llama", "gemma"))), dtype=draw(st.sampled_from(dtypes)),
        dims={"lead": lead, "cols": cols}, layout=draw(layouts()), values=draw(value_kinds()),
        params={"eps": draw(eps_values()), "weight": draw(st.sampled_from(("same", "float32")))},
        seed=draw(seeds()), grad_layout=draw(grad_layouts()),
    )


@st.composite
def rope_cases(draw, budget: Budget, dtypes=FLOAT_DTYPES) -> Case:
    """RoPE cases: GQA ratios, n_heads not a multiple of 4 or 8, head_dim 80/96, packed positions.
    Programs are tokens x groups of heads. In the long regime, sequences past 64, 128 and 256 tokens
    of few, small heads."""
    head_dim = draw(st.sampled_from((2, 8, 16, 64, 80, 96, 128, 6, 10, 256)))
    kv_heads = draw(st.integers(1, 4))
    n_heads = kv_heads * draw(st.sampled_from((1, 2, 3, 4, 5, 8)))
    batch = draw(st.integers(1, 3))
    if draw(is_long()):
        batch, seq = 1, draw(long_counts(budget))
        head_dim = draw(st.sampled_from((2, 8, 16, 6, 10)))
        n_heads = min(n_heads, max(kv_heads, budget.long_elements // (seq * head_dim) // kv_heads * kv_heads))
    else:
        groups = -(-n_heads // 4)
        room = min(budget.programs // (batch * groups), budget.elements // (batch * n_heads * head_dim))
        seq = draw(st.integers(1, max(1, room)))
    variant = draw(st.sampled_from(("plain", "packed")))
    return Case(
        op="rope", variant=variant, dtype=draw(st.sampled_from(dtypes)),
        dims={"batch": batch, "heads": n_heads, "kv_heads": kv_heads, "seq": seq, "head_dim": head_dim,
              "max_pos": seq + draw(st.integers(0, 64))},
        layout=draw(layouts()), values=draw(st.sampled_from(("normal", "large", "tiny", "outliers", "nonfinite"))),
        params={"theta": draw(st.sampled_from((10000.0, 500000.0, 1e6))),
                "rope_type": draw(st.sampled_from(("default", "linear", "llama3"))),
                "table": draw(st.sampled_from(("float32", "model")))},
        seed=draw(seeds()), grad_layout=draw(grad_layouts()),
    )


@st.composite
def elementwise_cases(draw, budget: Budget, op: str, autograd: bool, dtypes=FLOAT_DTYPES) -> Case:
    """Element-wise cases, 2-D or 3-D, element counts around the 1024-element block. Raw kernels
    (``autograd`` False) are flat by contract and have no backward of their own: contiguous only."""
    limit = min(budget.elements, budget.programs * 1024)
    total = min(limit, draw(st.one_of(st.sampled_from((1, 3, 1023, 1024, 1025, 4097)), st.integers(1, limit))))
    rank = draw(st.sampled_from((2, 3)))
    cols = draw(st.integers(1, total))
    rows = max(1, total // cols)
    shape = [rows, cols] if rank == 2 else [max(1, rows // 2), min(rows, 2), cols]
    raw = not autograd
    return Case(
        op=op, variant="default", dtype=draw(st.sampled_from(dtypes)), dims={"shape": shape},
        layout="contiguous" if raw else draw(layouts()),
        values=draw(st.sampled_from(("normal", "large", "tiny", "outliers", "nonfinite"))), params={},
        seed=draw(seeds()), grad_layout="contiguous" if raw else draw(grad_layouts()),
    )


def past_tiles(case: Case) -> bool:
    """Whether a case goes past the kernels' first tiling boundary: more than 64 rows or tokens, or
    more than four 1024-element blocks."""
    dims = case.dims
    if "lead" in dims:
        return math.prod(dims["lead"]) > TILE_BOUNDARIES[0]
    if "seq" in dims:
        return dims["seq"] > TILE_BOUNDARIES[0]
    return math.prod(dims.get("shape", [])) > 4 * 1024


# --- stratified cases: every variant, layout, gradient layout and kind of values at least once ----


def covering(*axes: tuple) -> list[tuple]:
    """Rows that together take every value of every axis at least once: row i takes each axis's
    i-th value, wrapping around the shorter axes. As many rows as the longest axis has values."""
    return [tuple(axis[i % len(axis)] for axis in axes) for i in range(max(len(axis) for axis in axes))]


def _long_rows(i: int, budget: Budget) -> int:
    """Rows or tokens just past the i-th tile boundary the budget allows."""
    past = [b + 1 for b in TILE_BOUNDARIES if b + 1 <= budget.long_programs]
    return past[i % len(past)]


def rms_norm_stratified(dtype: str, budget: Budget) -> list[Case]:
    """Every variant, input layout, gradient layout and kind of values; every other case long
    (rows past 64, 128, 256), so tail rows and tiles are judged in every run."""
    out = []
    # variants cycle as (a, b, b, a) so that each is drawn both short and long
    rows = covering(("llama", "gemma", "gemma", "llama"), LAYOUTS, GRAD_LAYOUTS, VALUE_KINDS, (7, 129, 1000, 64, 255, 33))
    for i, (variant, layout, grad_layout, values, cols) in enumerate(rows):
        if i % 2:
            lead, cols = [_long_rows(i // 2, budget)], 5 + i
        else:
            lead = [3, 5]
        out.append(Case("rms_norm", variant, dtype, {"lead": lead, "cols": cols}, layout, values,
                        {"eps": 1e-6, "weight": ("same", "float32")[i // 2 % 2]}, seed=1000 + i, grad_layout=grad_layout))
    return out


def rope_stratified(dtype: str, budget: Budget) -> list[Case]:
    """Every variant, layout, gradient layout and kind of values; GQA with a head count that is not a
    multiple of the head group; every other case a long sequence (past 64, 128, 256 tokens)."""
    out = []
    rows = covering(("plain", "packed", "packed", "plain"), LAYOUTS, GRAD_LAYOUTS,
                    ("normal", "large", "tiny", "outliers", "nonfinite"))
    for i, (variant, layout, grad_layout, values) in enumerate(rows):
        if i % 2:
            dims = {"batch": 1, "heads": 3, "kv_heads": 1, "seq": _long_rows(i // 2, budget), "head_dim": 8}
        else:
            dims = {"batch": 2, "heads": 6, "kv_heads": 2, "seq": 5, "head_dim": (80, 16, 64)[i // 2 % 3]}
        dims["max_pos"] = dims["seq"] + 9
        out.append(Case("rope", variant, dtype, dims, layout, values,
                        {"theta": 10000.0, "rope_type": ("default", "llama3", "linear")[i % 3],
                         "table": ("float32", "model")[i // 2 % 2]}, seed=1000 + i, grad_layout=grad_layout))
    return out


def elementwise_stratified(op: str, autograd: bool) -> Callable[[str, Budget], list[Case]]:
    """Every kind of values (and, for an autograd op, every layout and gradient layout); every other
    case past four 1024-element blocks with a partial last block."""
    def stratified(dtype: str, budget: Budget) -> list[Case]:
        raw = not autograd
        rows = covering(("contiguous",) if raw else LAYOUTS, ("contiguous",) if raw else GRAD_LAYOUTS,
                        ("normal", "large", "tiny", "outliers", "nonfinite"))
        return [Case(op, "default", dtype, {"shape": [5, 1001] if i % 2 else [3, 257]}, layout, values, {},
                     seed=1000 + i, grad_layout=grad_layout)
                for i, (layout, grad_layout, values) in enumerate(rows)]

    return stratified
