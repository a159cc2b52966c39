"""GeGLU's element-wise middle, h = gelu(e) * g, fused forward and backward (Gemma's MLP).

GeLU is torch's ``F.gelu(e, approximate=...)`` (HF's ``ACT2FN["gelu_pytorch_tanh"]`` for "tanh",
``ACT2FN["gelu"]`` for "none"), in fp32 (fp64 for fp64 inputs) with torch's formulas and constants,
rounded like HF's eager ops:

    f  = gelu(e)                      rounded to the dtype
    h  = f * g                        rounded
    df = dh * f                       gradient of g (the up branch), rounded
    de = (dh * g) * gelu'(e)          gradient of e (the gate branch): dh * g rounded first, as
                                      autograd hands the rounded product to gelu's backward

    exact: gelu(x)  = x/2 * (1 + erf(x/√2))        gelu'(x) = Φ(x) + x·φ(x)
    tanh:  gelu(x)  = x/2 * (1 + tanh u),  u = √(2/π)·(x + 0.044715·x³)
           gelu'(x) = (1 + tanh u)/2 + x/2 · (1 - tanh² u) · √(2/π)·(1 + 3·0.044715·x²)

The raw kernels, one pair per approximation: ``geglu_{exact,approx}_forward_kernel(e, g)`` return a
new h; ``geglu_{exact,approx}_backward_kernel(DW, e, g)`` write h, df and de INTO DW, e and g
(``CLOBBERS``), as the SwiGLU raw backward does. ``geglu(e, g, approximate)`` is the autograd op on
the same kernels; its backward writes fresh tensors. Launching and validation: see _elementwise.
Each is a wrapper around a ``kernel_oracle`` custom op of the same name (kernels/_library.py);
``geglu``'s backward is the op ``geglu_backward``.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra import libdevice

from . import _elementwise
from ._elementwise import exp, flat_block
from ._library import calls, custom_op
from ._mlp_patch import GatedMLPPatch
from ._runtime import interpreted

APPROXIMATIONS = ("tanh", "none")

# torch's constants (ATen's GeLU kernels), written as the double expressions ATen folds; the kernels
# round them to the compute dtype where they meet a tensor, as ATen's opmath_t constants are. They
# stand right of the tensor they multiply (the same product: IEEE multiplication commutes), since the
# interpreter runs `constexpr * tensor` as plain Python and gets a constexpr-wrapped tensor back.
_SQRT_2_OVER_PI = tl.constexpr(1.4142135623730951 * 1.1283791670955126 * 0.5)  # M_SQRT2 * M_2_SQRTPI / 2
_INV_SQRT_2 = tl.constexpr(0.7071067811865476)  # M_SQRT1_2
_INV_SQRT_2PI = tl.constexpr(1.1283791670955126 * 0.7071067811865476 * 0.5)  # M_2_SQRTPI * M_SQRT1_2 / 2
_KAPPA = tl.constexpr(0.044715)

if interpreted():
    @triton.jit
    def _erf(x):
        return tl.erf(x)  # the interpreter's erf is math.erf per element: accurate

    @triton.jit
    def _tanh(x):
        # The interpreter has no tanh: built from exp in fp64, then rounded to x's dtype (for fp32 the
        # correctly rounded value, measured on 10**6 normal draws). With a = |x| (clamped at 20, where
        # tanh is ±1 in fp64, so exp never overflows) and z = exp(-2a):
        #   a >= 0.5: 1 - 2z / (1 + z), no cancellation; near -1 (GeLU's 1 + tanh for negative inputs)
        #             only the final subtraction rounds, so 1 + tanh keeps what fp64 can hold;
        #   a <  0.5: -m / (m + 2) with m = expm1(-2a), by Kahan's (z - 1) * v / log(z), v = -2a.
        a = tl.minimum(tl.abs(x.to(tl.float64)), 20.0)
        v = -2.0 * a
        z = tl.exp(v)
        m = tl.where(z == 1.0, v, (z - 1.0) * v / tl.log(z))
        t = tl.where(a >= 0.5, 1.0 - 2.0 * z / (1.0 + z), -m / (m + 2.0))
        return tl.where(x < 0, -t, t).to(x.dtype)
else:
    @triton.jit
    def _erf(x):
        return libdevice.erf(x)  # erff / erf: what torch's CUDA gelu calls

    @triton.jit
    def _tanh(x):
        return libdevice.tanh(x)  # tanhf / tanh: what torch's CUDA gelu calls


@triton.jit
def _gelu(x, TANH: tl.constexpr):
    """GeLU in x's (compute) dtype, in the order of torch's kernel."""
    if TANH:
        inner = (x + (x * x * x) * _KAPPA) * _SQRT_2_OVER_PI
        return 0.5 * x * (1.0 + _tanh(inner))
    else:
        return x * 0.5 * (1.0 + _erf(x * _INV_SQRT_2))


@triton.jit
def _gelu_slope(x, TANH: tl.constexpr):
    """d gelu / dx in x's (compute) dtype, in the order of torch's gelu_backward kernel."""
    if TANH:
        x_sq = x * x
        tanh_inner = _tanh((x + (x_sq * x) * _KAPPA) * _SQRT_2_OVER_PI)
        # 3 * kappa rounded in the compute dtype, as ATen's opmath_t(3) * kKappa is.
        three_kappa = 3.0 * tl.full((), _KAPPA, x.dtype)
        inner_slope = (1.0 + three_kappa * x_sq) * _SQRT_2_OVER_PI
        half_x = 0.5 * x
        return 0.5 * (1.0 + tanh_inner) + half_x * (1.0 - tanh_inner * tanh_inner) * inner_slope
    else:
        cdf = 0.5 * (1.0 + _erf(x * _INV_SQRT_2))
        pdf = exp(-0.5 * x * x) * _INV_SQRT_2PI
        return cdf + x * pdf


@triton.jit
def _geglu_forward_kernel(
    h_ptr, e_ptr, g_ptr,  # flat, same layout; h may be a fresh tensor
    n_elements,
    COMPUTE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    WIDE: tl.constexpr,  # 64-bit offsets (_elementwise.flat_launch)
    EVEN: tl.constexpr,  # blocks tile the tensor: no bounds test
    TANH: tl.constexpr,  # the approximation: tanh (True) or erf (False)
):
    offsets, mask = flat_block(n_elements, BLOCK_SIZE, WIDE, EVEN)
    dtype: tl.constexpr = h_ptr.dtype.element_ty

    e = tl.load(e_ptr + offsets, mask=mask, other=0.0).to(COMPUTE)
    g = tl.load(g_ptr + offsets, mask=mask, other=0.0).to(COMPUTE)

    f = _gelu(e, TANH).to(dtype).to(COMPUTE)
    tl.store(h_ptr + offsets, f * g, mask=mask)


@triton.jit
def _geglu_backward_kernel(
    DW_ptr, e_ptr, g_ptr,  # inputs: incoming gradient dh, and the forward inputs
    h_ptr, df_ptr, de_ptr,  # outputs; the raw kernel passes DW, e, g themselves
    n_elements,
    STORE_H: tl.constexpr,  # the raw kernel also recomputes h for the down-projection's weight grad
    COMPUTE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    WIDE: tl.constexpr,  # 64-bit offsets (_elementwise.flat_launch)
    EVEN: tl.constexpr,  # blocks tile the tensor: no bounds test
    TANH: tl.constexpr,
):
    offsets, mask = flat_block(n_elements, BLOCK_SIZE, WIDE, EVEN)
    dtype: tl.constexpr = e_ptr.dtype.element_ty

    # Load everything before any store: outputs may alias the inputs element for element.
    dw = tl.load(DW_ptr + offsets, mask=mask, other=0.0).to(COMPUTE)
    e = tl.load(e_ptr + offsets, mask=mask, other=0.0).to(COMPUTE)
    g = tl.load(g_ptr + offsets, mask=mask, other=0.0).to(COMPUTE)

    f = _gelu(e, TANH).to(dtype).to(COMPUTE)
    dwg = (dw * g).to(dtype).to(COMPUTE)
    de = dwg * _gelu_slope(e, TANH)

    if STORE_H:
        tl.store(h_ptr + offsets, f * g, mask=mask)
    tl.store(df_ptr + offsets, dw * f, mask=mask)
    tl.store(de_ptr + offsets, de, mask=mask)


# tanh's launch, measured (scripts/tune.py elementwise, H200, forward+backward at Gemma-2-9B's MLP
# shape): 8 warps of 2048 elements, still 8 per thread, took 1.2-2.3% less GPU time than 4 warps of
# 1024 in six runs of one session (equal in an earlier session's one run); the other settings (4, 16
# or 32 elements per thread) took 1-31% more. The exact GeLU keeps the default: the benchmark does not
# time it.
GEGLU = {
    "tanh": _elementwise.GatedKernels(_geglu_forward_kernel, _geglu_backward_kernel, {"TANH": True},
                                      block_size=2048, num_warps=8),
    "none": _elementwise.GatedKernels(_geglu_forward_kernel, _geglu_backward_kernel, {"TANH": False}),
}


def _require_approximation(approximate: object) -> str:
    if not isinstance(approximate, str):
        raise TypeError(f"approximate must be a str, 'tanh' or 'none', got {type(approximate).__name__}")
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"approximate must be 'tanh' or 'none', got {approximate!r}")
    return approximate


# --- the custom ops (kernels/_library.py) and their wrappers ---------------------------------------


@custom_op("geglu")
def _geglu_op(e: torch.Tensor, g: torch.Tensor, approximate: str) -> torch.Tensor:
    return _elementwise.forward(GEGLU[approximate], e, g)


@custom_op("geglu_backward")
def _geglu_backward_op(dh: torch.Tensor, e: torch.Tensor, g: torch.Tensor,
                       approximate: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _elementwise.backward(GEGLU[approximate], dh, e, g)


_elementwise.register_autograd_op(_geglu_op, _geglu_backward_op)


def _raw_ops(approximate: str, name: str):
    """The raw forward and backward ops of one approximation, named as the contract names them."""
    kernels = GEGLU[approximate]

    @custom_op(f"geglu_{name}_forward_kernel")
    def forward_op(e: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return _elementwise.forward(kernels, e, g)

    @custom_op(f"geglu_{name}_backward_kernel", mutates_args=("DW", "e", "g"))
    def backward_op(DW: torch.Tensor, e: torch.Tensor, g: torch.Tensor) -> None:
        _elementwise.raw_backward(kernels, DW, e, g)

    _elementwise.register_raw_ops(forward_op, backward_op)
    return forward_op, backward_op


_EXACT_OPS = _raw_ops("none", "exact")
_APPROX_OPS = _raw_ops("tanh", "approx")


def _raw_forward(name: str, op, e: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    _elementwise.validate(True, e=e, g=g)
    _elementwise.require_outside_autograd(name, "kernels.geglu", e=e, g=g)
    return op(e, g)


def _raw_backward(name: str, op, DW: torch.Tensor, e: torch.Tensor, g: torch.Tensor):
    _elementwise.validate(True, DW=DW, e=e, g=g)
    _elementwise.require_writable(name, DW=DW, e=e, g=g)
    op(DW, e, g)
    return DW, e, g


@calls(_EXACT_OPS[0])
def geglu_exact_forward_kernel(e: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Raw forward: a new tensor h = gelu(e) * g (erf GeLU). e, g: same shape and dtype, contiguous;
    outside autograd, so with grad mode on, inputs that require grad are refused (RuntimeError)."""
    return _raw_forward("geglu_exact_forward_kernel", _EXACT_OPS[0], e, g)


@calls(_APPROX_OPS[0])
def geglu_approx_forward_kernel(e: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Raw forward: a new tensor h = gelu_tanh(e) * g. e, g: same shape and dtype, contiguous;
    outside autograd, so with grad mode on, inputs that require grad are refused (RuntimeError)."""
    return _raw_forward("geglu_approx_forward_kernel", _APPROX_OPS[0], e, g)


@calls(_EXACT_OPS[1])
def geglu_exact_backward_kernel(DW: torch.Tensor, e: torch.Tensor, g: torch.Tensor):
    """Raw backward (erf GeLU): writes h into DW, df into e and de into g; returns (DW, e, g).

    DW is the gradient reaching h. All three buffers are overwritten (``CLOBBERS``) and their version
    counters bumped; they must not share memory (ValueError), nor, with grad mode on, be a leaf that
    requires grad (RuntimeError, as torch's in-place ops).
    """
    return _raw_backward("geglu_exact_backward_kernel", _EXACT_OPS[1], DW, e, g)


@calls(_APPROX_OPS[1])
def geglu_approx_backward_kernel(DW: torch.Tensor, e: torch.Tensor, g: torch.Tensor):
    """Raw backward (tanh GeLU): writes h into DW, df into e and de into g; returns (DW, e, g).

    DW is the gradient reaching h. All three buffers are overwritten (``CLOBBERS``) and their version
    counters bumped; they must not share memory (ValueError), nor, with grad mode on, be a leaf that
    requires grad (RuntimeError, as torch's in-place ops).
    """
    return _raw_backward("geglu_approx_backward_kernel", _APPROX_OPS[1], DW, e, g)


@calls(_geglu_op)
def geglu(e: torch.Tensor, g: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """h = gelu(e, approximate) * g as HF's GemmaMLP computes it; differentiable in e and g; any layout.

    ``approximate``: "tanh" (Gemma's gelu_pytorch_tanh, the default) or "none" (erf).
    """
    approximate = _require_approximation(approximate)
    _elementwise.validate(False, e=e, g=g)
    return _elementwise.differentiable(_geglu_op, GEGLU[approximate], e, g, approximate)


# HF's GeLU modules that call F.gelu through their ``act`` attribute: GELUActivation (ACT2FN["gelu"])
# and GELUTanh (ACT2FN["gelu_pytorch_tanh"], Gemma's). Built with their Python formulas instead
# (use_gelu_python, ...) they round differently, and gelu_new / gelu_fast are other formulas.
HF_GELU_MODULES = ("GELUActivation", "GELUTanh")


def _gelu_options(act_fn: torch.nn.Module) -> dict | None:
    """{"approximate": ...} for an activation computing exactly F.gelu(x, approximate); else None."""
    if isinstance(act_fn, torch.nn.GELU):
        return {"approximate": act_fn.approximate}
    if type(act_fn).__name__ not in HF_GELU_MODULES:
        return None
    act = getattr(act_fn, "act", None)
    if act is F.gelu:
        return {"approximate": "none"}
    if isinstance(act, functools.partial) and act.func is F.gelu and not act.args and \
            set(act.keywords) == {"approximate"} and act.keywords["approximate"] in APPROXIMATIONS:
        return {"approximate": act.keywords["approximate"]}
    return None


MLP_PATCH = GatedMLPPatch("geglu", geglu, _gelu_options)
