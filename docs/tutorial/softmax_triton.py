"""A row softmax in Triton, with a hand-written backward: the kernel under test."""

import torch
import triton
import triton.language as tl

from oracle import implementation


@triton.jit
def _forward(X, Y, stride_x, stride_y, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < cols
    x = tl.load(X + row * stride_x + offsets, mask=mask, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(Y + row * stride_y + offsets, e / tl.sum(e, axis=0), mask=mask)


@triton.jit
def _backward(Y, DY, DX, stride, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < cols
    y = tl.load(Y + row * stride + offsets, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + row * stride + offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(DX + row * stride + offsets, y * (dy - tl.sum(y * dy, axis=0)), mask=mask)


class Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X):
        x = X.reshape(-1, X.shape[-1])
        if x.stride(-1) != 1:
            x = x.contiguous()
        y = torch.empty(x.shape, dtype=X.dtype, device=X.device)
        block = triton.next_power_of_2(x.shape[1])
        _forward[(x.shape[0],)](x, y, x.stride(0), y.stride(0), x.shape[1], BLOCK=block)
        ctx.save_for_backward(y)
        return y.view(X.shape)

    @staticmethod
    def backward(ctx, dY):
        (y,) = ctx.saved_tensors
        dy = dY.reshape(y.shape).contiguous()
        dx = torch.empty_like(y)
        _backward[(y.shape[0],)](y, dy, dx, y.stride(0), y.shape[1], BLOCK=triton.next_power_of_2(y.shape[1]))
        return dx.view(dY.shape)


def softmax(X):
    return Softmax.apply(X)


impl = implementation(softmax=softmax)
