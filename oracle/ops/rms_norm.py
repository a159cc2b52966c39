"""RMSNorm (Llama's and Gemma's): HF's maths, its cases, its noise model, its spec and its benchmark.

Everything the harness knows about this op is here (docs/design.md §6).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch
from hypothesis import strategies as st

from oracle import cases as C
from oracle.cases import (FLOAT_DTYPES, GRAD_LAYOUTS, LAYOUTS, MAX_COLUMNS, VALUE_KINDS, Budget, Case, covering,
                     eps_values, grad_layouts, is_long, layouts, leading_dims, long_counts, long_rows, n_cols, seeds,
                     value_kinds)
from oracle.declare.reference import mirrors
from oracle.cases.scale import chunks, rows
from oracle.declare.spec import (DTYPES, ErrorInput, OpSpec, Programs, compute_dtype, fill, generator, layout_last_two,
                     rounding_error, unit_roundoff, wide)
from oracle.bench.workload import Bench, checkout_kernels, Peers, Workload, compiled, instantiate, randn_cuda, vendor_peers


# --- HF's maths -----------------------------------------------------------------------------------


@mirrors("transformers.models.llama.modeling_llama.LlamaRMSNorm.forward (also Mistral, Qwen2, Qwen3 and q/k norms)")
def llama_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, compute: torch.dtype = torch.float32):
    input_dtype = x.dtype
    h = x.to(compute)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return w * h.to(input_dtype)


@mirrors("transformers.models.gemma.modeling_gemma.GemmaRMSNorm.forward (Gemma 1/2/3)")
def gemma_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, compute: torch.dtype = torch.float32):
    h = x.to(compute)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    out = h * (1.0 + w.to(compute))
    return out.type_as(x)


def rms_norm(X, W, eps, gemma=False, compute=torch.float32):
    """The contract's rms_norm(X, W, eps, gemma): Llama's or Gemma's HF maths."""
    return (gemma_rms_norm if gemma else llama_rms_norm)(X, W, eps, compute)


def rms_norm_reordered(X, W, eps, gemma=False, compute=torch.float32):
    """Same maths, other order: the sum of squares reversed and divided by n, then divided by the
    root; backward by the closed form dX = r * (g - normed * mean(g * normed)) instead of autograd's
    chain. Where dX is a small difference of large terms (one column: dX ~ eps / x^2 relative to
    its terms) the two orders differ by the rounding noise at the terms' scale, which the verdict
    needs to know (compare.py, Note [The verdict])."""
    return _ClosedFormRMSNorm.apply(X, W, eps, gemma, compute)


class _ClosedFormRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X, W, eps, gemma, compute):
        h = X.to(compute)
        variance = h.flip(-1).pow(2).sum(-1, keepdim=True) / h.shape[-1]
        inv_var = 1.0 / torch.sqrt(variance + eps)
        normed = h * inv_var
        ctx.save_for_backward(X, W, inv_var)
        ctx.gemma, ctx.compute = gemma, compute
        if gemma:
            return ((1.0 + W.to(compute)) * normed).type_as(X)
        return normed.to(X.dtype) * W

    @staticmethod
    def backward(ctx, dY):
        X, W, inv_var = ctx.saved_tensors
        h, dy = X.to(ctx.compute), dY.to(ctx.compute)
        normed = h * inv_var
        if ctx.gemma:
            g = dy * (1.0 + W.to(ctx.compute))
            dW_rows = dy * normed
        else:
            g = (dy * W.to(ctx.compute)).to(X.dtype).to(ctx.compute)
            dW_rows = dy * normed.to(X.dtype).to(ctx.compute)
        # Rows summed one after another (cumsum's order), as a persistent kernel accumulates them,
        # where HF's sum is pairwise: with one column, dW is a sum of +-1-sized terms.
        dW = dW_rows.reshape(-1, h.shape[-1]).cumsum(0)[-1]
        dX = inv_var * (g - normed * (g * normed).mean(-1, keepdim=True))
        return dX.to(X.dtype), dW.to(W.dtype), None, None, None


# --- cases ----------------------------------------------------------------------------------------


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


def rms_norm_stratified(dtype: str, budget: Budget) -> list[Case]:
    """Every variant, input layout, gradient layout and kind of values; every other case long
    (rows past 64, 128, 256), so tail rows and tiles are judged in every run."""
    out = []
    # variants cycle as (a, b, b, a) so that each is drawn both short and long
    rows = covering(("llama", "gemma", "gemma", "llama"), LAYOUTS, GRAD_LAYOUTS, VALUE_KINDS, (7, 129, 1000, 64, 255, 33))
    for i, (variant, layout, grad_layout, values, cols) in enumerate(rows):
        if i % 2:
            lead, cols = [long_rows(i // 2, budget)], 5 + i
        else:
            lead = [3, 5]
        out.append(Case("rms_norm", variant, dtype, {"lead": lead, "cols": cols}, layout, values,
                        {"eps": 1e-6, "weight": ("same", "float32")[i // 2 % 2]}, seed=1000 + i, grad_layout=grad_layout))
    return out


# --- arguments, noise model, report grid, bad inputs ----------------------------------------------


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
    _, total, rows = _rms_norm_dW_sums(args, upstream)
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
        self._constants(X, args)
        x, w = wide(X), wide(W)
        self.r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + args["eps"])
        self.normed = x * self.r
        self.scale = 1.0 + w if self.gemma else w
        self.dy = wide(upstream["Y"]) if "Y" in upstream else None
        self.x_dtype, self.y_dtype = X.dtype, torch.promote_types(X.dtype, W.dtype)

    def _constants(self, X: torch.Tensor, args: dict) -> None:
        self.gemma = bool(args["gemma"])
        self.n = X.shape[-1]
        self.u_x, self.u_c = unit_roundoff(X.dtype), unit_roundoff(compute_dtype(X.dtype))
        self.rho = self.u_c * (2 * math.sqrt(self.n) + 4)
        self.rho_order = self.u_c * math.sqrt(self.n) / 2

    @classmethod
    def of_shape(cls, args: dict) -> _RmsNormParts:
        """Only what depends on X's width and dtype (rho, u_c), without touching its values."""
        parts = cls.__new__(cls)
        parts._constants(args["X"], args)
        return parts


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


def _rms_norm_dW_sums(args: dict, upstream: dict) -> tuple[torch.Tensor, torch.Tensor, int]:
    """dW_j = sum over rows of dY * normed. Per column, the sum over rows of each term's rounding
    (Llama: normed to X's dtype, then the product in Y's dtype; Gemma: the product in the compute
    dtype) and of the |terms|; and the row count. Chunk by chunk of rows: a case at scale has 2^31
    elements, whose float64 intermediates would not fit (oracle/cases/scale.py)."""
    n = args["X"].shape[-1]
    X, dY = args["X"].reshape(-1, n), upstream["Y"].reshape(-1, n)
    rounding = total = torch.zeros(n, dtype=torch.float64, device=X.device)
    for index in chunks(X.shape[0], n):
        p = _RmsNormParts(args | {"X": X[index.to(X.device)]}, {"Y": dY[index.to(X.device)]})
        terms = (p.dy * p.normed).abs()
        if p.gemma:
            per_term = 2 * p.u_c * terms
        else:
            per_term = p.dy.abs() * rounding_error(p.normed.abs(), p.x_dtype) + rounding_error(terms, p.y_dtype)
        rounding, total = rounding + per_term.sum(0), total + terms.sum(0)
    return rounding, total, X.shape[0]


def _rms_norm_noise_dW(args: dict, upstream: dict) -> torch.Tensor:
    """dW_j = sum over rows of dY * normed: each term's rounding, 1/rms's relative error, and the
    sum's noise (2 sqrt(m) u_c for m rows in any order), summed over the rows."""
    p = _RmsNormParts.of_shape(args)
    rounding, total, rows = _rms_norm_dW_sums(args, upstream)
    return rounding + (p.rho + 2 * math.sqrt(rows) * p.u_c) * total


def _rms_norm_order_dW(args: dict, upstream: dict) -> torch.Tensor:
    """Each row's 1/rms order noise, and the column sum's own (sqrt(m) u_c)."""
    p = _RmsNormParts.of_shape(args)
    _, total, rows = _rms_norm_dW_sums(args, upstream)
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


# (columns, rows) at production scale: Qwen3's per-head q/k norm (128) to past Llama-3-70B's hidden
# size, at 16k to 128k rows; 16384 and 65536 columns just past 2^31 elements in 16-bit, where a
# 32-bit element offset wraps. float32 stops at 2^30: the harness holds about fifteen copies of a
# case's tensors (guards, snapshots, leaves, the residual branch), 130 GB at 2^31 float32 elements.
_SCALE_SHAPES = ((128, 16384), (128, 131072), (256, 16384), (256, 131072), (2048, 131072), (4096, 16384),
                 (4096, 131072), (8192, 65536), (16384, 131073), (65536, 32769))


def _rms_norm_scale() -> list[Case]:
    out = []
    for variant in ("llama", "gemma"):
        for dtype in C.FLOAT_DTYPES:
            for cols, n_rows in _SCALE_SHAPES:
                if dtype == "float32" and n_rows * cols > 2**31:
                    n_rows = 2**30 // cols
                # the widest 16-bit case also strided: row starts past 2^31 elements into the buffer
                layout = "strided" if (cols == 16384 and dtype != "float32") else "contiguous"
                out.append(Case("rms_norm", variant, dtype, {"lead": [n_rows], "cols": cols}, layout, "normal",
                                {"eps": 1e-6, "weight": "same"}, seed=len(out)))
            # HF's column-major view, and a row-broadcast gradient, at 128k rows
            out.append(Case("rms_norm", variant, dtype, {"lead": [131072], "cols": 2048}, "transposed", "normal",
                            {"eps": 1e-6, "weight": "same"}, seed=len(out)))
            out.append(Case("rms_norm", variant, dtype, {"lead": [131072], "cols": 256}, "contiguous", "normal",
                            {"eps": 1e-6, "weight": "same"}, seed=len(out), grad_layout="broadcast"))
    return out


def _rms_norm_size(case: Case) -> tuple[int, int]:
    rows = math.prod(case.dims["lead"])
    return rows, rows * case.dims["cols"]


PROGRAMS = Programs(unit="rows", size=_rms_norm_size, args=lambda a, index: a | {"X": rows(a["X"], index)},
                    tensor=rows, summed=("dW",))


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


# --- Liger-Kernel, and the benchmark (GPU) --------------------------------------------------------




def _bench_peers(include_liger: bool) -> Peers:
    kernels = checkout_kernels()

    peers = {"kernels": lambda: kernels.rms_norm, "eager": lambda: rms_norm, "compile": lambda: compiled(rms_norm)}
    return peers | vendor_peers("rms_norm", include_liger)


def rms_norm_workload(peers: Peers, dtype, rows=16384, cols=4096, variant="llama", width=None,
                      opt_in=True) -> Workload:
    """``opt_in``: also time the kernels writing dX into dY (an unsafe option, not a peer's default)."""
    X = randn_cuda(rows, cols, dtype=dtype, requires_grad=True)
    W = (1 + 0.1 * torch.randn(cols, device="cuda")).to(dtype).requires_grad_()
    dY = randn_cuda(rows, cols, dtype=dtype)
    x_bytes = X.numel() * X.element_size()
    work = Workload("rms_norm", variant, dtype, fwd_bytes=2 * x_bytes, fwd_bwd_bytes=5 * x_bytes, width=width)
    gemma = variant == "gemma"
    impls = instantiate(peers)
    for name, fn in impls.items():
        work.forward[name] = lambda fn=fn: fn(X, W, 1e-6, gemma)

        def fwd_bwd(fn=fn):
            Y = fn(X, W, 1e-6, gemma)
            return torch.autograd.grad(Y, (X, W), dY)

        work.forward_backward[name] = fwd_bwd
    if opt_in and "kernels" in impls:
        kernels = checkout_kernels()

        dY_own = dY.clone()  # the caller owns it: the opt-in's premise

        def in_place():
            Y = kernels.rms_norm(X, W, 1e-6, gemma, write_dx_into_dy=True)
            return torch.autograd.grad(Y, (X, W), dY_own)

        work.forward_backward["kernels (dX into dY)"] = in_place
    return work


SWEEP_WIDTHS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536)


def column_sweep(peers: Peers, widths=SWEEP_WIDTHS, dtype=torch.bfloat16, elements=2**26) -> Iterator[Workload]:
    """Llama's and Gemma's RMSNorm across column counts at a fixed 64 Mi elements (128 MiB in bf16), one
    workload at a time: each holds 3 x 128 MiB of inputs."""
    for cols in widths:
        for variant in ("llama", "gemma"):
            yield rms_norm_workload(peers, dtype, rows=elements // cols, cols=cols, variant=variant, width=cols,
                                    opt_in=False)


BENCH = Bench(peers=_bench_peers, workloads=lambda peers, dtype: [rms_norm_workload(peers, dtype)],
              sweep=column_sweep, sweep_widths=SWEEP_WIDTHS)


# --- the spec -------------------------------------------------------------------------------------


RMS_NORM = OpSpec(
    name="rms_norm", variants=("llama", "gemma"),
    summary="LlamaRMSNorm / GemmaRMSNorm over the last dim; Y, dX, dW",
    arg_names=("X", "W", "eps", "gemma"), call=_rms_norm_call, outputs=("Y",), differentiable=("X", "W"),
    reference=rms_norm, reference_reordered=rms_norm_reordered,
    cases=lambda budget, dtypes=C.FLOAT_DTYPES: rms_norm_cases(budget, dtypes), stratified=rms_norm_stratified,
    make_args=_rms_norm_args, layout_args=("X",), layout_of=layout_last_two, sweep=_rms_norm_sweep,
    scale=_rms_norm_scale, programs=PROGRAMS,
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

SPECS = (RMS_NORM,)
