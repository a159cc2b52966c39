"""peers/unsloth: Unsloth's LoRA Functions and fast cross-entropy, declared from outside the harness.
Without a GPU the implementation is unavailable unless Unsloth's own switch UNSLOTH_ALLOW_CPU=1 is
set, and either way a missing package is named with its install line (these run everywhere). Where
Unsloth is installed, float32 cases of two ops pass through the engine on the CPU.

Each check runs in a subprocess: registering the declarations here would add ops to
``oracle.declare.registry.SPECS`` for every later test of this session."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
INSTALLED = importlib.util.find_spec("unsloth") is not None and importlib.util.find_spec("unsloth_zoo") is not None

LOAD = r"""
from oracle.declare.implementations import ImplementationUnavailable, load
from oracle.declare.registry import load_declarations

load_declarations("peers.unsloth.ops")
try:
    load("peers.unsloth.impl:impl")
    print("loaded")
except ImplementationUnavailable as exc:
    print("unavailable:", exc)
"""

CASES = r"""
import json, torch
from oracle.cases import CPU_BUDGET
from oracle.engine import run_case
from oracle.declare.implementations import load
from oracle.declare.registry import SPECS
from oracle.declare.registry import load_declarations

load_declarations("peers.unsloth.ops")
impl = load("peers.unsloth.impl:impl")
verdicts = {}
for op, count in (("lora_o", 3), ("lora_mlp", 2)):
    cases = SPECS[op].stratified("float32", CPU_BUDGET)[:count]
    results = [run_case(SPECS[op], case, impl, torch.device("cpu")) for case in cases]
    verdicts[op] = [(result.case.summary(), result.passed, result.explain()) for result in results]
print(json.dumps(verdicts))
"""


def _python(script: str, **env) -> str:
    environment = {k: v for k, v in os.environ.items() if k != "UNSLOTH_ALLOW_CPU"} | env
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, env=environment,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU Unsloth imports without its switch")
def test_on_a_cpu_without_unsloths_switch_it_is_unavailable_saying_how():
    said = _python(LOAD)
    assert said.startswith("unavailable:") and "UNSLOTH_ALLOW_CPU=1" in said, said


@pytest.mark.skipif(INSTALLED, reason="Unsloth is installed here")
def test_without_unsloth_installed_it_is_unavailable_with_the_install_line():
    said = _python(LOAD, UNSLOTH_ALLOW_CPU="1")
    assert said.startswith("unavailable:") and "pip install --no-deps unsloth==2026.10.9" in said, said


@pytest.mark.skipif(not INSTALLED, reason="Unsloth is not installed: pip install --no-deps unsloth==2026.10.9 "
                                           "unsloth_zoo==2026.10.9")
def test_float32_cases_of_two_ops_pass_on_the_cpu():
    verdicts = json.loads(_python(CASES, UNSLOTH_ALLOW_CPU="1"))
    for op, results in verdicts.items():
        assert results, op
        for summary, passed, explanation in results:
            assert passed, f"{summary}\n{explanation}"
