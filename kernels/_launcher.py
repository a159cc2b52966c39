"""Launching a Triton kernel with less host time: ``launch(kernel, grid, *args, **options)`` does what
``kernel[grid](*args, **options)`` does, and skips Triton's binding when a call repeats one it has seen.

Note [Launching past Triton's binder]
    ``JITFunction.run`` works out on every call which compiled kernel the arguments need: it binds
    them to the signature, specialises each (a tensor by dtype and 16-byte alignment, an integer by
    its value being 1, divisible by 16, or past int32), turns that list and the options into a
    string key, looks the kernel up, then builds launch metadata for hooks and calls the launcher.
    For RoPE's 34 arguments that is most of a launch's host time: on the H200's host one RoPE launch
    took 31.4 µs through Triton and 18.6 µs directly (``scripts/host_profile.py``,
    reports/logs/host-profile-h200-direct-launch.log). A training loop repeats the same shapes, so
    here the first call of each exact signature goes through Triton (which compiles if it must and
    launches), and the compiled kernel is remembered under a key that decides Triton's answer: the
    current device, the kernel's ``debug`` flag, every argument's type, every non-tensor argument's
    value, every tensor's dtype and whether its address is a multiple of 16, and the options. Equal
    keys can only mean an equal specialisation, so a repeat launches that kernel directly
    (``CompiledKernel.run``, the call Triton itself ends with) with the same arguments, the
    constexprs appended in signature order as Triton passes them. Triton's own path is kept under
    the interpreter, while launch hooks are registered (a profiler's), for a grid that is a
    function, and for a Triton whose compiled kernels lack the attributes used here. Taken as fixed
    for the process, as Triton itself nearly does: the settings it reads from the environment
    (TRITON_DEBUG, its instrumentation mode) and the global constants a kernel reads, which Triton
    checks for changes on the first call of a signature only here. The cache per
    kernel holds ``MAX_SIGNATURES`` entries and starts again when full: a sweep over thousands of
    shapes pays Triton's path, a training loop does not.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence

import torch

from ._runtime import interpreted  # first: it picks Triton's backend before triton is imported

from triton.runtime.jit import JITFunction  # noqa: E402  (isort: after the backend's choice)

try:
    from triton import knobs as _knobs
except ImportError:  # a Triton before its knobs (3.3 and older): every launch takes Triton's own path
    _knobs = None

MAX_SIGNATURES = 256
DIRECT = True  # False: every launch takes Triton's own path (tests and scripts/host_profile.py compare both)
_dtype_of = operator.attrgetter("dtype")
_address_of = torch.Tensor.data_ptr


class _Compiled:
    """A compiled kernel's launch for one signature, and the constexprs Triton appends to the arguments."""

    __slots__ = ("run", "function", "metadata", "constexprs")

    def __init__(self, compiled, constexprs: tuple) -> None:
        self.run, self.function, self.metadata = compiled.run, compiled.function, compiled.packed_metadata
        self.constexprs = constexprs


class _Split:
    """Where the tensors are among a call's arguments, for one tuple of argument types."""

    __slots__ = ("tensors", "others")

    def __init__(self, types: tuple[type, ...]) -> None:
        tensor_at = [i for i, t in enumerate(types) if issubclass(t, torch.Tensor)]
        other_at = [i for i, t in enumerate(types) if not issubclass(t, torch.Tensor)]
        self.tensors = _picker(tensor_at)
        self.others = _picker(other_at)


def _picker(positions: list[int]) -> Callable[[Sequence], tuple]:
    """operator.itemgetter that always returns a tuple (itemgetter of one position returns the item)."""
    if not positions:
        return lambda args: ()
    if len(positions) == 1:
        (only,) = positions
        return lambda args: (args[only],)
    return operator.itemgetter(*positions)


class _KernelCache:
    def __init__(self) -> None:
        self.compiled: dict[tuple, _Compiled] = {}
        self.splits: dict[tuple[type, ...], _Split] = {}
        self.usable = True  # False once this Triton's compiled kernel lacks what the direct launch needs


_caches: dict[JITFunction, _KernelCache] = {}


def _launches_directly(kernel) -> bool:
    """A compiled Triton kernel on a GPU; not the interpreter's, nor a test's or script's stand-in."""
    return _knobs is not None and isinstance(kernel, JITFunction) and not interpreted()


def current_device() -> int:
    return torch.cuda.current_device()


def current_stream(device: int) -> int:
    return torch._C._cuda_getCurrentRawStream(device)


def _hooks_registered() -> bool:
    """True while Triton has launch hooks to call (a profiler's): the direct launch would skip them."""
    hooks = (_knobs.runtime.launch_enter_hook, _knobs.runtime.launch_exit_hook)
    return any(h is not None and getattr(h, "calls", True) for h in hooks)


def launch(kernel, grid: tuple[int, ...], *args, **options) -> None:
    """``kernel[grid](*args, **options)``, launching directly when this exact signature was seen
    (Note [Launching past Triton's binder])."""
    cache = _caches.get(kernel)
    if cache is None:
        if not _launches_directly(kernel):
            kernel[grid](*args, **options)
            return
        cache = _caches[kernel] = _KernelCache()
    if not (DIRECT and cache.usable and isinstance(grid, tuple)) or _hooks_registered():
        kernel[grid](*args, **options)
        return
    types = tuple(map(type, args))
    split = cache.splits.get(types)
    if split is None:
        split = cache.splits[types] = _Split(types)
    tensors = split.tensors(args)
    device = current_device()
    key = (device, kernel.debug, types, split.others(args), tuple(map(_dtype_of, tensors)),
           tuple(address % 16 == 0 for address in map(_address_of, tensors)), tuple(options.items()))
    compiled = cache.compiled.get(key)
    if compiled is None:
        _launch_through_triton(kernel, cache, key, grid, args, options)
        return
    compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
                 current_stream(device), compiled.function, compiled.metadata, None, None, None,
                 *args, *compiled.constexprs)


def _launch_through_triton(kernel, cache: _KernelCache, key: tuple, grid, args: tuple, options: dict) -> None:
    """Triton's own launch (compiling if it must), then its compiled kernel remembered under ``key``."""
    compiled = kernel[grid](*args, **options)
    if hasattr(compiled, "result"):  # a compilation still running in Triton's pool
        compiled = compiled.result()
    if not all(hasattr(compiled, name) for name in ("run", "function", "packed_metadata")):
        cache.usable = False
        return
    names = kernel.arg_names[len(args):]
    defaults = {p.name: p.default for p in kernel.params}
    constexprs = tuple(options[name] if name in options else defaults[name] for name in names)
    if len(cache.compiled) >= MAX_SIGNATURES:
        cache.compiled.clear()
    cache.compiled[key] = _Compiled(compiled, constexprs)
