"""What the CPU interpreter refuses to compute, and which kernel asked.

A kernel operation the interpreter cannot compute as a GPU does (oracle/interpreter/libdevice.py,
oracle/interpreter/arith.py) raises ``InterpreterRefusal`` naming the kernel and the reason, so that
the case ends as an error saying the CPU cannot judge it, never as a result judged against HF.
"""

from __future__ import annotations

import threading

_LAUNCHES = threading.local()


class InterpreterRefusal(NotImplementedError):
    """The CPU interpreter cannot compute this as a GPU would; the message names the kernel and why.
    Triton's launcher re-raises it as an InterpreterError whose ``__cause__`` is this."""


def current_kernel() -> str:
    """'module.kernel' of the interpreted launch in progress on this thread ('a kernel' outside one)."""
    stack = getattr(_LAUNCHES, "stack", None)
    return stack[-1] if stack else "a kernel"


def entering(fn) -> None:
    stack = _LAUNCHES.__dict__.setdefault("stack", [])
    stack.append(f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', getattr(fn, '__name__', fn))}")


def leaving() -> None:
    _LAUNCHES.stack.pop()


def refusal_in(exc: BaseException | None) -> InterpreterRefusal | None:
    """The InterpreterRefusal an exception was raised from, if any (for a caller that reports refusals
    apart from errors)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, InterpreterRefusal):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None
