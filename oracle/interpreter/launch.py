"""Launching a kernel under Triton's CPU interpreter as a GPU launch does: scalar arguments typed as
the GPU's launcher types them, libdevice bound as the compiler binds it, and the kernel's name known
to any refusal.

Note [Scalar arguments under the interpreter]
    A GPU launch types every non-constexpr argument from its Python value (Triton's ``mangle_type``):
    an int is an i32 (i64 or u64 when large) scalar tensor, a float an fp32 one. The interpreter does
    so for ints but passes a float through as a Python float, which has no ``.to`` and, as a weak
    constant, promotes differently: ``x_bf16 * eps`` is a bf16 product there and an fp32 one on a
    GPU. ``install`` wraps the interpreter's argument conversion so that a float becomes the fp32
    scalar the GPU's launcher makes, and a bool the i1 one (triton 3.6's interpreter has no bool
    case and fails on one).

Note [A builtin under a library's name]
    The interpreter binds the builtins of the ``triton.language`` modules a kernel's globals hold
    (``tl.cast``), but not a builtin the library bound to a name of its own (Unsloth's
    ``triton_cast = tl.cast``): called as it is, it raises "Did you forget to add @triton.jit ?".
    The GPU compiler resolves any global to its builtin, so each such name is bound for the launch
    to the builtin called as the interpreter calls tl's own, and restored afterwards.
"""

from __future__ import annotations

import functools
import inspect

from oracle.interpreter import libdevice as interpreter_libdevice
from oracle.interpreter.refusal import entering, leaving


def _scalar_conversion(original):
    import numpy as np
    import triton
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    def implicit_cvt(arg):
        if isinstance(arg, bool):
            return tl.tensor(TensorHandle(np.array([arg], dtype=np.bool_), tl.int1), tl.int1)
        if isinstance(arg, float):
            ty = tl.str_to_ty(triton.runtime.jit.mangle_type(arg), None)
            with np.errstate(over="ignore"):
                return tl.tensor(TensorHandle(np.array([arg], dtype=np.float32), ty), ty)
        return original(arg)

    implicit_cvt._oracle_original = original
    return implicit_cvt


class _Scope:
    """Triton's patch scope plus the names this module rebound in a kernel's globals."""

    def __init__(self, inner):
        self.inner = inner
        self.rebound: list[tuple[dict, str, object]] = []

    def restore(self):
        while self.rebound:
            namespace, name, value = self.rebound.pop()
            namespace[name] = value
        self.inner.restore()


@functools.cache
def _libdevice():
    """(generic stub module, CUDA module, {id of an original function: its name}, {name: interpreted})."""
    from triton.language.extra import libdevice as generic
    from triton.runtime.interpreter import interpreter_semantic

    try:
        from triton.language.extra.cuda import libdevice as cuda
    except ImportError:  # a triton without the CUDA backend's module: every call refused by name
        cuda = None
    names = interpreter_libdevice.public_names()
    originals = {}
    for name in names:
        originals[id(getattr(generic, name))] = name
        if cuda is not None and hasattr(cuda, name):
            originals[id(getattr(cuda, name))] = name
    interpreted = {}
    for name in names:
        if cuda is None or not hasattr(cuda, name):
            interpreter_libdevice.REFUSED.setdefault(name, "the loaded triton has no CUDA libdevice function of "
                                                           "that name")
        interpreted[name] = interpreter_libdevice.interpreted_function(name, cuda, interpreter_semantic)
    return generic, cuda, originals, interpreted


def _builtin_call(builtin, *args, **kwargs):
    from triton.runtime.interpreter import interpreter_semantic

    kwargs.pop("_semantic", None)
    return builtin(*args, **kwargs, _semantic=interpreter_semantic)


def _binding_patch(original):
    from triton.language.core import is_builtin

    def patch_lang(fn):
        scope = _Scope(original(fn))
        generic, cuda, originals, interpreted = _libdevice()
        for module in (generic, cuda):
            if module is None or getattr(module, "tanh", None) is interpreted.get("tanh"):
                continue  # bound already (a device function called within a launch)
            for name, impl in interpreted.items():
                if hasattr(module, name):
                    scope.inner.set_attr(module, name, impl)
        namespace = fn.__globals__
        for key, value in list(namespace.items()):
            name = originals.get(id(value)) if callable(value) else None
            if name is not None:
                scope.rebound.append((namespace, key, value))
                namespace[key] = interpreted[name]
            elif is_builtin(value):  # Note [A builtin under a library's name]
                scope.rebound.append((namespace, key, value))
                namespace[key] = functools.partial(_builtin_call, value)
        return scope

    patch_lang._oracle_original = original
    return patch_lang


def _named_launch(original):
    def call(self, *args, **kwargs):
        entering(self.fn)
        try:
            return original(self, *args, **kwargs)
        finally:
            leaving()

    call._oracle_original = original
    return call


def install() -> None:
    """Install the scalar typing, the libdevice binding and the launch naming in the loaded
    interpreter (once)."""
    import triton.runtime.interpreter as interp

    if not hasattr(interp._implicit_cvt, "_oracle_original"):
        interp._implicit_cvt = _scalar_conversion(interp._implicit_cvt)
    if not hasattr(interp._patch_lang, "_oracle_original"):
        interp._patch_lang = _binding_patch(interp._patch_lang)
    if not hasattr(interp.GridExecutor.__call__, "_oracle_original"):
        interp.GridExecutor.__call__ = _named_launch(interp.GridExecutor.__call__)
    builder = interp.InterpreterBuilder
    if not getattr(builder.create_extern_elementwise, "_oracle_libdevice", False):
        def create_extern_elementwise(self, *args):
            return interpreter_libdevice.extern_elementwise(self, *args)
        create_extern_elementwise._oracle_libdevice = True
        create_extern_elementwise._oracle_original = builder.create_extern_elementwise
        builder.create_extern_elementwise = create_extern_elementwise


def installed() -> bool:
    import triton.runtime.interpreter as interp

    return hasattr(interp._implicit_cvt, "_oracle_original") and hasattr(interp._patch_lang, "_oracle_original")


def uninstall() -> None:
    """Put the interpreter's own conversion, binding and external call back (for tests proving that
    each matters); ``install`` puts them in again."""
    import triton.runtime.interpreter as interp

    for owner, name in ((interp, "_implicit_cvt"), (interp, "_patch_lang"), (interp.GridExecutor, "__call__"),
                        (interp.InterpreterBuilder, "create_extern_elementwise")):
        current = inspect.getattr_static(owner, name) if isinstance(owner, type) else getattr(owner, name)
        if hasattr(current, "_oracle_original"):
            setattr(owner, name, current._oracle_original)
