"""Declaring ops and implementations: the ``Op`` a user writes (op.py), the spec the harness builds
from it (spec.py), the registry of every declared op (registry.py), implementations and how they
are loaded (implementations.py), and the marker for code that mirrors Hugging Face's (reference.py).
The public names are re-exported by ``oracle`` itself."""

from oracle.declare.op import (PARAMETER_VALUES, Choice, DeclarationError, Dim, Fixed, Integers, Op, Tensor,  # noqa: F401
                               call_module, from_module)

__all__ = ["PARAMETER_VALUES", "Choice", "DeclarationError", "Dim", "Fixed", "Integers", "Op", "Tensor", "call_module",
           "from_module"]
