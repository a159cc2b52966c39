"""What a spec is: one declarative ``OpSpec`` per op says how to draw a case, make its tensors, call
it, and what to compare; plus the helpers op modules build specs from (values, layouts; the rounding
helpers are oracle/noise/rounding.py's, re-exported).

Note [Specs]
    The specs themselves live one op module each under oracle/ops/, collected in
    ``oracle.declare.registry.SPECS`` (docs/design.md §6). Tests, report, gate, the built-in implementations and
    the benchmark iterate over it; nothing else knows about individual ops. A spec holds values,
    never test names: anything an op cannot do is a field, with the reason next to it.

A spec's ``call(fn, args)`` calls an implementation *or* a reference with the contract's signature
(docs/design.md §2), so one function drives both sides of the comparison.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from hypothesis import strategies as st

from oracle import cases as C
from oracle.cases import Case
from oracle.checks.exact import promised
from oracle.checks.memory import CONTIGUOUS, FUSE_LAST_DIM, Fusion, Layout
# The op modules' rounding helpers, defined once with every other rounding (oracle/noise/rounding.py):
# u of a dtype, the most rounding to it can lose, and the dtype HF upcasts to.
from oracle.noise.rounding import compute_dtype, rounding_error, unit_roundoff  # noqa: F401 - re-exported
from oracle.cases.scale import AT_SCALE_ELEMENTS

# What other modules use (op modules build specs from these); the rest is internal. A user's code
# imports from ``oracle``.
__all__ = ["DTYPES", "ErrorInput", "OpSpec", "Programs", "compute_dtype", "fill", "generator", "layout_bshd",
           "layout_last_two", "rounding_error", "unit_roundoff", "upstream_gradient", "wide"]

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class ErrorInput:
    """A bad or unusual input and the answer the contract demands (after PyTorch's OpInfo error_inputs):
    raise ``error``, with a message matching ``match`` that names the argument, before any kernel
    runs (on a GPU, where ``in_kernel_on_gpu``, the kernel that finds it stops the stream with a
    device-side assertion whose message matches, having read and written nothing out of bounds);
    or, where ``error`` is None, return what HF's reference returns for the same arguments. Never a
    silently different result, never a crash (tests/test_bad_inputs.py runs them all)."""

    description: str
    args: Callable[[torch.device], dict]  # device -> arguments by name
    error: type | None = None  # None: the result must be HF's
    match: str = ""
    in_kernel_on_gpu: bool = False  # checked by the kernel on a GPU (data a host read would stall the queue for)

    @property
    def expect(self) -> str:
        return "hf" if self.error is None else "raises"

    @classmethod
    def same_as_hf(cls, description: str, args: Callable[[torch.device], dict]) -> ErrorInput:
        return cls(description, args)


@dataclass(frozen=True)
class Programs:
    """How a case splits into independent programs (RMSNorm's rows, RoPE's tokens, SwiGLU's rows),
    so that a case at production scale is judged on a slice of them (oracle/cases/scale.py, Note [Judging
    a case at scale]). Each program's outputs depend on its own inputs and the shared ones (W, the
    tables) only."""

    unit: str  # what a program is, plural: "rows", "tokens"
    size: Callable[[Case], tuple[int, int]]  # case -> (programs, elements of its largest tensor)
    args: Callable[[dict, torch.Tensor], dict]  # the arguments, program indices -> those programs alone
    tensor: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # an output, gradient or upstream
    # gradient, program indices -> its part in those programs
    # Gradients summed over every program (RMSNorm's dW): judged whole. Their noise, order noise and
    # ``summed`` entries take the whole case and must work in bounded memory (chunk by chunk).
    summed_gradients: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class OpSpec:
    # --- identity
    name: str  # the implementation's attribute, and the key in its CLOBBERS
    variants: tuple[str, ...]
    summary: str

    # --- calling: the contract's signature
    arg_names: tuple[str, ...]  # the arguments, in call order
    call: Callable[[Callable, dict], tuple]  # (fn, args by name) -> outputs as a tuple
    outputs: tuple[str, ...]  # names of the outputs, in order
    differentiable: tuple[str, ...]  # arguments whose gradients are compared (named "d" + argument)

    # --- references (contract signature, plus ``compute=`` where ``takes_compute``)
    reference: Callable  # HF's maths
    # the same maths in another valid order (the verdict's floor); None: the derived one (oracle/noise)
    reference_reordered: Callable | None = None
    # Whether the references take ``compute`` (the dtype they upcast to; float64 gives the truth).
    # A declared reference does not: its truth is its exact shadow evaluation (oracle/noise).
    takes_compute: bool = True

    # --- drawing cases and making their tensors
    cases: Callable[..., st.SearchStrategy[Case]]  # (budget, dtypes) -> strategy
    stratified: Callable[[str, C.Budget], list[Case]]  # (dtype, budget) -> cases covering every variant,
    # layout, gradient layout and kind of values, short and long: run as @example in every test run
    make_args: Callable[[Case, torch.device], dict]  # contiguous, detached values by argument name
    layout_args: tuple[str, ...]  # arguments placed in the case's layout
    layout_of: Callable[[str, tuple[int, ...]], Layout]  # (layout name, shape) -> Layout
    sweep: Callable[[bool], list[Case]]  # (full) -> the report's fixed grid
    # The scale grid: the sizes people train at, run on a GPU by ``oracle.report --scale`` and
    # ``pytest --scale`` (oracle/cases/scale.py); needs ``programs``.
    scale: Callable[[], list[Case]] = list
    programs: Programs | None = None

    # --- extras
    # Small float64 cases, one per variant at least: the forward against the float64 truth and
    # torch.autograd.gradcheck of a hand-written backward, or (ops outside autograd, the raw kernels)
    # the outputs against HF's formula in float64.
    float64_cases: tuple[Case, ...] = ()
    buffers_hold_outputs: dict[str, str] = field(default_factory=dict)  # output -> argument whose buffer holds it
    # Arguments an implementation may overwrite (its CLOBBERS must stay inside them): RoPE's Q and K,
    # a raw backward's buffers. Everything else is read only.
    may_clobber: tuple[str, ...] = ()
    # Compared tensors every implementation must give with HF's exact bits or HF's rounding steps:
    # name -> "bits" | "rounding" (oracle/checks/exact.py, Note [Two contracts]; a tuple of names
    # means bits); an implementation may declare more of them (its EXACT).
    exact: dict[str, str] = field(default_factory=dict)
    fusion: Fusion | None = FUSE_LAST_DIM  # how the layout args share one storage in real models
    error_inputs: Callable[[], list[ErrorInput]] = list  # bad inputs: raise before any launch, or HF's result
    regressions: tuple[Case, ...] = ()  # cases that once failed, pinned as @example in the generic tests
    long: Callable[[Case], bool] = C.past_tiles  # whether a case goes past the kernels' tiles
    # Compared tensors that are sums over many terms (compare.summation_noise): name ->
    # (float64 args, float64 upstream) -> (sum of |terms| per element, number of terms)
    summed: dict[str, Callable[[dict, dict], tuple[torch.Tensor, int]]] = field(default_factory=dict)
    # Per compared tensor, the rounding noise of HF's evaluation at each element (float64, broadcastable
    # to the tensor), from its error analysis: (args, upstream) -> noise: what the per-element and
    # distribution judgements measure against (compare.py). Empty: derived from the reference
    # (oracle/noise, Note [The derived noise model]); given, it must cover every compared tensor.
    noise: dict[str, Callable[[dict, dict], torch.Tensor]] = field(default_factory=dict)
    # The part of ``noise`` that another valid order of a long sum (a row's sum of squares, a column
    # sum over rows) moves, same signature; tensors not named here sum nothing (compare.py, Note [The
    # distribution judgement]).
    order_noise: dict[str, Callable[[dict, dict], torch.Tensor]] = field(default_factory=dict)
    hf: Callable | None = None  # HF's maths as the contract's callable (``--impl hf``); None: ``reference`` itself

    def __post_init__(self):
        missing = set(self.compared()) - set(self.noise)
        if self.noise and missing:
            raise ValueError(f"spec {self.name}: no noise model for {sorted(missing)} (see compare.py)")
        unknown = set(self.order_noise) - set(self.compared())
        if unknown:
            raise ValueError(f"spec {self.name}: order noise for {sorted(unknown)}, which are not compared")
        if self.scale() and self.programs is None:
            raise ValueError(f"spec {self.name}: a scale grid needs ``programs`` to judge it on a slice")
        if not isinstance(self.exact, dict):
            object.__setattr__(self, "exact", promised(self.exact, self.compared()))
        unknown = set(self.exact) - set(self.compared())
        if unknown:
            raise ValueError(f"spec {self.name}: exact {sorted(unknown)}, which are not compared")
        stray = set(self.may_clobber) - set(self.arg_names)
        if stray:
            raise ValueError(f"spec {self.name}: may_clobber names {sorted(stray)}, which are not arguments")

    def contract_callable(self) -> Callable:
        """HF's maths with the contract's signature: what ``--impl hf`` runs (computing in float64
        for float64 inputs, as the contract says)."""
        if self.hf is not None or not self.takes_compute:
            return self.hf or self.reference
        reference = self.reference

        def hf(*args, **kwargs):
            wide = any(isinstance(a, torch.Tensor) and a.dtype == torch.float64 for a in (*args, *kwargs.values()))
            return reference(*args, **kwargs, compute=torch.float64 if wide else torch.float32)

        return hf

    def grad_names(self) -> tuple[str, ...]:
        return tuple("d" + name for name in self.differentiable)

    def input_layouts(self) -> set[str]:
        """The layouts its cases place inputs in: all of them where any argument follows the case's."""
        return set(C.LAYOUTS) if self.layout_args else {"contiguous"}

    def gradient_layouts(self) -> set[str]:
        """The layouts incoming gradients reach its backward in (contiguous only outside autograd)."""
        return set(C.GRAD_LAYOUTS) if self.differentiable else {"contiguous"}

    def compared(self) -> tuple[str, ...]:
        """Every tensor the verdict judges: the outputs, then the gradients."""
        return self.outputs + self.grad_names()


# --- values -------------------------------------------------------------------------------------


def generator(case: Case, salt: str) -> torch.Generator:
    """A CPU generator for one tensor of a case: the same numbers on every device and worker."""
    return torch.Generator().manual_seed((case.seed * 1_000_003 + sum(map(ord, salt)) * 7919) % 2**63)


def fill(shape, dtype: torch.dtype, kind: str, gen: torch.Generator, device) -> torch.Tensor:
    """Values of one kind (cases.VALUE_KINDS) made on the CPU in fp64, rounded to dtype, then moved.
    A tensor at production scale (oracle/cases/scale.py) is made on its GPU instead, in fp32, by a
    generator of that GPU seeded alike: the host would take minutes and a 17 GB fp64 copy."""
    device = torch.device(device)
    if device.type == "cuda" and math.prod(shape) > AT_SCALE_ELEMENTS:
        gen = torch.Generator(device=device).manual_seed(gen.initial_seed())
        x = torch.randn(shape, generator=gen, dtype=torch.float32, device=device)
    else:
        x = torch.randn(shape, generator=gen, dtype=torch.float64)
    n = x.numel()
    if kind == "large":
        x = x * 1000.0  # squares beyond fp16's range; exp(-e) overflows fp32 for SwiGLU
    elif kind == "tiny":
        x = x * 1e-4  # x^2 far below typical eps: eps dominates; fp16 near its subnormals
    elif kind == "zero_rows" and x.dim() > 0:
        rows = x.reshape(-1, x.shape[-1])
        rows[torch.rand(rows.shape[0], generator=gen, device=x.device) < 0.4] = 0.0
    elif kind == "outliers" and n:
        picks = torch.randint(0, n, (max(1, n // 100),), generator=gen, device=x.device)
        x.view(-1)[picks] *= 1000.0
    elif kind == "nonfinite" and n:
        picks = torch.randint(0, n, (3,), generator=gen, device=x.device)
        for pick, value in zip(picks.tolist(), (math.nan, math.inf, -math.inf)):
            x.view(-1)[pick] = value
    if kind != "nonfinite":
        x = x.clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max)  # no accidental inf from rounding
    return x.to(dtype).to(device)


def upstream_gradient(case: Case, name: str, like: torch.Tensor) -> torch.Tensor:
    """The gradient fed to backward for output ``name`` (HF's output ``like``, whose values the
    aligned kinds follow), seeded, in the output's dtype, of the case's kind (cases.GRAD_KINDS). For
    a row-broadcast gradient layout every row holds the first row's values (materialised here; the
    engine hands backward the stride-0 view)."""
    shape, kind = tuple(like.shape), case.grad_values
    gen = generator(case, "d" + name)
    if kind in ("aligned", "aligned_noisy"):
        grad = _aligned(like.detach(), kind == "aligned_noisy", gen)
    else:
        broadcast_row = case.grad_layout == "broadcast" and len(shape) > 1
        return _broadcast(fill(shape[-1:] if broadcast_row else shape, like.dtype, kind, gen, like.device), case, shape)
    return _broadcast(grad.reshape(-1, shape[-1])[:1] if case.grad_layout == "broadcast" and len(shape) > 1 else grad,
                      case, shape)


def _aligned(output: torch.Tensor, noisy: bool, gen: torch.Generator) -> torch.Tensor:
    """The output itself (non-finite elements zeroed); with ``noisy``, plus normal noise at a hundredth
    of each row's root mean square, rounded to the output's dtype."""
    y = torch.nan_to_num(output.to(torch.float64), nan=0.0, posinf=0.0, neginf=0.0)
    if not noisy:
        return y.to(output.dtype)
    rms = y.pow(2).mean(-1, keepdim=True).sqrt() if y.dim() else y.abs()
    noise = torch.randn(tuple(y.shape), generator=gen, dtype=torch.float64).to(y.device)
    finite = torch.finfo(output.dtype).max
    return (y + 0.01 * rms * noise).clamp(-finite, finite).to(output.dtype)


def _broadcast(grad: torch.Tensor, case: Case, shape: tuple[int, ...]) -> torch.Tensor:
    if case.grad_layout == "broadcast" and len(shape) > 1:
        return grad.reshape(shape[-1:]).expand(shape).contiguous()
    return grad


def wide(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.float64)


def layout_last_two(layout: str, shape: tuple[int, ...]) -> Layout:
    """Layouts for (..., n) tensors: 'transposed' stores the last dim outermost."""
    rank = len(shape)
    if layout == "transposed" and rank >= 2:
        return Layout(order=(rank - 1,) + tuple(range(rank - 1)))
    return _common_layout(layout)


def layout_bshd(layout: str, shape: tuple[int, ...]) -> Layout:
    """Layouts for (batch, heads, seq, head_dim): 'transposed' is HF's (batch, seq, heads, head_dim) storage."""
    if layout == "transposed":
        return Layout(order=(0, 2, 1, 3))
    return _common_layout(layout)


def _common_layout(layout: str) -> Layout:
    if layout == "offset":
        return Layout(offset=7)  # odd: misaligns vectorised loads
    if layout == "strided":
        return Layout(pad=3)  # gaps between rows: writes there are out of bounds
    return CONTIGUOUS
