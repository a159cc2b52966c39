"""A declared op and a Triton kernel for kernel coverage's tests (tests/test_kernel_coverage.py): the
kernel doubles each row, and under a constexpr FLAG takes another way to the same bits. ``impl``
never sets FLAG, so no case reaches its branch; ``flagged`` sets it for rows of odd width, which the
cases have, so every line runs."""

import torch
import triton
import triton.language as tl

from oracle import Dim, Op, Tensor, implementation

COVERAGE_DEMO = Op(
    "coverage_demo",
    reference=lambda X: X * 2,
    inputs={"X": Tensor("rows", "cols")},
    dims={"rows": Dim(1, 16, programs=True), "cols": Dim(1, 300, special=(1, 7, 128, 129))},
    dtypes=("float32",),  # one dtype and a grid of two points: the tests' runs stay short
    sweep=({"rows": 3, "cols": 7}, {"rows": 2, "cols": 130}),
    outputs=("Y",),
)


@triton.jit
def _double(X, Y, cols, BLOCK: tl.constexpr, FLAG: tl.constexpr):
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < cols
    x = tl.load(X + row * cols + offsets, mask=mask, other=0.0)
    y = x * 2
    if FLAG:
        y = x + x  # the same bits: x + x is 2x exactly
    tl.store(Y + row * cols + offsets, y, mask=mask)


def doubled(flag_odd_widths: bool):
    """The op: a launch per call, FLAG set for odd widths when ``flag_odd_widths``."""

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, X):
            x = X.reshape(-1, X.shape[-1]).contiguous()
            y = torch.empty_like(x)
            cols = x.shape[1]
            flag = flag_odd_widths and cols % 2 == 1
            _double[(x.shape[0],)](x, y, cols, BLOCK=triton.next_power_of_2(cols), FLAG=flag)
            return y.view(X.shape)

        @staticmethod
        def backward(ctx, dY):
            return dY * 2

    return Double.apply


impl = implementation(coverage_demo=doubled(flag_odd_widths=False))
flagged = implementation(coverage_demo=doubled(flag_odd_widths=True))
