"""Declared ops and Triton kernels for mutation testing's own tests.

double_it: the kernel doubles each row, and adds one only under a constexpr (SHIFTED) that no launch
sets, a branch no case reaches.

cubic_it: a cubic in Horner's form, which HF's maths evaluates in float32 (six roundings) and the
kernel in float64 (one). Its mutant without the upcast is HF's evaluation: every verdict passes it,
yet its typical error is three times the kernel's, which the gate sees against a baseline of the
kernel (``--baseline``)."""

import torch
import triton
import triton.language as tl

from oracle import Dim, Op, Tensor, implementation

DOUBLE_IT = Op(
    "double_it",
    reference=lambda X: X * 2,
    inputs={"X": Tensor("rows", "cols")},
    dims={"rows": Dim(1, 64, programs=True), "cols": Dim(1, 300, special=(1, 7, 128, 129))},
    outputs=("Y",),
)


@triton.jit
def _double(X, Y, cols, BLOCK: tl.constexpr, SHIFTED: tl.constexpr):
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < cols
    x = tl.load(X + row * cols + offsets, mask=mask, other=0.0)
    y = x * 2
    if SHIFTED:
        y = y + 1
    tl.store(Y + row * cols + offsets, y, mask=mask)


class _Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X):
        x = X.reshape(-1, X.shape[-1]).contiguous()
        y = torch.empty_like(x)
        _double[(x.shape[0],)](x, y, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]), SHIFTED=False)
        return y.view(X.shape)

    @staticmethod
    def backward(ctx, dY):
        return dY * 2


def _cubic(X):
    return ((X * 0.3 + 0.7) * X + 1.1) * X + 0.9


CUBIC_IT = Op("cubic_it", reference=_cubic, inputs={"X": Tensor("rows", "cols")},
              dims={"rows": Dim(1, 64, programs=True), "cols": Dim(1, 300, special=(1, 7, 128, 129))},
              outputs=("Y",), differentiable=(), dtypes=("float32",))


@triton.jit
def _cubic_kernel(X, Y, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float64)
    y = ((x * 0.3 + 0.7) * x + 1.1) * x + 0.9
    tl.store(Y + offsets, y.to(Y.dtype.element_ty), mask=mask)


def _cubic_launch(X):
    x = X.contiguous()
    y = torch.empty_like(x)
    _cubic_kernel[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
    return y


impl = implementation(double_it=_Double.apply, cubic_it=_cubic_launch)
