"""Cases: what one differential run is made of, and the hypothesis strategies that draw them.

A Case holds only small, structural data (op, variant, dtype, dimensions, layout, kind of values,
parameters, seed); torch makes the tensors from it (specs.py), so a case is a line of JSON that
reruns exactly (``python -m oracle.repro``) and hypothesis shrinks the structure, not the numbers.

The strategies below are small named pieces, combined per op by the ``@composite`` functions at
the bottom. Each says what it yields and what it shrinks toward.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from hypothesis import strategies as st

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
LAYOUTS = ("contiguous", "transposed", "offset", "strided")
VALUE_KINDS = ("normal", "large", "tiny", "zero_rows", "outliers", "nonfinite")
MAX_COLUMNS = 65536


@dataclass(frozen=True)
class Budget:
    """How big drawn cases may get: elements per tensor, and programs (rows, tokens) per launch.
    Under the interpreter every program is a Python-level loop iteration, so rows cost far more
    than columns; on a GPU both are cheap."""

    elements: int
    programs: int


CPU_BUDGET = Budget(elements=2**17, programs=48)
GPU_BUDGET = Budget(elements=2**22, programs=2**14)


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
        return f"{self.op}[{self.variant}] {self.dtype} {dims} layout={self.layout} values={self.values} {params} seed={self.seed}"

    @property
    def label(self) -> str:
        """A short, stable name for tables and test ids."""
        dims = "x".join(str(v) if not isinstance(v, list) else "x".join(map(str, v)) for v in self.dims.values())
        return f"{self.op}-{self.variant}-{self.dtype}-{dims}-{self.layout}-{self.values}"


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
    """RMSNorm cases within the budget (rows are programs)."""
    cols = draw(n_cols(min(MAX_COLUMNS, budget.elements)))
    lead = draw(leading_dims(min(budget.programs, max(1, budget.elements // cols))))
    return Case(
        op="rms_norm", variant=draw(st.sampled_from(("llama", "gemma"))), dtype=draw(st.sampled_from(dtypes)),
        dims={"lead": lead, "cols": cols}, layout=draw(layouts()), values=draw(value_kinds()),
        params={"eps": draw(eps_values()), "weight": draw(st.sampled_from(("same", "float32")))},
        seed=draw(seeds()),
    )


@st.composite
def rope_cases(draw, budget: Budget, dtypes=FLOAT_DTYPES) -> Case:
    """RoPE cases: GQA ratios, n_heads not a multiple of 4, head_dim 80/96, packed positions.
    Programs are tokens x groups of 4 heads."""
    head_dim = draw(st.sampled_from((2, 8, 16, 64, 80, 96, 128, 6, 10, 256)))
    kv_heads = draw(st.integers(1, 4))
    n_heads = kv_heads * draw(st.sampled_from((1, 2, 3, 4, 5, 8)))
    batch = draw(st.integers(1, 3))
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
        seed=draw(seeds()),
    )


@st.composite
def swiglu_cases(draw, budget: Budget, op: str = "swiglu", dtypes=FLOAT_DTYPES) -> Case:
    """Element-wise cases, 2-D or 3-D, element counts around the 1024-element block."""
    limit = min(budget.elements, budget.programs * 1024)
    total = min(limit, draw(st.one_of(st.sampled_from((1, 3, 1023, 1024, 1025, 4097)), st.integers(1, limit))))
    rank = draw(st.sampled_from((2, 3)))
    cols = draw(st.integers(1, total))
    rows = max(1, total // cols)
    shape = [rows, cols] if rank == 2 else [max(1, rows // 2), min(rows, 2), cols]
    layout = draw(layouts()) if op == "swiglu" else "contiguous"  # the raw kernels are flat by contract
    return Case(
        op=op, variant="default", dtype=draw(st.sampled_from(dtypes)), dims={"shape": shape}, layout=layout,
        values=draw(st.sampled_from(("normal", "large", "tiny", "outliers", "nonfinite"))), params={},
        seed=draw(seeds()),
    )
