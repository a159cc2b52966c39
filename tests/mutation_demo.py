"""A declared op and a Triton kernel for mutation testing's own tests: the kernel doubles each row,
and adds one only under a constexpr (SHIFTED) that no launch sets, a branch no case reaches."""

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


impl = implementation(double_it=_Double.apply)
