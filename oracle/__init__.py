"""The oracle: Hugging Face's maths exactly, a float64 truth, and the differential engine around them.

This module is the public API; its names are all a user's code needs, imported as
``from oracle import Op, Tensor, Dim, implementation``. Everything not exported here (``__all__``)
is internal and may change between versions: the modules under ``oracle/`` (``oracle.declare``,
``oracle.engine``, ...) are the harness's own layout (docs/design.md §8), not a contract.

Declare an op (what it computes, how its inputs are drawn; docs/howto/declare-an-op.md)::

    Op(name, reference=..., inputs={...}, dims={...}, params={...}, outputs=(...))
    Tensor(*dims, dtype="case", values="case", layout=None)   an input: sizes by dim name
    Dim(low, high, special=(), programs=False, multiple=1)    how one size is drawn
    Choice(a, b, ...)   a param drawn per case      Fixed(value)   a param passed as it is
    PerVariant(llama=..., gemma=...)                          a param or a tensor's values per variant
    DtypeChoice("weight", same="case", float32="float32")     a tensor's dtype drawn per case
    Integers(low, high, sprinkle)                             an integer input's values
    Positions(whole_first_row=...)                            packed position ids (sequences restart at 0)
    VALUE_KINDS, GRAD_KINDS                                   the kinds of input values and of incoming
                                                              gradient a case draws (value_kinds=, grad_kinds=)
    ErrorInput(description, args, error, match)               a bad input and what it must raise
    from_module(name, Model, get_inputs, get_init_inputs)     an op from a KernelBench nn.Module
    call_module(module, inputs, parameters)                   module(*inputs) with those weights

Implement it (docs/howto/test-a-built-in-op.md)::

    impl = implementation(my_op=fn, CLOBBERS=..., LACKING=..., NO_FLOAT64=..., COMPILES=...)

Run it from a script (pytest and the command-line tools need none of this)::

    load_declarations("mylib.declared")   registers a module's ops in SPECS (by name), returns them
    impl = load("mylib.impls:impl")       an Implementation: also "kernels", "hf", "compile", "liger"
    impl.my_op(*inputs, *params)          an op it provides, called as the reference is
    dir(impl)                             the ops it provides
    run_case(SPECS["my_op"], case, impl, device)   one case through every check: a CaseResult
    SPECS["my_op"].stratified("float32", CPU_BUDGET)  cases to run (GPU_BUDGET on a GPU)

Errors (each tool turns the usage errors into its exit status)::

    DeclarationError          a malformed Op, module of declarations or implementation (a ValueError)
    ImplementationUnavailable the implementation cannot load here (a missing package, no GPU)
    InterpreterRefusal        a Triton kernel does what the CPU interpreter cannot do as a GPU does
    CaseFailed, CaseError     a case's verdict failed, or the case raised (an AssertionError)
    CaseTimeout, Float64Failure, BaselineError, GateRefused, BenchFileError

Each name is imported on first use (PEP 562): ``import oracle.interpreter``, which runs before an
implementation's kernels are decorated, runs this module first, and must not load the registry of
ops or the harness behind it.
"""

from __future__ import annotations

import importlib

# Each public name -> the module that defines it: the one place a name's home is written.
_HOMES = {
    **dict.fromkeys(("Op", "from_module", "call_module"), "oracle.declare.op"),
    **dict.fromkeys(("Tensor", "Dim", "Choice", "Fixed", "Integers", "PerVariant", "DtypeChoice", "Positions",
                     "PARAMETER_VALUES"),
                    "oracle.declare.parts"),
    **dict.fromkeys(("GRAD_KINDS", "VALUE_KINDS"), "oracle.cases"),
    "ErrorInput": "oracle.declare.spec",
    **dict.fromkeys(("implementation", "load", "Implementation"), "oracle.declare.implementations"),
    **dict.fromkeys(("load_declarations", "SPECS"), "oracle.declare.registry"),
    "run_case": "oracle.engine",
    **dict.fromkeys(("CPU_BUDGET", "GPU_BUDGET"), "oracle.cases"),
    **dict.fromkeys(("DeclarationError", "ImplementationUnavailable", "InterpreterRefusal", "CaseFailed", "CaseError",
                     "CaseTimeout", "Float64Failure", "BaselineError", "GateRefused", "BenchFileError"),
                    "oracle.errors"),
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    """A public name, read from its home module (imported now if it was not): not cached here, so
    that the registry ``SPECS`` is always the registry's own."""
    if name not in _HOMES:
        # An AttributeError, never an import: ``from oracle import cases`` asks here first, then imports the submodule.
        raise AttributeError(f"module 'oracle' has no attribute {name!r}; its public names are {', '.join(__all__)}")
    return getattr(importlib.import_module(_HOMES[name]), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
