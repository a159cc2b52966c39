"""RMSNorm (Llama's and Gemma's): HF's maths, its declaration, its bad inputs and its benchmark.

Everything the harness knows about this op is here (docs/design.md §6); its hand-written noise model,
which judges under ``--noise-model declared``, is rms_norm_noise.py.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from oracle.bench.workload import (Bench, Peers, Workload, checkout_kernels, compiled, instantiate, randn_cuda,
                                   vendor_peers)
from oracle.cases import MAX_COLUMNS, SPECIAL_COLUMNS
from oracle import Choice, Dim, DtypeChoice, ErrorInput, Op, PerVariant, Tensor
from oracle.declare.reference import mirrors
from oracle.ops.rms_norm_noise import NOISE, ORDER_NOISE, SUMMED


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


# --- bad inputs: raised before any launch, or HF's result ----------------------------------------


def _errors() -> list[ErrorInput]:
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


# --- the report's grids ---------------------------------------------------------------------------


def _sweep(full: bool) -> tuple[dict, ...]:
    """Every width at the rows a budget allows; the block edges 129 and 4097 also transposed and
    strided; an offset case of zero rows, a float32 weight and eps 1e-5; and many narrow rows, past
    every tile boundary, with a row-broadcast gradient."""
    cols = (1, 7, 64, 129, 1000, 4096, 4097, 8191, 65536) if full else (1, 7, 129, 1000, 4097, 65536)
    budget = 2**24 if full else 2**15
    points = [{"dims": {"lead": [max(1, min(4096 if full else 24, budget // n))], "cols": n}, "layout": layout}
              for n in cols for layout in (("contiguous", "transposed", "strided") if n in (129, 4097) else
                                           ("contiguous",))]
    points.append({"dims": {"lead": [2, 3], "cols": 255}, "layout": "offset", "values": "zero_rows",
                   "params": {"eps": 1e-5, "weight": "float32"}})
    points.append({"dims": {"lead": [4100 if full else 300], "cols": 16}, "grad_layout": "broadcast"})
    return tuple(points)


# (columns, rows) at production scale: Qwen3's per-head q/k norm (128) to past Llama-3-70B's hidden
# size, at 16k to 128k rows; 16384 and 65536 columns just past 2^31 elements in 16-bit, where a
# 32-bit element offset wraps. float32 stops at 2^30: the harness holds about fifteen copies of a
# case's tensors (guards, snapshots, leaves, the residual branch), 130 GB at 2^31 float32 elements.
_SCALE_SHAPES = ((128, 16384), (128, 131072), (256, 16384), (256, 131072), (2048, 131072), (4096, 16384),
                 (4096, 131072), (8192, 65536), (16384, 131073), (65536, 32769))
_SIXTEEN_BIT = ("float16", "bfloat16")


def _scale() -> tuple[dict, ...]:
    """_SCALE_SHAPES (the widest 16-bit case also strided: row starts past 2^31 elements into the
    buffer), then HF's column-major view and a row-broadcast gradient at 128k rows."""
    points = []
    for cols, rows in _SCALE_SHAPES:
        sixteen_bit = {"dims": {"lead": [rows], "cols": cols}, "layout": "strided" if cols == 16384 else "contiguous"}
        float32 = {"dims": {"lead": [2**30 // cols if rows * cols > 2**31 else rows], "cols": cols}}
        if sixteen_bit == {**float32, "layout": "contiguous"}:
            points.append(float32)
        else:
            points += [{**sixteen_bit, "dtypes": _SIXTEEN_BIT}, {**float32, "dtypes": ("float32",)}]
    points.append({"dims": {"lead": [131072], "cols": 2048}, "layout": "transposed"})
    points.append({"dims": {"lead": [131072], "cols": 256}, "grad_layout": "broadcast"})
    return tuple(points)


# --- the declaration ------------------------------------------------------------------------------


RMS_NORM = Op(
    "rms_norm", reference=rms_norm, reordered=rms_norm_reordered, variants=("llama", "gemma"), outputs=("Y",),
    summary="LlamaRMSNorm / GemmaRMSNorm over the last dim; Y, dX, dW",
    inputs={"X": Tensor("lead", "cols"),
            # a float32 weight beside 16-bit activations, or the case's dtype; Gemma stores W around 0
            # (it scales by 1 + W), Llama's W sits around 1
            "W": Tensor("cols", dtype=DtypeChoice("weight", same="case", float32="float32"),
                        values=PerVariant(llama="weight", gemma="small"))},
    # one to three leading dims whose product is the row count
    dims={"lead": Dim(1, 2**17, programs="rows", split=3), "cols": Dim(1, MAX_COLUMNS, special=SPECIAL_COLUMNS)},
    # HF's usual eps, a tiny one and a dominating one
    params={"eps": Choice(1e-6, 1e-5, 1e-12, 0.1), "gemma": PerVariant(llama=False, gemma=True)},
    sweep=_sweep(False), full_sweep=_sweep(True), scale=_scale(),
    float64_cases=({"variant": "llama", "dims": {"lead": [2, 3], "cols": 5}, "layout": "transposed", "seed": 1},
                   {"variant": "gemma", "dims": {"lead": [3], "cols": 6}, "layout": "strided", "seed": 2},
                   # Rows of tiny values (x ~ 1e-4), where eps dominates mean(x^2): eps rounded to
                   # float32 (HF's 1e-5 loses 2.5e-13, 2.5e-8 of it) moves Y by 1.3e-8 relative here,
                   # far past float64 rounding; by 1e-13 on rows of x ~ 1, within it.
                   {"variant": "llama", "dims": {"lead": [4], "cols": 7}, "values": "tiny", "params": {"eps": 1e-5},
                    "seed": 3}),
    error_inputs=_errors, noise=NOISE, order_noise=ORDER_NOISE, summed=SUMMED,
    regressions=(
        # One column: dX ~ eps/x^2 is a small difference of O(1) terms; HF's autograd order happened
        # to be 13x more accurate than the closed form here. The verdict's floor must cover it.
        {"variant": "llama", "dtype": "float32", "dims": {"lead": [1], "cols": 1}},
        # One column again: dW is a single sum over 22 rows of +-1-sized terms; HF's order got it to
        # 1e-7, ours 4e-7. A maximum over one element is one draw of the noise (summation_noise).
        {"variant": "gemma", "dtype": "bfloat16", "dims": {"lead": [22], "cols": 1}, "params": {"weight": "float32"}},
        # Found on the H200: one row of one or two columns, where dX cancels to ~0 (1e-13 with eps 1e-12)
        # and the GPU's approximate rsqrt leaves 1e-8; HF's autograd happened to return exactly 0.
        {"variant": "llama", "dtype": "bfloat16", "dims": {"lead": [1], "cols": 1}, "params": {"eps": 1e-12},
         "seed": 1},
        {"variant": "llama", "dtype": "float32", "dims": {"lead": [1], "cols": 2}},
        # Found by the H200's thorough run of the distribution judgement: a one-column dW is a single
        # element, so its "typical" error is one draw (k 0.0189 and HF 0.0022 scale units, and 0.000145
        # against 0.000101); the sampling allowance must be at least one scale unit's spread.
        {"variant": "llama", "dtype": "float32", "dims": {"lead": [2, 33], "cols": 1}},
        {"variant": "llama", "dtype": "float16", "dims": {"lead": [2, 129], "cols": 1},
         "params": {"eps": 1e-12, "weight": "float32"}, "seed": 1},
    ),
)

SPECS = (RMS_NORM,)


# --- the benchmark (GPU) --------------------------------------------------------------------------


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
