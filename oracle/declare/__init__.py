"""Declaring ops and implementations: the parts of a declaration (parts.py) and the ``Op`` a user
writes (op.py), checked (validate.py) and built into the spec the harness runs (build.py, spec.py);
the registry of every declared op (registry.py); implementations and how they are loaded
(implementations.py); the marker for code that mirrors Hugging Face's (reference.py). A user's code
imports the public names from ``oracle`` itself."""

from oracle.declare.op import Op, call_module, from_module  # noqa: F401
from oracle.declare.parts import (PARAMETER_VALUES, Choice, Dim, DtypeChoice, Fixed, Integers, PerVariant,  # noqa: F401
                                  Tensor)
from oracle.errors import DeclarationError  # noqa: F401

__all__ = ["PARAMETER_VALUES", "Choice", "DeclarationError", "Dim", "DtypeChoice", "Fixed", "Integers", "Op",
           "PerVariant", "Tensor", "call_module", "from_module"]
