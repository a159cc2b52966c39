"""Where the kernels run (kernels/_runtime.py), and the bf16 correction the harness installs for them, as for any
library's kernels (docs/design.md §5, oracle/interpreter/)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import kernels
from kernels import _runtime
from oracle import interpreter
from oracle.ops import rms_norm as norm_ops

interpreter_only = pytest.mark.skipif(not _runtime.interpreted(), reason="the interpreter's casts only matter on CPU")


@interpreter_only
def test_bf16_casts_are_corrected_and_the_correction_is_needed():
    assert interpreter.ensure_faithful_bf16() in ("corrected", "faithful")
    assert interpreter.probe_bf16_casts() == {"fp32_to_bf16": 0.0, "bf16_to_fp64": 0.0}
    with interpreter.uncorrected_bf16_casts():
        raw = interpreter.probe_bf16_casts()
    if interpreter.ensure_faithful_bf16() == "faithful":
        pytest.skip(f"triton {kernels._runtime.triton.__version__}'s interpreter already rounds bf16 correctly")
    # triton 3.9 truncates about half of all fp32 -> bf16 casts and garbles bf16 -> fp64 ones.
    assert raw["fp32_to_bf16"] > 0.3 and raw["bf16_to_fp64"] > 0.3


@interpreter_only
def test_kernel_bf16_results_match_round_to_nearest_even_only_with_the_correction():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 256, generator=gen).bfloat16()
    w = (1 + 0.1 * torch.randn(256, generator=gen)).bfloat16()
    expected = norm_ops.gemma_rms_norm(x, w, 1e-6)  # one fp32 -> bf16 rounding per element, as the kernel does
    assert torch.equal(kernels.rms_norm(x, w, 1e-6, gemma=True).view(torch.int16), expected.view(torch.int16))
    if interpreter.ensure_faithful_bf16() == "corrected":
        with interpreter.uncorrected_bf16_casts():
            truncated = kernels.rms_norm(x, w, 1e-6, gemma=True)
        assert (truncated.view(torch.int16) != expected.view(torch.int16)).float().mean() > 0.2


def test_the_harness_loaded_the_kernels_as_any_implementation():
    """kernels/ imports no harness: the harness prepared it (interpreter, bf16 casts) as it prepares any
    --impl module, and records where it ran."""
    summary = interpreter.loaded_runtime()
    assert summary is not None and "kernels" in interpreter.prepared_modules()
    assert summary["backend"] == ("triton-interpreter" if _runtime.interpreted() else "cuda")
    assert summary["bf16_casts"] in ("native", "faithful", "corrected")


_IMPORT_KERNELS = "import os, kernels; print(os.environ.get('TRITON_INTERPRET'), kernels._runtime.interpreted())"


def _import_kernels_with_each(*envs: dict) -> list[str]:
    """What importing the kernels prints in each environment, the processes at once (each start-up is
    seconds)."""
    started = [subprocess.Popen([sys.executable, "-c", _IMPORT_KERNELS], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env) for env in envs]
    outputs = [proc.communicate(timeout=300) for proc in started]
    for proc, (_, err) in zip(started, outputs):
        assert proc.returncode == 0, err
    return [out.strip() for out, _ in outputs]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cpu_machine_picks_the_interpreter_without_being_told():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    assert _import_kernels_with_each(env) == ["1 True"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_interpreter_works_when_triton_was_imported_first():
    """transformers imports torch._dynamo, which imports triton before the kernels can choose."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("import torch._dynamo, sys; assert 'triton.language' in sys.modules; import torch, kernels; "
            "x = torch.randn(3, 8); print(kernels.rms_norm(x, torch.ones(8), 1e-6).shape)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and "torch.Size([3, 8])" in proc.stdout, proc.stderr


def test_an_explicit_choice_is_respected():
    envs = [{**os.environ, "TRITON_INTERPRET": "1"}] + \
        ([{**os.environ, "TRITON_INTERPRET": "0"}] if torch.cuda.is_available() else [])
    assert _import_kernels_with_each(*envs) == ["1 True", "0 False"][:len(envs)]
