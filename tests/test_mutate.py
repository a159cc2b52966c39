"""Mutation testing (python -m oracle.mutate): the operators make the bug classes they name, a run
classes each mutant, and bad usage is refused with a reason."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from conftest import ROOT, module_runs
from oracle.mutate import operators
from oracle.mutate.mutants import Mutant, mutants_of

KERNEL = textwrap.dedent('''\
    import triton
    import triton.language as tl


    @triton.jit
    def kernel(X, Y, DW, stride_x, stride_y, n, eps, BLOCK: tl.constexpr, COMPUTE: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(X + offsets * stride_x, mask=mask, other=0.0).to(tl.float32)
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(0, n, BLOCK):
            acc += x
        r = tl.rsqrt(tl.sum(x * x, axis=0) + eps)
        tl.atomic_add(DW + offsets, x * r, mask=mask)
        tl.store(Y + offsets * stride_y, -x * r + acc, mask=mask)


    def launch(x, y, n, block):
        kernel[(triton.cdiv(n, block),)](x, y, x, 1, 1, n, 1e-6, BLOCK=block, COMPUTE=tl.float32)
''')


@pytest.fixture
def mutants(tmp_path) -> list[Mutant]:
    path = tmp_path / "toy_kernel.py"
    path.write_text(KERNEL)
    return mutants_of(str(path), "toy_kernel", {"kernel"})


def _made(mutants, operator: str) -> set[str]:
    return {m.replacement for m in mutants if m.operator == operator}


def test_each_operator_makes_its_bug_class(mutants):
    assert "tl.load(X + offsets * stride_x)" in _made(mutants, "mask_dropped")
    assert "offsets <= n" in _made(mutants, "mask_off_by_one")
    assert "tl.load(X + offsets * stride_x, mask=mask, other=1.0)" in _made(mutants, "other_changed")
    assert "n // block" in _made(mutants, "last_block_skipped")  # in the host code that launches it
    assert "tl.load(X + offsets * stride_x, mask=mask, other=0.0)" in _made(mutants, "upcast_removed")
    assert "tl.sum((x * x).to(X.dtype.element_ty), axis=0)" in _made(mutants, "sum_narrowed")
    assert "tl.zeros((BLOCK,), dtype=X.dtype.element_ty)" in _made(mutants, "sum_narrowed")
    assert {"stride_y", "stride_x"} <= _made(mutants, "stride_swapped")
    assert "tl.store(Y + offsets * stride_y + 1, -x * r + acc, mask=mask)" in _made(mutants, "offset_off_by_one")
    assert "pass" in _made(mutants, "store_dropped")
    assert "-x * r - acc" in _made(mutants, "sign_changed")
    assert "-x * r" in _made(mutants, "term_dropped")
    assert "tl.rsqrt(tl.sum(x * x, axis=0)) + eps" in _made(mutants, "eps_moved")
    assert "range(0, n // BLOCK * BLOCK, BLOCK)" in _made(mutants, "tail_missed")
    assert "tl.atomic_add(DW + offsets, (x * r).to(tl.bfloat16).to(tl.float32), mask=mask)" in \
        _made(mutants, "atomic_narrowed")
    assert {m.operator for m in mutants} == set(operators.BY_NAME)


def test_a_mutant_is_one_edit_that_keeps_every_other_line(mutants):
    for m in mutants:
        before, after = KERNEL.splitlines(), m.source().splitlines()
        changed = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
        assert len(before) == len(after) and changed == [m.line - 1], m
        body = [line[0] for line in m.diff().splitlines()[2:] if line[:1] in "+-"]
        assert body == ["-", "+"], m.diff()
    assert not [m for m in mutants if m.function == "launch" and m.operator != "last_block_skipped"]
    # the address arithmetic is the address operators' (no sign flips inside a load's arguments)
    assert not [m for m in mutants if m.operator == "sign_changed" and "stride" in m.original]


def test_a_mutant_survives_json(mutants):
    assert all(Mutant.from_json(json.loads(json.dumps(m.to_json()))) == m for m in mutants)


def test_a_run_classes_each_mutant(tmp_path):
    """The demo kernel (tests/mutation_demo.py): its store and masks are killed, its unmasked load
    is bit-identical (equivalent), and the branch under SHIFTED, which no launch sets, is not reached."""
    out = tmp_path / "mutants.json"
    # Under the interpreter, on a GPU machine too: "not reached" needs the lines kernel coverage traces there.
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    runs = module_runs("oracle.mutate", {
        "demo": ["--op-module", "mutation_demo", "--impl", "mutation_demo:impl", "--ops", "double_it",
                 "--dtypes", "float32", "--no-float64", "--workers", "2", "--json", out],
        "no such op": ["--op-module", "mutation_demo", "--impl", "mutation_demo:impl", "--ops", "nope"],
        "no such operator": ["--op-module", "mutation_demo", "--impl", "mutation_demo:impl", "--operators", "typo"],
        "no workers": ["--op-module", "mutation_demo", "--impl", "mutation_demo:impl", "--workers", "0"],
        "bad dtype": ["--op-module", "mutation_demo", "--impl", "mutation_demo:impl", "--dtypes", "int8"],
        "bad time limit": ["--op-module", "mutation_demo", "--impl", "mutation_demo:impl", "--time-limit", "0"],
    }, timeout=600, env=env)
    demo = runs["demo"]
    assert demo.returncode == 1, demo.stdout + demo.stderr  # survivors: the branch nobody reaches
    classes = {(m["operator"], m["line"]): m["class"] for m in json.loads(out.read_text())["mutants"]}
    assert classes[("store_dropped", 28)] == "killed"
    assert classes[("mask_off_by_one", 23)] == "killed"
    assert classes[("mask_dropped", 24)] == "equivalent"
    assert classes[("sign_changed", 27)] == "not reached"
    assert "reached only under `SHIFTED`" in demo.stdout and "SHIFTED=False" in demo.stdout
    assert "mutation score (mutation_demo:impl on double_it" in demo.stdout
    for name, needle in (("no such op", "unknown op(s) nope"), ("no such operator", "unknown operator(s) typo"),
                         ("no workers", "--workers must be at least 1"), ("bad dtype", "--dtypes takes some of"),
                         ("bad time limit", "--time-limit must be a positive number")):
        assert runs[name].returncode == 2 and needle in runs[name].stderr, (name, runs[name].stderr)


def test_each_class_from_its_evidence(mutants):
    """killed, not reached, not run, equivalent and undetected, each from what the runs gave."""
    from oracle.mutate import score
    from oracle.mutate.runner import Outcome

    m = next(x for x in mutants if x.operator == "store_dropped")
    baseline = {0: {"digest": "a"}, 1: {"digest": "b"}}
    labels = ["case 0", "case 1"]

    def judged(reached, outcome):
        return score.judged(m, reached, outcome, baseline, labels, ["BLOCK=8"]).verdict

    assert judged([], None) == score.NOT_REACHED
    assert judged([0, 1], None) == score.NOT_RUN
    assert judged([0, 1], Outcome("fail", 1, "FAIL Y", checks=["verdict"])) == score.KILLED
    assert judged([0, 1], Outcome("pass", digests={0: "a", 1: "b"})) == score.EQUIVALENT
    assert judged([0, 1], Outcome("pass", digests={0: "a", 1: "changed"})) == score.UNDETECTED
    results = [score.Judged(m, v, 1, None, "") for v in (score.KILLED, score.UNDETECTED, score.EQUIVALENT, score.NOT_RUN)]
    assert score.score(results) == 0.5  # equivalent and not run stay out of it
