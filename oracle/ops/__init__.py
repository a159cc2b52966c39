"""The registry: one module per op (or per family of ops sharing HF's maths), each holding HF's
maths, its cases, its noise model, its specs and its benchmark (docs/design.md §6). Everything else
in the harness enumerates ``SPECS``.

Every module in this package that defines ``SPECS`` (a tuple of OpSpecs) is an op module, found
here by name order: adding an op is adding its module, nothing else in the oracle. Helper modules
(shared plumbing, like elementwise.py) define no ``SPECS``.
"""

from __future__ import annotations

import importlib
import pkgutil

from ..specs import OpSpec


def _op_modules() -> list:
    modules = [importlib.import_module(f"{__name__}.{info.name}") for info in pkgutil.iter_modules(__path__)]
    return [module for module in modules if hasattr(module, "SPECS")]


MODULES = tuple(_op_modules())

SPECS: dict[str, OpSpec] = {spec.name: spec for module in MODULES for spec in module.SPECS}
