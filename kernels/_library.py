"""The kernels as torch.library custom ops: their namespace, and how each kernel module declares its ops.

Every public entry point of kernels/ is a thin Python wrapper: it validates its arguments (the
checks on dtypes, shapes, devices and flags, which torch.compile traces and turns into guards) and
then calls a custom op of the ``kernel_oracle`` namespace, which launches the Triton kernels (the
wrapper names it in ``wrapper.custom_op``; in eager mode the three autograd ops take a shortcut to
the same functions, Note [Eager autograd skips the dispatcher]). Under ``torch.compile`` the op is one opaque node of the
graph (no graph break): Dynamo and AOTAutograd run its fake implementation on fake tensors,
functionalize the arguments its schema marks mutated (``Tensor(a!)``, exactly the op's
``CLOBBERS``), and trace its registered autograd formula, whose backward is another custom op.
``torch.library.opcheck`` verifies each op (tests/test_compile.py).

Note [Eager autograd skips the dispatcher]
    A custom op's autograd runs in Python layers of the dispatcher (its autograd kernel, an
    autograd.Function inside it, a redispatch to the backend), and so does its backward op: on this
    project's CPU machine an empty SwiGLU costs 33 µs forward through the op against 10 µs through an
    autograd.Function, 120 against 75 µs forward and backward. Eager callers pay host time on every
    call, so in eager mode the three ops with an autograd formula (rms_norm, swiglu, geglu) apply
    their autograd.Function, which calls the very functions the ops register (forward, backward,
    the same launches); where torch.compile traces (``tracing()``) they call the op. RoPE's
    in-place op, which has no autograd formula, likewise runs its body directly in eager mode
    (its own autograd node marks the buffers dirty, which bumps their versions as the op's schema
    would): through the dispatcher its forward cost 54 µs of Python per call on the CPU, the direct
    call 14 (``python scripts/host_path_cpu.py``, launches stubbed). A call with nothing to
    differentiate (no grad mode, or no input that requires grad) builds no autograd node at all.
    The harness's compile check and
    tests/test_compile.py hold the two paths to the same bits. The raw kernels go through the
    dispatcher in both modes.

Note [Custom ops, not triton_op]
    ``torch.library.triton_op`` + ``wrap_triton`` would let Inductor see the Triton kernels inside an
    op. Under Triton's CPU interpreter they cannot work: a kernel there is an ``InterpretedFunction``
    rather than a ``JITFunction``, so ``wrap_triton`` does not turn its launch into a graph node and
    the fake tracing launches the interpreter on fake tensors (measured, torch 2.13 / triton 3.9:
    "Cannot access data pointer of Tensor (e.g. FakeTensor)"). ``custom_op`` with the existing launch
    code inside works on both machines, so the CPU suite proves what the GPU runs.

Note [What the wrapper checks, and what the op checks]
    The wrapper raises every TypeError/ValueError that metadata decides, before the op is called,
    exactly as before the ops existed. Checks that read memory (addresses: arguments that share
    memory; values: RoPE's positions inside the table) cannot run on fake tensors, so they run in
    the op's real implementation, just before its launch: in eager mode that is still before any
    kernel runs, and under torch.compile they run when the compiled graph executes, on the real
    tensors, instead of being lost.

Note [Mutation and version counters]
    A custom op whose schema marks an argument mutated bumps that argument's version counter
    itself (torch's ADInplaceOrView kernel for custom ops), so autograd raises if anything had saved
    it; the ops below never bump counters by hand. A custom op may not return an alias of an input
    and an op with mutated arguments may not have an autograd formula (torch refuses both), which
    is why the raw backwards return nothing (their wrappers return the buffers) and why RoPE's
    in-place autograd lives in its wrapper (kernels/rope.py, Note [RoPE under torch.compile]).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

NAMESPACE = "kernel_oracle"


def custom_op(name: str, mutates_args: Iterable[str] = ()) -> Callable:
    """Decorator: the function becomes ``torch.ops.kernel_oracle.<name>`` (its schema inferred from
    its annotations, argument names kept: the harness compares them with the contract's)."""
    return torch.library.custom_op(f"{NAMESPACE}::{name}", mutates_args=tuple(mutates_args))


def tracing() -> bool:
    """True while torch.compile (Dynamo) traces the calling code; False in eager mode."""
    return torch.compiler.is_compiling()


def calls(op) -> Callable:
    """Decorator for a public wrapper: records the custom op it calls as ``wrapper.custom_op``, which
    the harness reads to run opcheck and compare the op's mutations with ``CLOBBERS``."""
    def mark(wrapper: Callable) -> Callable:
        wrapper.custom_op = op
        return wrapper

    return mark
