"""The registry: one module per op (or per family of ops sharing HF's maths), each holding HF's
maths, its cases, its noise model, its specs and its benchmark (docs/design.md §6). Everything else
in the harness enumerates ``SPECS``. Adding an op: one module here, listed in ``MODULES``."""

from __future__ import annotations

from ..specs import OpSpec
from . import rms_norm, rope, swiglu

MODULES = (rms_norm, rope, swiglu)

SPECS: dict[str, OpSpec] = {spec.name: spec for module in MODULES for spec in module.SPECS}
