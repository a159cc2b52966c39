"""Every error the harness raises on purpose, in one place: what a user catches, and what each
tool turns into an exit status (a usage error: pytest's 4, the report's 2)."""

from __future__ import annotations

from oracle.interpreter.refusal import InterpreterRefusal  # noqa: F401 - the interpreter's own, re-exported


class DeclarationError(ValueError):
    """Every mistake in declaring an op, a module of them or an implementation: the message names
    where (the op, the module), the field, what was given and what is expected."""


class ImplementationUnavailable(RuntimeError):
    """The implementation cannot be loaded here (a missing optional package, a module that raises on
    import, no GPU); the reason says why."""


class CaseFailed(AssertionError):
    """A case's verdict failed; the message is its explain() text, ``result`` the CaseResult."""

    def __init__(self, result):
        super().__init__(result.explain())
        self.result = result


class CaseError(CaseFailed):
    """A case ended in an exception or a crash, not in a verdict (its explain() has the traceback)."""


class CaseTimeout(Exception):
    """A case ran past the time limit."""


class Float64Failure(AssertionError):
    """A float64 check failed (the forward against the truth, gradcheck, or a raw kernel against HF's
    formula); the message has the case, what failed, the repro command and the NO_FLOAT64 hint."""


class BaselineError(Exception):
    """The report's baseline cannot be used (missing, malformed, another platform): exit 2."""


class GateRefused(ValueError):
    """The benchmark's gate cannot judge this run against this baseline (exit 2): they were measured on
    different platforms, a ratio is not a positive number, or no ratio is in both."""


class BenchFileError(ValueError):
    """A stored benchmark run that cannot be plotted; the message says why."""
