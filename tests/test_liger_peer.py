"""peers/liger: Liger-Kernel 0.8.5's op set, declared from outside the harness. Cheap checks (one
subprocess, about half a minute on 2 cores): the declarations load, every declared op has an
implementation in peers.liger.impl or a stated reason, every module of liger_kernel/ops/ is either
declared or listed with its reason, and float32 cases of two ops pass through the engine. Skipped
where liger-kernel is not installed (``pip install --no-deps liger-kernel==0.8.5``).

The declarations are registered in a subprocess: registering them here would add ops to
``oracle.declare.registry.SPECS`` for every later test of this session."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from oracle.declare.registry import SPECS

ROOT = Path(__file__).resolve().parents[1]

if importlib.util.find_spec("liger_kernel") is None:
    pytest.skip("liger-kernel is not installed: pip install --no-deps liger-kernel==0.8.5", allow_module_level=True)

SCRIPT = r"""
import json, sys, torch
from oracle.cases import CPU_BUDGET
from oracle.engine.devices import default_device
from oracle.engine import run_case
from oracle.declare.implementations import load
from oracle.declare.registry import SPECS
from oracle.declare.registry import load_declarations

declared = load_declarations("peers.liger.ops")
impl = load("peers.liger.impl:impl")
verdicts = {}
for op, count in (("relu_squared", 4), ("qwen2vl_mrope", 2)):
    cases = SPECS[op].stratified("float32", CPU_BUDGET)[:count]
    results = [run_case(SPECS[op], case, impl, default_device()) for case in cases]
    verdicts[op] = [(result.case.summary(), result.passed, result.explain()) for result in results]
print(json.dumps({"declared": declared, "given": [op for op in declared if impl.op(op) is not None],
                  "lacking": {op: why for op, why in impl.declared_lacking().items() if op in declared},
                  "verdicts": verdicts}))
"""


@pytest.fixture(scope="module")
def peer() -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_declared_op_is_given_or_has_a_reason(peer):
    assert len(peer["declared"]) >= 15, peer["declared"]
    for op in peer["declared"]:
        assert op in peer["given"] or peer["lacking"].get(op), f"{op}: neither implemented nor given a reason"
    from oracle.ops import MODULES

    built_in = {spec.name for module in MODULES for spec in module.SPECS}  # --impl liger covers Liger's among them
    assert not built_in & set(peer["declared"]), "built-in ops declared again"


def test_every_module_of_liger_ops_is_declared_or_listed():
    from peers.liger import ops as declarations  # the module alone: registering its ops is the subprocess's

    ops_dir = Path(importlib.util.find_spec("liger_kernel").submodule_search_locations[0]) / "ops"
    modules = {p.stem for p in ops_dir.glob("*.py") if not p.stem.startswith("_") and p.stem not in ("utils", "configure")}
    declared = {op.name for op in vars(declarations).values() if type(op).__name__ == "Op"}
    listed = {name.strip() for key in declarations.NOT_DECLARED for name in key.split(",")}
    listed = {name.split(" ")[0].split("/")[0] for name in listed}
    missing = sorted(modules - declared - listed)
    assert not missing, f"modules of liger_kernel/ops/ neither declared nor listed in NOT_DECLARED: {missing}"


@pytest.mark.parametrize("op", ["relu_squared", "qwen2vl_mrope"])
def test_float32_cases_pass(peer, op):
    assert peer["verdicts"][op], f"no case of {op} ran"
    for summary, passed, text in peer["verdicts"][op]:
        assert passed, f"{summary}\n{text}"


LIGER_BUILTINS = importlib.import_module("peers.liger.builtin").impl  # what --impl liger provides


@pytest.mark.parametrize("op", [op for op in SPECS if callable(getattr(LIGER_BUILTINS, op, None))])
def test_the_numbers_adapter_keeps_ligers_in_place_writes_from_the_caller(op, device):
    """peers/liger/numbers.py: where --impl liger fails a case on its in-place writes alone (every
    numerical judgement ok), the adapter passes the same case, with the same numbers."""
    from oracle.cases import CPU_BUDGET
    from oracle.engine import run_case
    from oracle.declare.implementations import load

    adapter = load("peers.liger.numbers:impl")  # first: on a CPU it puts Liger's kernels in the interpreter
    liger = load("liger")
    for case in SPECS[op].stratified("float32", CPU_BUDGET)[:8]:
        plain = run_case(SPECS[op], case, liger, device)
        if plain.findings:  # Liger writes in place where its layout lets it
            break
    assert plain.findings and all(v.passed for v in plain.verdicts), plain.explain()
    numbers = run_case(SPECS[op], case, adapter, device)
    assert numbers.passed, numbers.explain()
    assert [v.max_abs for v in numbers.verdicts] == [v.max_abs for v in plain.verdicts]
