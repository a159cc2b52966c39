"""Small Triton kernels written as third-party libraries write them, for tests/test_interpreter_fidelity.py:
each uses one thing the CPU interpreter got wrong or could not run before oracle/interpreter/'s
corrections, so that a library's kernel module runs there unchanged. Loaded through
``oracle.interpreter.prepare_for``, as the harness loads any implementation; nothing here shims Triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton.language.extra.libdevice import rsqrt  # bound to a name, as Liger-Kernel imports it

# --- triton.autotune and triton.heuristics --------------------------------------------------------------

SCALE_CONFIGS = [triton.Config({"BLOCK": 16}, num_warps=2), triton.Config({"BLOCK": 32}, num_warps=4),
                 triton.Config({"BLOCK": 64}, num_warps=8)]


@triton.autotune(configs=SCALE_CONFIGS, key=["n"])
@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def _scale_autotuned(Y, X, n, factor, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        x = tl.load(X + offs)
    else:
        x = tl.load(X + offs, mask=offs < n, other=0.0)
    tl.store(Y + offs, x * factor, mask=offs < n)


def scale_autotuned(x: torch.Tensor, factor: float) -> torch.Tensor:
    y = torch.empty_like(x)
    n = x.numel()
    _scale_autotuned[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](y, x, n, factor)
    return y


@triton.heuristics({"BLOCK": lambda args: triton.next_power_of_2(args["n"])})
@triton.jit
def _negate_heuristic(Y, X, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(Y + offs, -tl.load(X + offs, mask=offs < n), mask=offs < n)


def negate_heuristic(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    _negate_heuristic[(1,)](y, x, x.numel())
    return y


# --- libdevice, through each way a library reaches it ----------------------------------------------------


@triton.jit
def _gelu_tanh(Y, X, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n, other=0.0).to(tl.float32)
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    y = 0.5 * x * (1 + libdevice.tanh(inner))  # the generic stub module's attribute
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=offs < n)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    _gelu_tanh[(triton.cdiv(x.numel(), 64),)](y, x, x.numel(), BLOCK=64)
    return y


@triton.jit
def _libdevice_mix(Y, X, n, BLOCK: tl.constexpr):
    # rsqrt bound by name; erf and pow through the CUDA module's path; fast_expf through tl.extra
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n, other=1.0)
    a = rsqrt(tl.abs(x) + 1)
    b = tl.extra.cuda.libdevice.erf(x)
    c = libdevice.pow(tl.abs(x), tl.abs(x) * 0 + 1.5)  # (an fp64 x with a bare 1.5 fails to compile on a GPU)
    d = tl.extra.libdevice.fast_expf(x.to(tl.float32)).to(x.dtype)
    tl.store(Y + offs, a + b + c + d, mask=offs < n)


def libdevice_mix(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    _libdevice_mix[(1,)](y, x, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    return y


@triton.jit
def _libdevice_apply(Y, A, B, C, n, NAME: tl.constexpr, ARITY: tl.constexpr, BLOCK: tl.constexpr):
    # one libdevice function by name (the walk over all of them); the interpreter runs this as Python
    offs = tl.arange(0, BLOCK)
    a = tl.load(A + offs, mask=offs < n)
    if ARITY == 1:
        y = getattr(libdevice, NAME)(a)
    elif ARITY == 2:
        y = getattr(libdevice, NAME)(a, tl.load(B + offs, mask=offs < n))
    elif ARITY == 3:
        y = getattr(libdevice, NAME)(a, tl.load(B + offs, mask=offs < n), tl.load(C + offs, mask=offs < n))
    else:
        b = tl.load(B + offs, mask=offs < n)
        c = tl.load(C + offs, mask=offs < n)
        y = getattr(libdevice, NAME)(a, b, c, a)
    tl.store(Y + offs, y, mask=offs < n)


def libdevice_apply(name: str, out: torch.Tensor, *args: torch.Tensor) -> torch.Tensor:
    a, b, c = (list(args) + [args[0]] * 3)[:3]
    n = out.numel()
    arity = len(args) if name not in ("norm4d", "rnorm4d") else 4
    _libdevice_apply[(1,)](out, a, b, c, n, NAME=name, ARITY=arity, BLOCK=triton.next_power_of_2(n))
    return out


@triton.jit
def _softcap(x, cap):
    return cap * rsqrt(x * 0 + 1) * libdevice.tanh(x / cap)  # libdevice from a device function


@triton.jit
def _softcapped(Y, X, n, cap, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n)
    tl.store(Y + offs, _softcap(x, cap), mask=offs < n)


def softcapped(x: torch.Tensor, cap: float) -> torch.Tensor:
    y = torch.empty_like(x)
    _softcapped[(1,)](y, x, x.numel(), cap, BLOCK=triton.next_power_of_2(x.numel()))
    return y


@triton.jit
def _reciprocal_high(Y, X, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n)
    tl.store(Y + offs, libdevice.rcp64h(x), mask=offs < n)


def reciprocal_high(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    _reciprocal_high[(1,)](y, x, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    return y


# --- a builtin of triton.language bound to a name of the library's own ---------------------------------

cast_to = tl.cast  # Unsloth's kernels/utils.py: ``triton_cast = tl.cast``, called inside its kernels


@triton.jit
def _offset_rows(Y, X, stride, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    start = row * cast_to(stride, tl.int64)
    tl.store(Y + start + offs, tl.load(X + start + offs, mask=offs < n) + 1.0, mask=offs < n)


def offset_rows(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    _offset_rows[(x.shape[0],)](y, x, x.stride(0), x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
    return y


# --- scalar arguments -----------------------------------------------------------------------------------


@triton.jit
def _rms_norm_rows(Y, X, W, stride, n_cols, eps, BLOCK: tl.constexpr):
    # eps is a Python float at the call: an fp32 scalar on a GPU, with .to()
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps.to(tl.float32))
    tl.store(Y + row * stride + cols, (x * inv * w).to(Y.dtype.element_ty), mask=mask)


def rms_norm_rows(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    y = torch.empty_like(x)
    _rms_norm_rows[(x.shape[0],)](y, x, w, x.stride(0), x.shape[1], eps, BLOCK=triton.next_power_of_2(x.shape[1]))
    return y


@triton.jit
def _scale_by(Y, X, n, factor, BLOCK: tl.constexpr):
    # x (bf16) * factor (a float argument): an fp32 product on a GPU, rounded once on the store
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n)
    tl.store(Y + offs, x * factor, mask=offs < n)


def scale_by(x: torch.Tensor, factor: float) -> torch.Tensor:
    y = torch.empty_like(x)
    _scale_by[(1,)](y, x, x.numel(), factor, BLOCK=triton.next_power_of_2(x.numel()))
    return y


# --- arithmetic on 16-bit values ------------------------------------------------------------------------


@triton.jit
def _bf16_arith(Y, S, A, B, n, BLOCK: tl.constexpr):
    # computes in the loaded dtype (bf16/fp16), as Liger's bf16 paths do; S gets the row's tl.sum
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(A + offs, mask=mask, other=0.0)
    b = tl.load(B + offs, mask=mask, other=0.0)
    y = tl.maximum(a * b - a, -b) + a
    tl.store(Y + offs, y, mask=mask)
    tl.store(S, tl.sum(tl.where(mask, y, 0.0), axis=0))


def bf16_arith(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.empty_like(a)
    s = torch.empty(1, dtype=a.dtype)
    _bf16_arith[(1,)](y, s, a, b, a.numel(), BLOCK=triton.next_power_of_2(a.numel()))
    return y, s


@triton.jit
def _bf16_atomic_add(Out, X, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.atomic_add(Out + offs, tl.load(X + offs, mask=offs < n), mask=offs < n)


def bf16_atomic_add(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    _bf16_atomic_add[(1,)](out, x, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    return out


@triton.jit
def _bf16_dot(C, A, B, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    rm, rn, rk = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(A + rm[:, None] * K + rk[None, :])
    b = tl.load(B + rk[:, None] * N + rn[None, :])
    tl.store(C + rm[:, None] * N + rn[None, :], tl.dot(a, b))  # fp32 accumulator


def bf16_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    c = torch.empty(a.shape[0], b.shape[1], dtype=torch.float32)
    _bf16_dot[(1,)](c, a, b, M=a.shape[0], N=b.shape[1], K=a.shape[1])
    return c


@triton.jit
def _bf16_exp(Y, X, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.exp(tl.load(X + offs, mask=offs < n)), mask=offs < n)


def bf16_exp(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    _bf16_exp[(1,)](y, x, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    return y
