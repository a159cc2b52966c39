"""The direct launch past Triton's binder (kernels/_launcher.py, Note [Launching past Triton's binder]):
on the CPU against a stand-in Triton, whose kernel logs what Triton's path and the direct launch were
given; on a GPU against Triton itself, bit for bit."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
import torch

import kernels
from kernels import _launcher


class _Chain:
    """Triton's HookChain: hooks registered, called in turn."""

    def __init__(self) -> None:
        self.calls = []


class _StandInKernel:
    """A JITFunction as the launcher sees it: ``kernel[grid](...)`` compiles and launches, and returns
    the compiled kernel, whose ``run`` is the direct launch. Both log what they were given."""

    arg_names = ["X", "n", "stride", "BLOCK", "EVEN"]
    params = [SimpleNamespace(name=name, default=default) for name, default in
              (("X", None), ("n", None), ("stride", None), ("BLOCK", None), ("EVEN", False))]

    def __init__(self, compiled_has=("run", "function", "packed_metadata")) -> None:
        self.debug = True
        self.log = []
        kernel = self

        class Compiled:
            function, packed_metadata = "function", "metadata"

            def run(self, *launch_args):
                kernel.log.append(("direct", launch_args))

        for name in {"run", "function", "packed_metadata"} - set(compiled_has):
            setattr(Compiled, name, None)
            delattr(Compiled, name)
        self.compiled = Compiled()

    def __getitem__(self, grid):
        def through_triton(*args, **options):
            self.log.append(("triton", grid, args, options))
            return self.compiled

        return through_triton


@pytest.fixture
def stand_in(monkeypatch):
    """A GPU as the launcher sees it (device 3, stream 77), Triton's JITFunction the stand-in."""
    knobs = SimpleNamespace(runtime=SimpleNamespace(launch_enter_hook=_Chain(), launch_exit_hook=_Chain()))
    monkeypatch.setattr(_launcher, "_knobs", knobs)
    monkeypatch.setattr(_launcher, "JITFunction", _StandInKernel)
    monkeypatch.setattr(_launcher, "interpreted", lambda: False)
    monkeypatch.setattr(_launcher, "current_device", lambda: 3)
    monkeypatch.setattr(_launcher, "current_stream", lambda device: 70 + device + 4)
    monkeypatch.setattr(_launcher, "_caches", {})
    return knobs


def _kinds(kernel: _StandInKernel) -> list[str]:
    return [entry[0] for entry in kernel.log]


def test_a_repeated_call_launches_directly_with_triton_s_arguments(stand_in):
    kernel, X = _StandInKernel(), torch.zeros(64)
    for _ in range(3):
        _launcher.launch(kernel, (5, 2), X, 64, 1, BLOCK=32, num_warps=4)
    assert _kinds(kernel) == ["triton", "direct", "direct"]
    assert kernel.log[0] == ("triton", (5, 2), (X, 64, 1), {"BLOCK": 32, "num_warps": 4})
    grid, stream, function, metadata, hooks, args = (kernel.log[1][1][:3], kernel.log[1][1][3], kernel.log[1][1][4],
                                                     kernel.log[1][1][5], kernel.log[1][1][6:9], kernel.log[1][1][9:])
    assert grid == (5, 2, 1) and stream == 77 and (function, metadata) == ("function", "metadata")
    assert hooks == (None, None, None)  # no hook registered: nothing to call, no metadata to build
    assert args[0] is X and args[1:] == (64, 1, 32, False)  # constexprs in signature order, defaults too


@pytest.mark.parametrize("change", ["int", "dtype", "alignment", "tensor -> None", "option", "debug", "device"])
def test_anything_that_decides_triton_s_specialisation_goes_through_triton_again(change, stand_in, monkeypatch):
    kernel = _StandInKernel()
    storage = torch.zeros(64)
    call = {"args": (storage[:32], 32, 1), "options": {"BLOCK": 32}}
    _launcher.launch(kernel, (1,), *call["args"], **call["options"])
    _launcher.launch(kernel, (1,), *call["args"], **call["options"])
    if change == "int":
        call["args"] = (storage[:32], 32, 16)  # a stride 16 is specialised (divisible by 16), 1 is too
    elif change == "dtype":
        call["args"] = (storage[:32].double(), 32, 1)
    elif change == "alignment":
        call["args"] = (storage[1:33], 32, 1)  # 4 bytes past a 16-byte boundary
    elif change == "tensor -> None":
        call["args"] = (None, 32, 1)
    elif change == "option":
        call["options"] = {"BLOCK": 32, "num_warps": 8}
    elif change == "debug":
        kernel.debug = False
    elif change == "device":
        monkeypatch.setattr(_launcher, "current_device", lambda: 0)
    _launcher.launch(kernel, (1,), *call["args"], **call["options"])
    _launcher.launch(kernel, (1,), *call["args"], **call["options"])
    assert _kinds(kernel) == ["triton", "direct", "triton", "direct"]


def test_the_same_signature_at_another_address_launches_directly(stand_in):
    kernel, storage = _StandInKernel(), torch.zeros(64)
    _launcher.launch(kernel, (1,), storage[:16], 16, 1)
    _launcher.launch(kernel, (1,), storage[16:32], 16, 1)  # 64 bytes further: aligned alike
    assert _kinds(kernel) == ["triton", "direct"]
    assert kernel.log[1][1][9].data_ptr() == storage[16:].data_ptr()


def test_registered_hooks_a_grid_function_and_the_switch_take_triton_s_path(stand_in, monkeypatch):
    kernel, X = _StandInKernel(), torch.zeros(8)
    _launcher.launch(kernel, (1,), X, 8, 1)
    stand_in.runtime.launch_enter_hook.calls.append(print)  # a profiler's hook: it must see every launch
    _launcher.launch(kernel, (1,), X, 8, 1)
    stand_in.runtime.launch_enter_hook.calls.clear()
    _launcher.launch(kernel, lambda meta: (1,), X, 8, 1)
    monkeypatch.setattr(_launcher, "DIRECT", False)
    _launcher.launch(kernel, (1,), X, 8, 1)
    monkeypatch.setattr(_launcher, "DIRECT", True)
    _launcher.launch(kernel, (1,), X, 8, 1)
    assert _kinds(kernel) == ["triton", "triton", "triton", "triton", "direct"]


def test_a_compiled_kernel_without_a_direct_launch_keeps_triton_s_path(stand_in):
    kernel, X = _StandInKernel(compiled_has=("run", "function")), torch.zeros(8)
    for _ in range(3):
        _launcher.launch(kernel, (1,), X, 8, 1)
    assert _kinds(kernel) == ["triton"] * 3


def test_the_interpreter_and_stand_ins_for_a_kernel_take_triton_s_path(stand_in, monkeypatch):
    X, calls = torch.zeros(8), []

    class Counting:  # what tests put in a kernel's place to count launches
        def __getitem__(self, grid):
            return lambda *args, **options: calls.append(grid)

    for _ in range(2):
        _launcher.launch(Counting(), (2,), X, 8, 1)
    assert calls == [(2,), (2,)] and not _launcher._caches
    monkeypatch.setattr(_launcher, "interpreted", lambda: True)
    kernel = _StandInKernel()
    for _ in range(2):
        _launcher.launch(kernel, (1,), X, 8, 1)
    assert _kinds(kernel) == ["triton", "triton"] and not _launcher._caches


def test_the_cache_of_a_kernel_starts_again_when_full(stand_in, monkeypatch):
    monkeypatch.setattr(_launcher, "MAX_SIGNATURES", 4)
    kernel, X = _StandInKernel(), torch.zeros(8)
    for n in range(10):
        _launcher.launch(kernel, (1,), X, n, 1)
        assert len(_launcher._caches[kernel].compiled) <= 4
    _launcher.launch(kernel, (1,), X, 9, 1)  # among the entries since the last restart
    _launcher.launch(kernel, (1,), X, 0, 1)  # dropped at a restart
    assert _kinds(kernel) == ["triton"] * 10 + ["direct", "triton"]


@pytest.mark.skipif(not torch.cuda.is_available() or kernels._runtime.interpreted(), reason="Triton's launch on a GPU")
def test_on_a_gpu_the_direct_launch_writes_the_bits_triton_s_launch_writes(monkeypatch):
    rope = importlib.import_module("kernels.rope")  # the module: ``kernels.rope`` is the function
    gen = torch.Generator(device="cuda").manual_seed(0)
    n = 2 * 4 * 8 * 64
    storage = torch.randn(n + 1, device="cuda", dtype=torch.bfloat16, generator=gen)
    cos, sin = torch.randn(2, 16, 64, device="cuda", generator=gen)
    monkeypatch.setattr(_launcher, "_caches", {})
    rotated = {}
    for direct in (False, True):
        monkeypatch.setattr(_launcher, "DIRECT", direct)
        for offset in (0, 1):  # Q 16-byte aligned, then 2 bytes off with the same shape and strides
            Q = storage.clone()[offset:offset + n].view(2, 4, 8, 64)
            K = Q[:, :2].clone()
            for _ in range(3):  # the first call of a signature goes through Triton, the others directly
                kernels.rope(Q, K, cos, sin)
            rotated[direct, offset] = (Q, K)
    for offset in (0, 1):
        assert all(torch.equal(a, b) for a, b in zip(rotated[True, offset], rotated[False, offset])), offset
    assert len(_launcher._caches[rope._rope_kernel].compiled) == 2  # one signature per alignment
