"""Autotuned Triton kernels under the harness: each launch runs one config the harness chose, never
a benchmark.

Note [One config per case]
    ``triton.autotune`` benchmarks every config the first time it sees a new key (the widths, and the
    dtypes of the tensor arguments). Hypothesis draws a new width nearly every case, so on a GPU nearly
    every case would compile and time every config, and under the CPU interpreter there is no driver
    to time them with (``RuntimeError: 0 active drivers``). ``install`` wraps Triton's
    ``Autotuner.run`` once, class-wide, so it also covers kernels decorated before it ran:

    - under the interpreter, always; on a GPU, only inside ``pinned(case_number)`` (elsewhere, the
      benchmark and a user's own timing runs autotune as Triton does);
    - the configs left after the kernel's own pruning (``prune_configs_by``) are the candidates, and
      the launch runs candidate ``case_number % len(candidates)``: a run's cases cycle through all of
      a kernel's configs, so each is judged (a wrong config is a bug autotuning hides until the day
      it wins), and a case always runs the same one, so its repro does too;
    - the config runs through Triton's own single-config path (its pre_hook included; nothing is
      reset or restored, as on a GPU once the key is cached), with ``configs`` narrowed to it for
      the call;
    - every launch is recorded: ``chosen()`` says which config of which kernel ran in the current
      case, for the failure text.
    Outside ``pinned`` under the interpreter the case number is 0: the first surviving config.
    ``case_hook`` does the same per case for the engine's in-flight hooks, numbering a case by its
    summary (so its repro runs the config that judged it).
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
import types

from oracle.interpreter.patches import unpatched
from oracle.kernel_coverage import RECORDER

# One state for the whole process, not per thread: autograd runs a GPU backward on a thread of its
# own, so a thread-local pin left every backward kernel autotuning on the H200 (Liger's DyT: 18
# configs benchmarked at each new width, 7-10 s a case). A process runs one case at a time.
_STATE = types.SimpleNamespace(case=None, log=None)


def _case_number() -> int | None:
    return getattr(_STATE, "case", None)


def _record(kernel: str, config) -> None:
    log = getattr(_STATE, "log", None)
    if log is not None:
        entry = f"{kernel}: {config}"
        if entry not in log:
            log.append(entry)


@contextlib.contextmanager
def pinned(case_number: int):
    """Within this block every autotuned launch runs config ``case_number % len(configs)``; the
    configs that ran are listed by ``chosen()`` until the block ends."""
    previous = (_case_number(), getattr(_STATE, "log", None))
    _STATE.case, _STATE.log = int(case_number), []
    try:
        yield
    finally:
        _STATE.case, _STATE.log = previous


def case_number(case) -> int:
    """A case's stable number (from a SHA-256 of its summary): the same case, and so its repro, runs
    the same config; a run's cases spread over all of a kernel's configs. Not crc32: it is linear in
    the bits of its input, so summaries that differ in a few characters can share its residues (the
    five bf16 stratified cases of swiglu_fg_kernel were all odd: one config of two judged)."""
    return int.from_bytes(hashlib.sha256(case.summary().encode()).digest()[:8], "little")


def case_hook(case, impl_name=None, check=None) -> None:
    """An ``oracle.engine.INFLIGHT_HOOKS`` hook: pins autotuned launches to ``case_number(case)`` from
    the start of a case to its end (``case`` None); ``chosen()`` keeps naming the configs of the case
    that just ended until the next one starts, for its failure text."""
    if case is None:
        _STATE.case = None
    else:
        _STATE.case, _STATE.log = case_number(case), []


def chosen() -> list[str]:
    """'kernel: config' for each autotuned kernel launched so far in the current ``pinned`` block."""
    return list(getattr(_STATE, "log", None) or [])


def _interpreted() -> bool:
    triton = sys.modules.get("triton")
    return triton is not None and bool(triton.knobs.runtime.interpret)


def _kernel_name(tuner) -> str:
    base = getattr(tuner, "base_fn", None) or getattr(tuner, "fn", None)
    return getattr(base, "__qualname__", None) or getattr(base, "__name__", repr(base))


def _pinned_run(original):
    def run(self, *args, **kwargs):
        case = _case_number()
        if case is None and not _interpreted():
            return original(self, *args, **kwargs)
        self.nargs = dict(zip(self.arg_names, args))
        candidates = list(self.prune_configs(kwargs)) if len(self.configs) > 1 else list(self.configs)
        candidates = candidates or list(self.configs)  # triton 3.6's top_k pruning can leave none
        config = candidates[(case or 0) % len(candidates)]
        _record(_kernel_name(self), config)
        RECORDER.config_ran(self, config, len(self.configs))
        every = self.configs
        self.configs = [config]
        try:
            return original(self, *args, **kwargs)
        finally:
            self.configs = every

    run._oracle_original = original
    return run


def install() -> bool:
    """Wrap the loaded triton's ``Autotuner.run`` (once); False when triton has no autotuner."""
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:
        return False
    if not hasattr(Autotuner.run, "_oracle_original"):
        Autotuner.run = _pinned_run(Autotuner.run)
    return True


@contextlib.contextmanager
def unpinned():
    """Run with Triton's own ``Autotuner.run`` (for tests proving the pinning matters)."""
    from triton.runtime.autotuner import Autotuner

    with unpatched(Autotuner, "run"):
        yield
