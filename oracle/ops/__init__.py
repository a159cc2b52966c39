"""The built-in ops: one module per op (or per family of ops sharing HF's maths), each holding HF's
maths, its declarations and its benchmark (docs/design.md §6). The harness loads this package by
name, as it loads any module of declarations (oracle/declare/registry.py); nothing in its core
imports it.

Every module in this package that defines ``SPECS`` (a tuple of declarations: ``oracle.Op``s, as a
user writes them) is an op module, found here by name order: adding an op is adding its module,
nothing else in the oracle. Helper modules (shared plumbing, like elementwise.py; RMSNorm's
hand-written noise model, rms_norm_noise.py) define no ``SPECS``.
"""

from __future__ import annotations

import importlib
import pkgutil


def _op_modules() -> list:
    modules = [importlib.import_module(f"{__name__}.{info.name}") for info in pkgutil.iter_modules(__path__)]
    return [module for module in modules if hasattr(module, "SPECS")]


MODULES = tuple(_op_modules())
