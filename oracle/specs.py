"""One declarative spec per op: how to draw a case, make its tensors, call it, and what to compare.

Note [Specs]
    Tests (tests/test_ops.py), the report's sweep and the gate iterate over ``SPECS``; nothing
    else knows about individual ops. Adding an op (say GeGLU) means one kernel file and one spec
    here: every differential check, aliasing check, gradcheck, report cell and gate rule then
    covers it. A spec holds values, never test names: anything an op cannot do is a field here,
    with the reason next to it.

A spec's ``call(fn, args)`` calls an implementation *or* a reference with the contract's signature
(docs/design.md §2), so one function drives both sides of the comparison.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from hypothesis import strategies as st

from . import cases as C
from . import reference as R
from .cases import Case
from .memory import CONTIGUOUS, FUSE_HEADS, FUSE_LAST_DIM, Fusion, Layout

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class ErrorInput:
    """A bad or unusual input and the answer the contract demands (after PyTorch's OpInfo error_inputs):
    raise ``error``, with a message matching ``match`` that names the argument, before any kernel
    runs; or, where ``error`` is None, return what HF's reference returns for the same arguments.
    Never a silently different result, never a crash (tests/test_bad_inputs.py runs them all)."""

    description: str
    args: Callable[[torch.device], dict]  # device -> arguments by name
    error: type | None = None  # None: the result must be HF's
    match: str = ""

    @property
    def expect(self) -> str:
        return "hf" if self.error is None else "raises"

    @classmethod
    def same_as_hf(cls, description: str, args: Callable[[torch.device], dict]) -> ErrorInput:
        return cls(description, args)


@dataclass(frozen=True)
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

    # --- references (contract signature plus ``compute=``)
    reference: Callable  # HF's maths
    reference_reordered: Callable  # the same maths in another valid order (the verdict's floor)

    # --- drawing cases and making their tensors
    cases: Callable[..., st.SearchStrategy[Case]]  # (budget, dtypes) -> strategy
    stratified: Callable[[str, C.Budget], list[Case]]  # (dtype, budget) -> cases covering every variant,
    # layout, gradient layout and kind of values, short and long: run as @example in every test run
    make_args: Callable[[Case, torch.device], dict]  # contiguous, detached values by argument name
    layout_args: tuple[str, ...]  # arguments placed in the case's layout
    layout_of: Callable[[str, tuple[int, ...]], Layout]  # (layout name, shape) -> Layout
    sweep: Callable[[bool], list[Case]]  # (full) -> the report's fixed grid

    # --- extras
    # Small float64 cases, one per variant at least: torch.autograd.gradcheck of a hand-written
    # backward, or (ops outside autograd, the raw kernels) the outputs against HF's formula in float64.
    float64_cases: tuple[Case, ...] = ()
    buffers_hold_outputs: dict[str, str] = field(default_factory=dict)  # output -> argument whose buffer holds it
    fusion: Fusion | None = FUSE_LAST_DIM  # how the layout args share one storage in real models
    error_inputs: Callable[[], list[ErrorInput]] = list  # bad inputs: raise before any launch, or HF's result
    regressions: tuple[Case, ...] = ()  # cases that once failed, pinned as @example in the generic tests
    # Compared tensors that are sums over many terms (compare.summation_noise): name ->
    # (float64 args, float64 upstream) -> (sum of |terms| per element, number of terms)
    summed: dict[str, Callable[[dict, dict], tuple[torch.Tensor, int]]] = field(default_factory=dict)
    # Per compared tensor, the rounding noise of HF's evaluation at each element (float64, broadcastable
    # to the tensor), from its error analysis: (args, upstream) -> noise. Every compared tensor needs
    # one: it is what the per-element and distribution judgements measure against (compare.py).
    noise: dict[str, Callable[[dict, dict], torch.Tensor]] = field(default_factory=dict)
    # The part of ``noise`` that another valid order of a long sum (a row's sum of squares, a column
    # sum over rows) moves, same signature; tensors not named here sum nothing (compare.py, Note [The
    # distribution judgement]).
    order_noise: dict[str, Callable[[dict, dict], torch.Tensor]] = field(default_factory=dict)

    def __post_init__(self):
        missing = set(self.compared()) - set(self.noise)
        if missing:
            raise ValueError(f"spec {self.name}: no noise model for {sorted(missing)} (see compare.py)")
        unknown = set(self.order_noise) - set(self.compared())
        if unknown:
            raise ValueError(f"spec {self.name}: order noise for {sorted(unknown)}, which are not compared")

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
    """Values of one kind (cases.VALUE_KINDS) made on the CPU in fp64, rounded to dtype, then moved."""
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    n = x.numel()
    if kind == "large":
        x = x * 1000.0  # squares beyond fp16's range; exp(-e) overflows fp32 for SwiGLU
    elif kind == "tiny":
        x = x * 1e-4  # x^2 far below typical eps: eps dominates; fp16 near its subnormals
    elif kind == "zero_rows" and x.dim() > 0:
        rows = x.reshape(-1, x.shape[-1])
        rows[torch.rand(rows.shape[0], generator=gen) < 0.4] = 0.0
    elif kind == "outliers" and n:
        picks = torch.randint(0, n, (max(1, n // 100),), generator=gen)
        x.view(-1)[picks] *= 1000.0
    elif kind == "nonfinite" and n:
        picks = torch.randint(0, n, (3,), generator=gen)
        for pick, value in zip(picks.tolist(), (math.nan, math.inf, -math.inf)):
            x.view(-1)[pick] = value
    if kind != "nonfinite":
        x = x.clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max)  # no accidental inf from rounding
    return x.to(dtype).to(device)


def upstream_gradient(case: Case, name: str, like: torch.Tensor) -> torch.Tensor:
    """The gradient fed to backward for output ``name``: normal values, seeded, in the output's dtype.
    For a row-broadcast gradient layout every row holds the same values (materialised here; the
    engine hands backward the stride-0 view)."""
    shape = tuple(like.shape)
    if case.grad_layout == "broadcast" and len(shape) > 1:
        row = fill(shape[-1:], like.dtype, "normal", generator(case, "d" + name), like.device)
        return row.expand(shape).contiguous()
    return fill(shape, like.dtype, "normal", generator(case, "d" + name), like.device)


def unit_roundoff(dtype: torch.dtype) -> float:
    """u: the largest relative error of rounding to ``dtype`` (half its epsilon)."""
    return torch.finfo(dtype).eps / 2


def rounding_error(magnitude: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The most that rounding values of this magnitude to ``dtype`` can lose: u |v| while they are
    normal numbers, and half the subnormal spacing where they underflow."""
    info = torch.finfo(dtype)
    return unit_roundoff(dtype) * magnitude + info.smallest_normal * info.eps / 2


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """What HF upcasts to: float32, or float64 for float64 inputs."""
    return torch.promote_types(dtype, torch.float32)


def _wide(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.float64)


def _layout_last_two(layout: str, shape: tuple[int, ...]) -> Layout:
    """Layouts for (..., n) tensors: 'transposed' stores the last dim outermost."""
    rank = len(shape)
    if layout == "transposed" and rank >= 2:
        return Layout(order=(rank - 1,) + tuple(range(rank - 1)))
    return _common_layout(layout)


def _layout_bshd(layout: str, shape: tuple[int, ...]) -> Layout:
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


# --- RMSNorm ------------------------------------------------------------------------------------


def _rms_norm_args(case: Case, device) -> dict:
    dtype = DTYPES[case.dtype]
    shape = tuple(case.dims["lead"]) + (case.dims["cols"],)
    w_dtype = torch.float32 if case.params.get("weight") == "float32" else dtype
    X = fill(shape, dtype, case.values, generator(case, "X"), device)
    # Gemma stores W around 0 (it scales by 1 + W); Llama's W sits around 1.
    w = fill((shape[-1],), torch.float64, "normal", generator(case, "W"), "cpu") * 0.1
    W = (w if case.variant == "gemma" else 1.0 + w).to(w_dtype).to(device)
    return {"X": X, "W": W, "eps": case.params["eps"], "gemma": case.variant == "gemma"}


def _rms_norm_dW_terms(args: dict, upstream: dict) -> tuple[torch.Tensor, int]:
    """dW_j = sum over rows of dY_rj * normed_rj: sum of |terms| per column, and the row count."""
    _, total, rows = _rms_norm_dW_magnitudes(_RmsNormParts(args, upstream))
    return total, rows


def _rms_norm_dX_terms(args: dict, upstream: dict) -> tuple[torch.Tensor, int]:
    """dX = r*g - normed*r*mean(g*normed): a difference of two terms (each a product of rounded
    factors). With one or two columns they nearly cancel, so dX's noise sits at the terms' scale;
    rsqrt's last-bit error on a GPU is enough to move it."""
    p = _RmsNormParts(args, upstream)
    _, first, second = _rms_norm_dX_magnitudes(p)
    return (first + second).reshape(-1, p.n), 3


class _RmsNormParts:
    """RMSNorm's float64 intermediates and unit roundoffs, shared by its noise models.

    Error analysis of HF's evaluation (reference.llama_rms_norm / gemma_rms_norm and their autograd):
    - 1/rms: a sum of n squares in the compute dtype (relative error ~ sqrt(n) u_c typically, n u_c at
      worst) and an rsqrt (correctly rounded on the CPU, ~2 ULPs on a GPU's approximate rsqrt):
      ``rho = u_c * (2 sqrt(n) + 4)`` relative, shared by every element of the row.
    - Llama rounds normed to X's dtype before scaling by W (u_x), and its autograd forms
      g = dY * W in X's dtype (u_x again); Gemma keeps both in the compute dtype (u_c).
    - Of rho, the part another valid order of the sum of squares moves: a sequential sum of n
      positive terms is off by ~sqrt(n/3) u_c relative, and the square root halves it:
      ``rho_order = u_c sqrt(n) / 2`` (the order noise of the distribution judgement).
    """

    def __init__(self, args: dict, upstream: dict):
        X, W = args["X"], args["W"]
        self.gemma = bool(args["gemma"])
        self.n = X.shape[-1]
        self.u_x, self.u_c = unit_roundoff(X.dtype), unit_roundoff(compute_dtype(X.dtype))
        x, w = _wide(X), _wide(W)
        self.r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + args["eps"])
        self.normed = x * self.r
        self.scale = 1.0 + w if self.gemma else w
        self.rho = self.u_c * (2 * math.sqrt(self.n) + 4)
        self.rho_order = self.u_c * math.sqrt(self.n) / 2
        self.dy = _wide(upstream["Y"]) if "Y" in upstream else None
        self.x_dtype, self.y_dtype = X.dtype, torch.promote_types(X.dtype, W.dtype)


def _rms_norm_noise_Y(args: dict, upstream: dict) -> torch.Tensor:
    """|Y| times 1/rms's relative error and the product's rounding in the compute dtype, plus
    (Llama) normed rounded to X's dtype before it is scaled by W."""
    p = _RmsNormParts(args, upstream)
    noise = (p.rho + p.u_c) * (p.normed * p.scale).abs()
    return noise if p.gemma else noise + rounding_error(p.normed.abs(), p.x_dtype) * p.scale.abs()


def _rms_norm_order_Y(args: dict, upstream: dict) -> torch.Tensor:
    p = _RmsNormParts(args, upstream)
    return p.rho_order * (p.normed * p.scale).abs()


def _rms_norm_dX_magnitudes(p: _RmsNormParts) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """g = dY * W, and the magnitudes of dX's two terms r g and normed r mean(g normed)."""
    g = p.dy * p.scale
    return g, (p.r * g).abs(), p.normed.abs() * p.r * (g * p.normed).abs().mean(-1, keepdim=True)


def _rms_norm_noise_dX(args: dict, upstream: dict) -> torch.Tensor:
    """dX = r g - normed r mean(g normed), g = dY * W: both terms' magnitudes times 1/rms's relative
    error and the row mean's summation noise (sqrt(n) u_c), plus (Llama) g's rounding to X's dtype
    carried through both terms. Under cancellation (one or two columns) the terms' scale, not dX's,
    is the room."""
    p = _RmsNormParts(args, upstream)
    g, first, second = _rms_norm_dX_magnitudes(p)
    noise = (p.rho + p.u_c * (math.sqrt(p.n) + 2)) * (first + second)
    if p.gemma:
        return noise
    g_err = rounding_error(g.abs(), p.x_dtype)
    return noise + p.r * g_err + p.normed.abs() * p.r * (g_err * p.normed.abs()).mean(-1, keepdim=True)


def _rms_norm_order_dX(args: dict, upstream: dict) -> torch.Tensor:
    """1/rms's order noise in both terms, and the row mean's (sqrt(n) u_c) in the second."""
    p = _RmsNormParts(args, upstream)
    _, first, second = _rms_norm_dX_magnitudes(p)
    return p.rho_order * (first + second) + p.u_c * math.sqrt(p.n) * second


def _rms_norm_dW_magnitudes(p: _RmsNormParts) -> tuple[torch.Tensor, torch.Tensor, int]:
    """dW_j = sum over rows of dY * normed: the |terms|, their column sums, and the row count."""
    terms = (p.dy * p.normed).abs()
    return terms, terms.reshape(-1, p.n).sum(0), terms.numel() // p.n


def _rms_norm_noise_dW(args: dict, upstream: dict) -> torch.Tensor:
    """dW_j = sum over rows of dY * normed: each term's rounding (Llama: normed to X's dtype, then the
    product in Y's dtype; Gemma: the product in the compute dtype), 1/rms's relative error, and the
    sum's noise (2 sqrt(m) u_c for m rows in any order), summed over the rows."""
    p = _RmsNormParts(args, upstream)
    terms, total, rows = _rms_norm_dW_magnitudes(p)
    if p.gemma:
        per_term = 2 * p.u_c * terms
    else:
        per_term = p.dy.abs() * rounding_error(p.normed.abs(), p.x_dtype) + rounding_error(terms, p.y_dtype)
    return per_term.reshape(-1, p.n).sum(0) + (p.rho + 2 * math.sqrt(rows) * p.u_c) * total


def _rms_norm_order_dW(args: dict, upstream: dict) -> torch.Tensor:
    """Each row's 1/rms order noise, and the column sum's own (sqrt(m) u_c)."""
    p = _RmsNormParts(args, upstream)
    _, total, rows = _rms_norm_dW_magnitudes(p)
    return (p.rho_order + math.sqrt(rows) * p.u_c) * total


def _rms_norm_call(fn, a):
    return (fn(a["X"], a["W"], a["eps"], a["gemma"]),)


def _rms_norm_sweep(full: bool) -> list[Case]:
    cols = (1, 7, 64, 129, 1000, 4096, 4097, 8191, 65536) if full else (1, 7, 129, 1000, 4097, 65536)
    budget = 2**24 if full else 2**15
    out = []
    for variant in ("llama", "gemma"):
        for dtype in C.FLOAT_DTYPES:
            for n in cols:
                rows = max(1, min(4096 if full else 24, budget // n))
                for layout in ("contiguous", "transposed", "strided") if n in (129, 4097) else ("contiguous",):
                    out.append(Case("rms_norm", variant, dtype, {"lead": [rows], "cols": n}, layout, "normal",
                                    {"eps": 1e-6, "weight": "same"}, seed=len(out)))
            out.append(Case("rms_norm", variant, dtype, {"lead": [2, 3], "cols": 255}, "offset", "zero_rows",
                            {"eps": 1e-5, "weight": "float32"}, seed=len(out)))
            # many narrow rows, past every tile boundary, with a row-broadcast gradient
            out.append(Case("rms_norm", variant, dtype, {"lead": [4100 if full else 300], "cols": 16}, "contiguous",
                            "normal", {"eps": 1e-6, "weight": "same"}, seed=len(out), grad_layout="broadcast"))
    return out


def _rms_norm_errors() -> list[ErrorInput]:
    def args(d, X_shape=(2, 4), X_dtype=torch.float32, W_dtype=None, X_device=None, W_device=None, **given):
        gen = torch.Generator().manual_seed(0)
        X = torch.randn(X_shape, generator=gen).to(device=X_device or d, dtype=X_dtype)
        W = torch.randn(X_shape[-1:], generator=gen).to(device=W_device or d, dtype=W_dtype or X_dtype)
        return {"X": X, "W": W, "eps": 1e-6, "gemma": False} | given

    def changed(d, **how):  # the default arguments, some passed through a function
        a = args(d)
        return a | {name: fn(a[name]) for name, fn in how.items()}

    def X_is_W(d):
        X = torch.randn(4, generator=torch.Generator().manual_seed(0)).to(d)
        return {"X": X, "W": X, "eps": 1e-6, "gemma": False}

    raises = [
        ErrorInput("integer X", lambda d: args(d, X_dtype=torch.int32), TypeError, "X must be"),
        ErrorInput("bool X", lambda d: args(d, X_dtype=torch.bool), TypeError, "X must be"),
        ErrorInput("complex X", lambda d: args(d, X_dtype=torch.complex64), TypeError, "X must be"),
        ErrorInput("integer W", lambda d: args(d, W_dtype=torch.int64), TypeError, "W must be"),
        ErrorInput("bf16 W with fp16 X", lambda d: args(d, X_dtype=torch.float16, W_dtype=torch.bfloat16),
                   TypeError, "W must have X's dtype"),
        ErrorInput("fp64 W with fp32 X", lambda d: args(d, W_dtype=torch.float64), TypeError, "W must have X's dtype"),
        ErrorInput("X a nested list", lambda d: args(d, X=[[1.0, 2.0]]), TypeError, r"X must be a torch\.Tensor"),
        ErrorInput("W None", lambda d: args(d, W=None), TypeError, r"W must be a torch\.Tensor"),
        ErrorInput("W length != n_cols", lambda d: args(d, W=torch.randn(5, device=d)), ValueError,
                   r"W must have shape \(n_cols,\)"),
        ErrorInput("2-D W", lambda d: changed(d, W=lambda W: W[None]), ValueError, r"W must have shape \(n_cols,\)"),
        ErrorInput("0-d X", lambda d: args(d, X_shape=()), ValueError, "X must have shape"),
        ErrorInput("more than 65536 columns", lambda d: args(d, X_shape=(1, 65537)), ValueError, "65536"),
        ErrorInput("zero columns", lambda d: args(d, X_shape=(3, 0)), ValueError, "n_cols >= 1"),
        ErrorInput("eps a string", lambda d: args(d, eps="1e-6"), TypeError, "eps must be a real number"),
        ErrorInput("eps None", lambda d: args(d, eps=None), TypeError, "eps must be a real number"),
        ErrorInput("eps a bool", lambda d: args(d, eps=True), TypeError, "eps must be a real number"),
        ErrorInput("eps a tensor", lambda d: args(d, eps=torch.tensor(1e-6)), TypeError, "eps must be a real number"),
        ErrorInput("NaN eps", lambda d: args(d, eps=math.nan), ValueError, "eps must be finite"),
        ErrorInput("negative eps", lambda d: args(d, eps=-1e-6), ValueError, "eps must be finite, >= 0"),
        ErrorInput("infinite eps", lambda d: args(d, eps=math.inf), ValueError, "eps must be finite"),
        ErrorInput("eps beyond float32's range", lambda d: args(d, eps=1e39), ValueError, "float32's largest"),
        ErrorInput("gemma=1", lambda d: args(d, gemma=1), TypeError, "gemma must be a bool"),
        ErrorInput("gemma='no'", lambda d: args(d, gemma="no"), TypeError, "gemma must be a bool"),
        ErrorInput("gemma=None", lambda d: args(d, gemma=None), TypeError, "gemma must be a bool"),
        ErrorInput("W on another device", lambda d: args(d, W_device="meta"), ValueError, "one device"),
        ErrorInput("X on another device", lambda d: args(d, X_device="meta"), ValueError, "one device"),
        ErrorInput("every tensor on meta", lambda d: args(d, X_device="meta", W_device="meta"), ValueError,
                   "kernels run on"),
    ]
    same_as_hf = [
        ErrorInput.same_as_hf("zero rows", lambda d: args(d, X_shape=(0, 4))),
        ErrorInput.same_as_hf("zero-size middle dim", lambda d: args(d, X_shape=(2, 0, 4))),
        ErrorInput.same_as_hf("fp32 W with fp16 X", lambda d: args(d, X_dtype=torch.float16, W_dtype=torch.float32)),
        ErrorInput.same_as_hf("fp32 W with bf16 X, Gemma",
                              lambda d: args(d, X_dtype=torch.bfloat16, W_dtype=torch.float32, gemma=True)),
        ErrorInput.same_as_hf("float64", lambda d: args(d, X_dtype=torch.float64)),
        ErrorInput.same_as_hf("column-major X", lambda d: changed(d, X=lambda X: X.t().contiguous().t())),
        ErrorInput.same_as_hf("expanded X (stride-0 rows)", lambda d: changed(d, X=lambda X: X[:1].expand(3, 4))),
        ErrorInput.same_as_hf("X sliced at an offset", lambda d: args(d, X=torch.randn(5, 6, device=d)[1:3, 1:5])),
        ErrorInput.same_as_hf("X whose four leading dims cannot merge",
                              lambda d: args(d, X=torch.randn(2, 3, 4, 5, 6, device=d).permute(2, 0, 3, 1, 4),
                                             W=torch.randn(6, device=d))),
        ErrorInput.same_as_hf("every other element of W", lambda d: args(d, W=torch.randn(8, device=d)[::2])),
        ErrorInput.same_as_hf("expanded W (stride 0)", lambda d: args(d, W=torch.full((1,), 0.5, device=d).expand(4))),
        ErrorInput.same_as_hf("1-D X", lambda d: args(d, X_shape=(4,))),
        ErrorInput.same_as_hf("X is W", X_is_W),
        ErrorInput.same_as_hf("eps 0", lambda d: args(d, eps=0.0)),
        ErrorInput.same_as_hf("integer eps", lambda d: args(d, eps=1)),
        ErrorInput.same_as_hf("NaN and inf in X",
                              lambda d: args(d, X=torch.tensor([[math.nan, 1.0], [math.inf, -math.inf]], device=d),
                                             W=torch.ones(2, device=d))),
        ErrorInput.same_as_hf("fp16 X whose squares overflow fp16",
                              lambda d: args(d, X=torch.full((2, 4), 300.0, device=d, dtype=torch.float16),
                                             W=torch.ones(4, device=d, dtype=torch.float16))),
        ErrorInput.same_as_hf("X and W requiring grad",
                              lambda d: changed(d, X=lambda X: X.requires_grad_(), W=lambda W: W.requires_grad_())),
    ]
    return raises + same_as_hf


RMS_NORM = OpSpec(
    name="rms_norm", variants=("llama", "gemma"),
    summary="LlamaRMSNorm / GemmaRMSNorm over the last dim; Y, dX, dW",
    arg_names=("X", "W", "eps", "gemma"), call=_rms_norm_call, outputs=("Y",), differentiable=("X", "W"),
    reference=R.rms_norm, reference_reordered=R.rms_norm_reordered,
    cases=lambda budget, dtypes=C.FLOAT_DTYPES: C.rms_norm_cases(budget, dtypes), stratified=C.rms_norm_stratified,
    make_args=_rms_norm_args, layout_args=("X",), layout_of=_layout_last_two, sweep=_rms_norm_sweep,
    float64_cases=(Case("rms_norm", "llama", "float64", {"lead": [2, 3], "cols": 5}, "transposed", "normal",
                        {"eps": 1e-6, "weight": "same"}, seed=1),
                   Case("rms_norm", "gemma", "float64", {"lead": [3], "cols": 6}, "strided", "normal",
                        {"eps": 1e-6, "weight": "same"}, seed=2)),
    error_inputs=_rms_norm_errors,
    summed={"dW": _rms_norm_dW_terms, "dX": _rms_norm_dX_terms},
    noise={"Y": _rms_norm_noise_Y, "dX": _rms_norm_noise_dX, "dW": _rms_norm_noise_dW},
    order_noise={"Y": _rms_norm_order_Y, "dX": _rms_norm_order_dX, "dW": _rms_norm_order_dW},
    regressions=(
        # One column: dX ~ eps/x^2 is a small difference of O(1) terms; HF's autograd order happened
        # to be 13x more accurate than the closed form here. The verdict's floor must cover it.
        Case("rms_norm", "llama", "float32", {"lead": [1], "cols": 1}, "contiguous", "normal",
             {"eps": 1e-06, "weight": "same"}, seed=0),
        # One column again: dW is a single sum over 22 rows of +-1-sized terms; HF's order got it to
        # 1e-7, ours 4e-7. A maximum over one element is one draw of the noise (summation_noise).
        Case("rms_norm", "gemma", "bfloat16", {"lead": [22], "cols": 1}, "contiguous", "normal",
             {"eps": 1e-06, "weight": "float32"}, seed=0),
        # Found on the H200: one row of one or two columns, where dX cancels to ~0 (1e-13 with eps 1e-12)
        # and the GPU's approximate rsqrt leaves 1e-8; HF's autograd happened to return exactly 0.
        Case("rms_norm", "llama", "bfloat16", {"lead": [1], "cols": 1}, "contiguous", "normal",
             {"eps": 1e-12, "weight": "same"}, seed=1),
        Case("rms_norm", "llama", "float32", {"lead": [1], "cols": 2}, "contiguous", "normal",
             {"eps": 1e-06, "weight": "same"}, seed=0),
        # Found by the H200's thorough run of the distribution judgement: a one-column dW is a single
        # element, so its "typical" error is one draw (k 0.0189 and HF 0.0022 scale units, and 0.000145
        # against 0.000101); the sampling allowance must be at least one scale unit's spread.
        Case("rms_norm", "llama", "float32", {"lead": [2, 33], "cols": 1}, "contiguous", "normal",
             {"eps": 1e-06, "weight": "same"}, seed=0),
        Case("rms_norm", "llama", "float16", {"lead": [2, 129], "cols": 1}, "contiguous", "normal",
             {"eps": 1e-12, "weight": "float32"}, seed=1),
    ),
)


# --- RoPE ---------------------------------------------------------------------------------------

_ROPE_SCALING = {"default": {}, "linear": {"factor": 4.0},
                 "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 16}}


def packed_positions(batch: int, seq: int, gen: torch.Generator) -> torch.Tensor:
    """Per row, positions restarting at 0 at random segment boundaries, different in every row."""
    rows = []
    for _ in range(batch):
        n_cuts = int(torch.randint(0, max(1, seq // 2) + 1, (1,), generator=gen))
        cuts = torch.randperm(max(1, seq - 1), generator=gen)[:n_cuts] + 1 if seq > 1 else torch.tensor([], dtype=torch.int64)
        starts = torch.zeros(seq, dtype=torch.int64)
        starts[cuts[cuts < seq]] = 1
        segment = starts.cumsum(0)
        index = torch.arange(seq)
        first_of_segment = torch.zeros(int(segment.max()) + 1, dtype=torch.int64).scatter_reduce(
            0, segment, index, reduce="amin", include_self=False)
        rows.append(index - first_of_segment[segment])
    return torch.stack(rows)


def _rope_args(case: Case, device) -> dict:
    d = case.dims
    dtype = DTYPES[case.dtype]
    Q = fill((d["batch"], d["heads"], d["seq"], d["head_dim"]), dtype, case.values, generator(case, "Q"), device)
    K = fill((d["batch"], d["kv_heads"], d["seq"], d["head_dim"]), dtype, case.values, generator(case, "K"), device)
    table_dtype = dtype if case.params.get("table") == "model" else torch.float32
    rope_type = case.params.get("rope_type", "default")
    cos, sin = R.rotary_table(d["max_pos"], d["head_dim"], case.params.get("theta", 10000.0), rope_type,
                              dtype=table_dtype, **_ROPE_SCALING[rope_type])
    positions = None
    if case.variant == "packed":
        positions = packed_positions(d["batch"], d["seq"], generator(case, "position_ids")).to(device)
    return {"Q": Q, "K": K, "cos": cos.to(device), "sin": sin.to(device), "position_ids": positions}


def _rope_noise(tensor: str, backward: bool) -> Callable[[dict, dict], torch.Tensor]:
    """HF rotates in the model dtype d: the table rows are rounded to d, each of the two products
    x c and rotate_half(x) s is rounded to d, then their sum (the final rounding, ulp(t)). So the
    noise is 2 u_d at the scale of the two products, which is what lets an output that is a small
    difference of two large products differ from the truth by their rounding. Backward is the same
    rotation with -sin applied to the incoming gradient."""
    def noise(args: dict, upstream: dict) -> torch.Tensor:
        Q = args["Q"]
        c, s = R.table_rows(Q, args["cos"], args["sin"], args["position_ids"])  # in Q's dtype: as HF rounds them
        c, s = _wide(c).unsqueeze(1), _wide(s).unsqueeze(1)
        d = Q.dtype
        if backward:
            x = _wide(upstream[tensor])
            half = x.shape[-1] // 2
            rotated = torch.cat((x[..., half:], x[..., :half]), -1)  # rotate_half's transpose, up to sign
            s = torch.cat((s[..., half:], s[..., :half]), -1)  # the sin each of those elements was scaled by
        else:
            x = _wide(args[tensor])
            rotated = R.rotate_half(x)
        table = x.abs() * rounding_error(c.abs(), d) + rotated.abs() * rounding_error(s.abs(), d)
        return table + rounding_error((x * c).abs(), d) + rounding_error((rotated * s).abs(), d)

    return noise


def _rope_call(fn, a):
    return tuple(fn(a["Q"], a["K"], a["cos"], a["sin"], a["position_ids"]))


def _rope_sweep(full: bool) -> list[Case]:
    shapes = [(1, 4, 4, 8, 64), (2, 6, 2, 5, 80), (1, 5, 1, 6, 96), (2, 32, 8, 16, 128)] if not full else \
        [(1, 4, 4, 64, 64), (2, 6, 2, 128, 80), (1, 5, 1, 256, 96), (4, 32, 8, 512, 128), (2, 12, 3, 300, 256)]
    out = []
    for variant in ("plain", "packed"):
        for dtype in C.FLOAT_DTYPES:
            for batch, heads, kv, seq, hd in shapes:
                layout = "transposed" if hd == 80 else "contiguous"
                out.append(Case("rope", variant, dtype, {"batch": batch, "heads": heads, "kv_heads": kv, "seq": seq,
                                                         "head_dim": hd, "max_pos": seq + 16}, layout, "normal",
                                {"theta": 10000.0, "rope_type": "default", "table": "float32"}, seed=len(out)))
            out.append(Case("rope", variant, dtype, {"batch": 2, "heads": 8, "kv_heads": 2, "seq": 4, "head_dim": 128,
                                                     "max_pos": 64}, "offset", "outliers",
                            {"theta": 500000.0, "rope_type": "llama3", "table": "model"}, seed=len(out)))
            # a long sequence of small heads, with a gradient in HF's (batch, seq, heads, head_dim) storage
            out.append(Case("rope", variant, dtype, {"batch": 1, "heads": 3, "kv_heads": 1, "seq": 2100 if full else 300,
                                                     "head_dim": 8, "max_pos": (2100 if full else 300) + 5},
                            "contiguous", "normal", {"theta": 10000.0, "rope_type": "default", "table": "float32"},
                            seed=len(out), grad_layout="transposed"))
    return out


def _rope_errors() -> list[ErrorInput]:
    def args(d, q=(1, 4, 3, 8), k=(1, 2, 3, 8), table=(16, 8), q_dtype=torch.float32, k_dtype=None,
             table_dtype=torch.float32, leaf=False, **given):
        gen = torch.Generator().manual_seed(0)

        def make(shape, dtype):
            return torch.randn(shape, generator=gen).to(device=d, dtype=dtype)

        return {"Q": make(q, q_dtype).requires_grad_(leaf), "K": make(k, k_dtype or q_dtype),
                "cos": make(table, table_dtype), "sin": make(table, table_dtype), "position_ids": None} | given

    def positions(d, rows, dtype=torch.int64):
        return torch.tensor(rows, dtype=dtype, device=d)

    def fused(d, q_columns, k_columns, heads=(4, 2)):
        """Q and K as views of one (batch, seq, columns) projection, as a fused QKV layer makes them."""
        base = torch.randn(1, 3, 48, device=d)
        Q = base[..., q_columns].view(1, 3, heads[0], 8).transpose(1, 2)
        K = base[..., k_columns].view(1, 3, heads[1], 8).transpose(1, 2)
        return args(d, Q=Q, K=K)

    def Q_is_K(d):
        a = args(d, q=(1, 2, 3, 8))
        return a | {"K": a["Q"]}

    def cos_inside_Q(d):
        a = args(d)
        return a | {"cos": a["Q"].view(12, 8), "sin": torch.randn(12, 8, device=d)}

    def meta(d):
        return {name: t.to("meta") if isinstance(t, torch.Tensor) else t for name, t in args(d).items()}

    raises = [
        ErrorInput("Q and K dtypes differ", lambda d: args(d, k_dtype=torch.float16), TypeError, "dtypes must match"),
        ErrorInput("integer Q", lambda d: args(d, q_dtype=torch.int64, k_dtype=torch.float32), TypeError, "Q must be"),
        ErrorInput("bool K", lambda d: args(d, k_dtype=torch.bool), TypeError, "K must be"),
        ErrorInput("complex Q", lambda d: args(d, q_dtype=torch.complex64, k_dtype=torch.float32), TypeError,
                   "Q must be"),
        ErrorInput("integer table", lambda d: args(d, table_dtype=torch.int32), TypeError, "cos must be"),
        ErrorInput("Q None", lambda d: args(d, Q=None), TypeError, r"Q must be a torch\.Tensor"),
        ErrorInput("sin a list", lambda d: args(d, sin=[[0.0] * 8] * 16), TypeError, r"sin must be a torch\.Tensor"),
        ErrorInput("n_heads not a multiple of n_kv_heads", lambda d: args(d, q=(1, 5, 3, 8)), ValueError, "multiple"),
        ErrorInput("Q with zero heads", lambda d: args(d, q=(1, 0, 3, 8)), ValueError, "positive multiple"),
        ErrorInput("K with zero heads", lambda d: args(d, k=(1, 0, 3, 8)), ValueError, "multiple"),
        ErrorInput("head_dim mismatch with the table", lambda d: args(d, table=(16, 6)), ValueError, "cos and sin"),
        ErrorInput("K's head_dim differs", lambda d: args(d, k=(1, 2, 3, 6)), ValueError, "must match Q"),
        ErrorInput("K's batch differs", lambda d: args(d, k=(2, 2, 3, 8)), ValueError, "must match Q"),
        ErrorInput("odd head_dim", lambda d: args(d, q=(1, 4, 3, 7), k=(1, 2, 3, 7), table=(16, 7)), ValueError,
                   "even"),
        ErrorInput("3-D Q", lambda d: args(d, q=(4, 3, 8)), ValueError, "Q must be 4-D"),
        ErrorInput("5-D K", lambda d: args(d, k=(1, 1, 2, 3, 8)), ValueError, "K must be 4-D"),
        ErrorInput("1-D tables", lambda d: args(d, table=(16,)), ValueError, "cos and sin"),
        ErrorInput("cos and sin of different lengths", lambda d: args(d, sin=torch.randn(12, 8, device=d)),
                   ValueError, "cos and sin"),
        ErrorInput("seq longer than the table", lambda d: args(d, q=(1, 4, 20, 8), k=(1, 2, 20, 8)), ValueError,
                   "exceeds"),
        ErrorInput("empty table", lambda d: args(d, table=(0, 8)), ValueError, "exceeds"),
        ErrorInput("position beyond the table", lambda d: args(d, position_ids=positions(d, [[0, 1, 16]])),
                   ValueError, "outside the table"),
        ErrorInput("negative position", lambda d: args(d, position_ids=positions(d, [[0, -1, 2]])),
                   ValueError, "outside the table"),
        ErrorInput("position beyond the table, int32",
                   lambda d: args(d, position_ids=positions(d, [[0, 99, 2]], torch.int32)), ValueError,
                   "outside the table"),
        ErrorInput("position_ids of the wrong shape", lambda d: args(d, position_ids=positions(d, [[0, 1, 2]] * 2)),
                   ValueError, r"\(batch, seq\)"),
        ErrorInput("1-D position_ids", lambda d: args(d, position_ids=positions(d, [0, 1, 2])), ValueError,
                   r"\(batch, seq\)"),
        ErrorInput("float position_ids", lambda d: args(d, position_ids=torch.zeros(1, 3, device=d)), TypeError,
                   "int64 or int32"),
        ErrorInput("bool position_ids", lambda d: args(d, position_ids=torch.zeros(1, 3, dtype=torch.bool, device=d)),
                   TypeError, "int64 or int32"),
        ErrorInput("int16 position_ids", lambda d: args(d, position_ids=positions(d, [[0, 1, 2]], torch.int16)),
                   TypeError, "int64 or int32"),
        ErrorInput("uint8 position_ids (torch would take them as a mask)",
                   lambda d: args(d, position_ids=positions(d, [[0, 1, 2]], torch.uint8)), TypeError, "int64 or int32"),
        ErrorInput("position_ids a list", lambda d: args(d, position_ids=[[0, 1, 2]]), TypeError,
                   r"position_ids must be a torch\.Tensor"),
        ErrorInput("leaf Q requiring grad", lambda d: args(d, leaf=True), ValueError, "in place"),
        ErrorInput("table on another device", lambda d: args(d, cos=torch.randn(16, 8, device="meta")), ValueError,
                   "one device"),
        ErrorInput("position_ids on another device",
                   lambda d: args(d, position_ids=torch.zeros(1, 3, dtype=torch.int64, device="meta")), ValueError,
                   "one device"),
        ErrorInput("every tensor on meta", meta, ValueError, "kernels run on"),
        ErrorInput("Q is K", Q_is_K, ValueError, "Q and K share memory"),
        ErrorInput("K a view of Q's first heads", lambda d: (lambda a: a | {"K": a["Q"][:, :2]})(args(d)), ValueError,
                   "Q and K share memory"),
        ErrorInput("K overlapping Q by one head in a fused projection", lambda d: fused(d, slice(0, 32), slice(24, 40)),
                   ValueError, "Q and K share memory"),
        ErrorInput("expanded Q (stride-0 heads)",
                   lambda d: args(d, Q=torch.randn(1, 1, 3, 8, device=d).expand(1, 4, 3, 8)), ValueError,
                   "Q has elements that share memory"),
        ErrorInput("expanded K (stride-0 batch)",
                   lambda d: args(d, q=(2, 4, 3, 8), K=torch.randn(1, 2, 3, 8, device=d).expand(2, 2, 3, 8)),
                   ValueError, "K has elements that share memory"),
        ErrorInput("unfolded Q (overlapping windows)",
                   lambda d: args(d, Q=torch.randn(1, 4, 10, device=d).unfold(2, 8, 1)), ValueError,
                   "Q has elements that share memory"),
        ErrorInput("cos a view of Q's memory", cos_inside_Q, ValueError, "Q and cos share memory"),
    ]
    same_as_hf = [
        ErrorInput.same_as_hf("int32 position_ids",
                              lambda d: args(d, position_ids=positions(d, [[2, 0, 1]], torch.int32))),
        ErrorInput.same_as_hf("(1, seq) position_ids for a batch of 2",
                              lambda d: args(d, q=(2, 4, 3, 8), k=(2, 2, 3, 8),
                                             position_ids=positions(d, [[2, 0, 1]]))),
        ErrorInput.same_as_hf("column-major position_ids",
                              lambda d: args(d, q=(2, 4, 3, 8), k=(2, 2, 3, 8),
                                             position_ids=positions(d, [[0, 2], [4, 6], [8, 10]]).t())),
        ErrorInput.same_as_hf("positions at the table's last row",
                              lambda d: args(d, position_ids=positions(d, [[15, 0, 15]]))),
        ErrorInput.same_as_hf("packed positions restarting", lambda d: args(d, position_ids=positions(d, [[0, 1, 0]]))),
        ErrorInput.same_as_hf("Q and K interleaved views of a fused projection",
                              lambda d: fused(d, slice(0, 32), slice(32, 48))),
        ErrorInput.same_as_hf("Q and K transposed from (batch, seq, heads, head_dim)",
                              lambda d: args(d, Q=torch.randn(1, 3, 4, 8, device=d).transpose(1, 2),
                                             K=torch.randn(1, 3, 2, 8, device=d).transpose(1, 2))),
        ErrorInput.same_as_hf("float64 table with float32 Q", lambda d: args(d, table_dtype=torch.float64)),
        ErrorInput.same_as_hf("cos float32, sin bfloat16",
                              lambda d: args(d, sin=torch.randn(16, 8, device=d).to(torch.bfloat16))),
        ErrorInput.same_as_hf("cos is sin", lambda d: (lambda a: a | {"sin": a["cos"]})(args(d))),
        ErrorInput.same_as_hf("column-strided table", lambda d: args(d, cos=torch.randn(16, 16, device=d)[:, ::2],
                                                                     sin=torch.randn(16, 16, device=d)[:, 1::2])),
        ErrorInput.same_as_hf("column-major table", lambda d: args(d, cos=torch.randn(8, 16, device=d).t(),
                                                                   sin=torch.randn(8, 16, device=d).t())),
        ErrorInput.same_as_hf("float64", lambda d: args(d, q_dtype=torch.float64, table_dtype=torch.float64)),
        ErrorInput.same_as_hf("bfloat16 Q and K with a float32 table", lambda d: args(d, q_dtype=torch.bfloat16)),
        ErrorInput.same_as_hf("zero batch", lambda d: args(d, q=(0, 4, 3, 8), k=(0, 2, 3, 8))),
        ErrorInput.same_as_hf("zero batch with empty position_ids",
                              lambda d: args(d, q=(0, 4, 3, 8), k=(0, 2, 3, 8),
                                             position_ids=torch.zeros(0, 3, dtype=torch.int64, device=d))),
        ErrorInput.same_as_hf("zero seq", lambda d: args(d, q=(1, 4, 0, 8), k=(1, 2, 0, 8))),
        ErrorInput.same_as_hf("NaN and inf in Q",
                              lambda d: args(d, Q=torch.tensor([math.nan, math.inf, -math.inf, 1.0], device=d)
                                             .repeat(24).view(1, 4, 3, 8))),
        ErrorInput.same_as_hf("as many kv heads as heads", lambda d: args(d, k=(1, 4, 3, 8))),
        ErrorInput.same_as_hf("Q and K requiring grad through a clone",
                              lambda d: (lambda a: a | {"Q": a["Q"].requires_grad_().clone(),
                                                        "K": a["K"].requires_grad_().clone()})(args(d))),
    ]
    return raises + same_as_hf


ROPE = OpSpec(
    name="rope", variants=("plain", "packed"),
    summary="apply_rotary_pos_emb on Q and K, table rows per token (packed sequences); Q, K, dQ, dK",
    arg_names=("Q", "K", "cos", "sin", "position_ids"), call=_rope_call, outputs=("Q_out", "K_out"),
    differentiable=("Q", "K"), reference=R.rope, reference_reordered=R.rope_reordered,
    cases=lambda budget, dtypes=C.FLOAT_DTYPES: C.rope_cases(budget, dtypes), stratified=C.rope_stratified,
    make_args=_rope_args, layout_args=("Q", "K"), layout_of=_layout_bshd, sweep=_rope_sweep, fusion=FUSE_HEADS,
    float64_cases=tuple(Case("rope", variant, "float64", {"batch": 2, "heads": 3, "kv_heads": 1, "seq": 3, "head_dim": 6,
                                                          "max_pos": 8}, "transposed", "normal",
                             {"theta": 10000.0, "rope_type": "default", "table": "float32"}, seed=1)
                        for variant in ("plain", "packed")),
    error_inputs=_rope_errors,
    noise={"Q_out": _rope_noise("Q", False), "K_out": _rope_noise("K", False),
           "dQ": _rope_noise("Q_out", True), "dK": _rope_noise("K_out", True)},
)


# --- SwiGLU and its raw kernels -----------------------------------------------------------------


def _elementwise_args(names: tuple[str, ...]) -> Callable[[Case, torch.device], dict]:
    def make(case: Case, device) -> dict:
        dtype = DTYPES[case.dtype]
        shape = tuple(case.dims["shape"])
        # DW is an incoming gradient: plain normal values whatever the case's kind.
        return {name: fill(shape, dtype, "normal" if name == "DW" else case.values, generator(case, name), device)
                for name in names}

    return make


class _SwigluParts:
    """SwiGLU's float64 intermediates and unit roundoffs, shared by its noise models.

    Error analysis of HF's evaluation (F.silu(e) * g and its autograd): silu is evaluated in the
    compute dtype (exp, a division: a few u_c) and rounded to the model dtype d (u_d); the product
    with g is the final rounding. Autograd forms dh * g in d (u_d), then silu's derivative
    s (1 + e (1 - s)) in the compute dtype (a few u_c more) and rounds the product.
    """

    def __init__(self, args: dict, upstream: dict, incoming: str):
        e = _wide(args["e"])
        self.g = _wide(args["g"])
        self.dtype = args["e"].dtype
        compute = compute_dtype(self.dtype)
        self.u_c = unit_roundoff(compute)
        # exp(-e) overflows the compute dtype below e ~ -88 (fp32): sigmoid flushes to 0, losing up to
        # the compute dtype's smallest normal number, times |e| in silu and its slope.
        self.flushed = torch.finfo(compute).smallest_normal * (1 + e.abs())
        self.sig = torch.sigmoid(e)
        self.f = e * self.sig
        self.silu_slope = self.sig * (1 + e.abs() * (1 - self.sig))  # |terms| of silu'(e)
        # 1 - s is formed from the rounded s: an absolute error of u_c, times |e| s in the slope
        self.slope_noise = self.u_c * (8 * self.silu_slope + 2 * e.abs() * self.sig)
        # the incoming gradient: upstream's for the autograd op, the DW argument for the raw backward
        incoming = upstream.get(incoming, args.get(incoming))
        self.dh = _wide(incoming) if incoming is not None else None


def _swiglu_noise(tensor: str, incoming: str = "h") -> Callable[[dict, dict], torch.Tensor]:
    """h = f g and the gradient of g, dh f: f rounded to d after a few u_c. The gradient of e,
    dh g silu'(e): dh g rounded to d, the slope's terms in the compute dtype."""
    def noise(args: dict, upstream: dict) -> torch.Tensor:
        p = _SwigluParts(args, upstream, incoming)
        if tensor in ("h", "dg"):
            other = p.g if tensor == "h" else p.dh
            f_err = rounding_error(p.f.abs(), p.dtype) + 4 * p.u_c * p.f.abs() + p.flushed
            return other.abs() * f_err
        dh_g = (p.dh * p.g).abs()
        return rounding_error(dh_g, p.dtype) * p.silu_slope + (p.slope_noise + p.flushed) * dh_g

    return noise


_SWIGLU_NOISE = {"h": _swiglu_noise("h"), "de": _swiglu_noise("de"), "dg": _swiglu_noise("dg")}
# The raw backward's df is the gradient of g and de of e, for the incoming gradient DW.
_RAW_BACKWARD_NOISE = {"h": _swiglu_noise("h", "DW"), "df": _swiglu_noise("dg", "DW"), "de": _swiglu_noise("de", "DW")}


def _elementwise_sweep(op: str, autograd: bool) -> Callable[[bool], list[Case]]:
    """The report's grid; an autograd op also transposed, with strided gradients."""
    def sweep(full: bool) -> list[Case]:
        shapes = [[1, 1], [3, 1000], [2, 3, 1025], [64, 4097]] if not full else \
            [[1, 1], [3, 1000], [2, 3, 1025], [1024, 4097], [16, 256, 1024], [4096, 14336]]
        out = []
        for dtype in C.FLOAT_DTYPES:
            for shape in shapes:
                layout = "transposed" if (autograd and len(shape) == 2 and shape[0] > 1) else "contiguous"
                grad_layout = "strided" if layout == "transposed" else "contiguous"
                out.append(Case(op, "default", dtype, {"shape": shape}, layout, "normal", {}, seed=len(out),
                                grad_layout=grad_layout))
            out.append(Case(op, "default", dtype, {"shape": [4, 999]}, "contiguous", "large", {}, seed=len(out)))
        return out

    return sweep


def _swiglu_errors(names: tuple[str, ...], raw: bool) -> Callable[[], list[ErrorInput]]:
    """The error inputs of the autograd op (raw=False) and of the raw kernels, whose arguments are
    ``names``: ("e", "g"), or ("DW", "e", "g") for the backward, which writes into all three."""
    writes_inputs = "DW" in names

    def errors() -> list[ErrorInput]:
        def args(d, shapes=None, dtypes=None, transposed=(), **given):
            gen = torch.Generator().manual_seed(0)
            shapes = {n: (3, 4) for n in names} | (shapes or {})
            dtypes = dtypes or {}
            out = {}
            for n in names:
                t = torch.randn(shapes[n], generator=gen).to(device=d, dtype=dtypes.get(n, torch.float32))
                out[n] = t.t().contiguous().t() if n in transposed else t
            return out | given

        def views_of_one_buffer(d, rows_apart: int):
            """Each argument a block of 3 rows of one buffer, starting ``rows_apart`` rows after the previous."""
            buffer = torch.randn(3 + rows_apart * (len(names) - 1), 4, device=d)
            return {n: buffer[i * rows_apart: i * rows_apart + 3] for i, n in enumerate(names)}

        def same_tensor(first: str, second: str):
            return lambda d: (lambda a: a | {second: a[first]})(args(d))

        def values(d, *rows):
            return args(d, **{n: torch.tensor(rows, device=d) for n in names})

        out = [
            ErrorInput("shapes differ", lambda d: args(d, shapes={"g": (3, 5)}), ValueError, "shapes must match"),
            ErrorInput("g broadcastable but not e's shape", lambda d: args(d, shapes={"g": (4,)}), ValueError,
                       "shapes must match"),
            ErrorInput("dtypes differ", lambda d: args(d, dtypes={"g": torch.float16}), TypeError, "dtypes must match"),
            ErrorInput("integer e", lambda d: args(d, dtypes={"e": torch.int32}), TypeError, "e must be"),
            ErrorInput("bool g", lambda d: args(d, dtypes={"g": torch.bool}), TypeError, "g must be"),
            ErrorInput("complex e", lambda d: args(d, dtypes={"e": torch.complex64}), TypeError, "e must be"),
            ErrorInput("e a list", lambda d: args(d, e=[[1.0] * 4] * 3), TypeError, r"e must be a torch\.Tensor"),
            ErrorInput("g None", lambda d: args(d, g=None), TypeError, r"g must be a torch\.Tensor"),
            ErrorInput("g on another device", lambda d: args(d, g=torch.randn(3, 4, device="meta")), ValueError,
                       "one device"),
            ErrorInput("every tensor on meta", lambda d: args("meta"), ValueError, "kernels run on"),
            ErrorInput.same_as_hf("zero elements", lambda d: args(d, shapes={n: (0, 5) for n in names})),
            ErrorInput.same_as_hf("0-d tensors", lambda d: args(d, shapes={n: () for n in names})),
            ErrorInput.same_as_hf("float64", lambda d: args(d, dtypes={n: torch.float64 for n in names})),
            ErrorInput.same_as_hf("NaN, inf and huge values", lambda d: values(d, [math.nan, math.inf, -math.inf, 1e30],
                                                                               [-1e30, 100.0, -100.0, 0.0])),
            ErrorInput.same_as_hf("fp16 products overflowing to inf",
                                  lambda d: args(d, dtypes={n: torch.float16 for n in names},
                                                 **{n: torch.full((3, 4), 300.0, dtype=torch.float16, device=d)
                                                    for n in names})),
            ErrorInput.same_as_hf("disjoint views of one buffer", lambda d: views_of_one_buffer(d, rows_apart=3)),
        ]
        if raw:
            out += [
                ErrorInput("non-contiguous e", lambda d: args(d, transposed=("e",)), ValueError, "contiguous"),
                ErrorInput("expanded e", lambda d: args(d, e=torch.randn(1, 4, device=d).expand(3, 4)), ValueError,
                           "contiguous"),
            ]
        else:
            out += [
                ErrorInput.same_as_hf("column-major e", lambda d: args(d, transposed=("e",))),
                ErrorInput.same_as_hf("expanded e", lambda d: args(d, e=torch.randn(1, 4, device=d).expand(3, 4))),
                ErrorInput.same_as_hf("e and g requiring grad",
                                      lambda d: {n: t.requires_grad_() for n, t in args(d).items()}),
            ]
        if writes_inputs:
            out += [
                ErrorInput("DW is e", same_tensor("DW", "e"), ValueError, "DW and e share memory"),
                ErrorInput("DW is g", same_tensor("DW", "g"), ValueError, "DW and g share memory"),
                ErrorInput("e is g", same_tensor("e", "g"), ValueError, "e and g share memory"),
                ErrorInput("e, g and DW overlapping views of one buffer",
                           lambda d: views_of_one_buffer(d, rows_apart=1), ValueError, "share memory"),
                ErrorInput("DW is e through DLPack",
                           lambda d: (lambda a: a | {"DW": torch.from_dlpack(a["e"])})(args(d)), ValueError,
                           "DW and e share memory"),
            ]
        else:
            out.append(ErrorInput.same_as_hf("e is g", same_tensor("e", "g")))  # read only: sharing is harmless
        return out

    return errors


SWIGLU = OpSpec(
    name="swiglu", variants=("default",), summary="silu(e) * g as LlamaMLP computes it; h, de, dg",
    arg_names=("e", "g"), call=lambda fn, a: (fn(a["e"], a["g"]),), outputs=("h",), differentiable=("e", "g"),
    reference=R.swiglu, reference_reordered=R.swiglu_reordered,
    cases=lambda budget, dtypes=C.FLOAT_DTYPES: C.elementwise_cases(budget, "swiglu", True, dtypes),
    stratified=C.elementwise_stratified("swiglu", autograd=True),
    make_args=_elementwise_args(("e", "g")), layout_args=("e", "g"), layout_of=_layout_last_two,
    sweep=_elementwise_sweep("swiglu", autograd=True),
    float64_cases=(Case("swiglu", "default", "float64", {"shape": [3, 7]}, "transposed", "normal", {}, seed=1),),
    error_inputs=_swiglu_errors(("e", "g"), raw=False), noise=_SWIGLU_NOISE,
)

SWIGLU_FG = OpSpec(
    name="swiglu_fg_kernel", variants=("default",), summary="raw SwiGLU forward: a new h = silu(e) * g",
    arg_names=("e", "g"), call=lambda fn, a: (fn(a["e"], a["g"]),), outputs=("h",), differentiable=(),
    reference=R.swiglu, reference_reordered=R.swiglu_reordered,
    cases=lambda budget, dtypes=C.FLOAT_DTYPES: C.elementwise_cases(budget, "swiglu_fg_kernel", False, dtypes),
    stratified=C.elementwise_stratified("swiglu_fg_kernel", autograd=False),
    make_args=_elementwise_args(("e", "g")), layout_args=(), layout_of=_layout_last_two,
    sweep=_elementwise_sweep("swiglu_fg_kernel", autograd=False),
    float64_cases=(Case("swiglu_fg_kernel", "default", "float64", {"shape": [3, 7]}, "contiguous", "outliers", {}, seed=1),),
    error_inputs=_swiglu_errors(("e", "g"), raw=True),
    noise={"h": _SWIGLU_NOISE["h"]},
)

SWIGLU_BACKWARD = OpSpec(
    name="swiglu_DWf_DW_dfg_kernel", variants=("default",),
    summary="raw LoRA-MLP backward: h, df, de written into DW, e, g",
    arg_names=("DW", "e", "g"), call=lambda fn, a: tuple(fn(a["DW"], a["e"], a["g"])), outputs=("h", "df", "de"),
    differentiable=(), reference=R.swiglu_lora_backward, reference_reordered=R.swiglu_lora_backward_reordered,
    cases=lambda budget, dtypes=C.FLOAT_DTYPES: C.elementwise_cases(budget, "swiglu_DWf_DW_dfg_kernel", False, dtypes),
    stratified=C.elementwise_stratified("swiglu_DWf_DW_dfg_kernel", autograd=False),
    make_args=_elementwise_args(("DW", "e", "g")), layout_args=(), layout_of=_layout_last_two,
    sweep=_elementwise_sweep("swiglu_DWf_DW_dfg_kernel", autograd=False),
    buffers_hold_outputs={"h": "DW", "df": "e", "de": "g"},
    float64_cases=(Case("swiglu_DWf_DW_dfg_kernel", "default", "float64", {"shape": [3, 7]}, "contiguous", "outliers",
                        {}, seed=1),),
    error_inputs=_swiglu_errors(("DW", "e", "g"), raw=True), noise=_RAW_BACKWARD_NOISE,
)

SPECS: dict[str, OpSpec] = {spec.name: spec for spec in (RMS_NORM, ROPE, SWIGLU, SWIGLU_FG, SWIGLU_BACKWARD)}
