"""Mutation testing (python -m oracle.mutate): the operators make the bug classes they name, a run
classes each mutant, and bad usage is refused with a reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
        g = (x * r).to(COMPUTE).to(tl.float32)
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
    # an operand that loses its call keeps its parentheses: (x * r).to(tl.float32), not x * r.to(tl.float32)
    [inner] = [m for m in mutants if m.operator == "upcast_removed" and m.original == "(x * r).to(COMPUTE)"]
    assert "    g = (x * r).to(tl.float32)\n" in inner.source()
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


def _demo_line(text: str) -> int:
    """The line of tests/mutation_demo.py that holds ``text``."""
    lines = (ROOT / "tests" / "mutation_demo.py").read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if text in line)


def _demo_env() -> dict:
    # Under the interpreter, on a GPU machine too: "not reached" needs the lines kernel coverage traces there.
    return {**os.environ, "TRITON_INTERPRET": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _usage_error(capsys, *argv) -> str:
    """python -m oracle.mutate's main in this process on arguments it refuses before any mutant runs
    (the built-in ops' registry: a declared op would stay registered here); its exit status is 2,
    and what it printed is returned."""
    from oracle.mutate.__main__ import main

    capsys.readouterr()
    assert main([str(a) for a in argv]) == 2
    return capsys.readouterr().err


def test_a_run_classes_each_mutant(tmp_path, capsys):
    """The demo kernel (tests/mutation_demo.py): its store and masks are killed, its unmasked load
    is bit-identical (equivalent), and the branch under SHIFTED, which no launch sets, is not reached.
    Arguments it refuses exit 2 with the reason."""
    out = tmp_path / "mutants.json"
    env = _demo_env()
    runs = module_runs("oracle.mutate", {
        "demo": ["--op-module", "mutation_demo", "--impl", "mutation_demo:impl", "--ops", "double_it",
                 "--dtypes", "float32", "--no-float64", "--workers", "2", "--json", out],
    }, timeout=600, env=env)
    demo = runs["demo"]
    assert demo.returncode == 1, demo.stdout + demo.stderr  # survivors: the branch nobody reaches
    classes = {(m["operator"], m["line"]): m["class"] for m in json.loads(out.read_text())["mutants"]}
    assert classes[("store_dropped", _demo_line("tl.store(Y + row"))] == "killed"
    assert classes[("mask_off_by_one", _demo_line("mask = offsets < cols"))] == "killed"
    assert classes[("mask_dropped", _demo_line("x = tl.load(X + row"))] == "equivalent"
    assert classes[("sign_changed", _demo_line("y = y + 1"))] == "not reached"
    assert "reached only under `SHIFTED`" in demo.stdout and "SHIFTED=False" in demo.stdout
    assert "mutation score (mutation_demo:impl on double_it" in demo.stdout
    for argv, needle in ((("--ops", "nope"), "unknown op(s) nope"), (("--operators", "typo"), "unknown operator(s) typo"),
                         (("--workers", "0"), "--workers must be at least 1"),
                         (("--dtypes", "int8"), "--dtypes takes some of"),
                         (("--time-limit", "0"), "--time-limit must be a positive number"),
                         (("--lines", "rms_norm.py:"), "--lines takes N or FILE:N")):
        assert needle in _usage_error(capsys, *argv), argv


def test_lines_narrow_the_mutants_to_the_lines_named():
    """--lines: N matches that line of any kernel file, FILE:N only a file whose path ends in FILE's
    whole components."""
    from oracle.mutate.__main__ import lines_wanted
    from oracle.mutate.session import on_lines

    m = Mutant(number=1, operator="term_dropped", file="/repo/kernels/rms_norm.py", module="kernels.rms_norm",
               function="_inv_rms", function_line=128, line=131, statement=131, jit=True, start=(131, 14),
               end=(131, 26), original="var + eps_lo", replacement="var")
    assert on_lines(m, None)
    for text, wanted in (("131", True), ("130", False), ("rms_norm.py:131", True), ("kernels/rms_norm.py:131", True),
                         ("norm.py:131", False), ("other/rms_norm.py:131", False), ("geglu.py:131, 131", True)):
        assert on_lines(m, lines_wanted(text)) == wanted, text
    assert lines_wanted(None) is None
    for bad in ("rms_norm.py:", "0", "x", "131,"):
        with pytest.raises(ValueError, match="--lines takes N or FILE:N"):
            lines_wanted(bad)


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
    # a survivor of the suite, then judged by the gate (--baseline): a regression kills it, a pass keeps it
    survivor = score.judged(m, [0, 1], Outcome("pass", digests={0: "a", 1: "changed"}), baseline, labels, [])
    flagged = score.gated(survivor, Outcome("fail", 3, "Y: precision lost", checks=["gate"]), {3: "op float32"})
    assert flagged.verdict == score.KILLED and score.killed_by(flagged) == "gate"
    assert flagged.why == "killed by the gate on op float32: Y: precision lost"
    assert score.gated(survivor, Outcome("pass"), {}).verdict == score.UNDETECTED
    assert score.gated(survivor, None, {}) is survivor  # --time-limit ran out before the gate judged it
    results = [score.Judged(m, v, 1, None, "") for v in (score.KILLED, score.UNDETECTED, score.EQUIVALENT, score.NOT_RUN)]
    assert score.score(results) == 0.5  # equivalent and not run stay out of it


def test_an_undetected_mutant_says_how_far_from_the_truth_it_is_beside_the_kernel(mutants):
    """Over the cases where its bits differ, the worst ratio of its error to the unmutated kernel's:
    at most 1 is a rewrite as precise as the kernel, above 1 a loss the cases missed."""
    from oracle.mutate import score
    from oracle.mutate.runner import Outcome

    m = next(x for x in mutants if x.operator == "upcast_removed")
    baseline = {0: {"digest": "a", "errors": {"dX": [4.0, 1.0]}}, 1: {"digest": "b", "errors": {"dX": [2.0, 0.5]}}}
    labels = ["case 0", "case 1"]

    def survivor(errors: dict):
        return score.judged(m, [0, 1], Outcome("pass", digests={0: "c", 1: "d"}, errors=errors), baseline, labels, [])

    as_precise = survivor({0: {"dX": [3.0, 1.0]}, 1: {"dX": [2.0, 0.25]}})
    assert as_precise.verdict == score.UNDETECTED  # the class stays: only the line says more
    assert "no farther from the float64 truth than the unmutated kernel on any of them" in as_precise.why
    assert as_precise.precision["max"]["ratio"] == 1.0 and as_precise.precision["mean"]["ratio"] == 1.0
    worse = survivor({0: {"dX": [4.0, 1.0]}, 1: {"dX": [6.0, 0.75]}})
    assert "its largest error against the float64 truth is 3x the unmutated kernel's (dX, 6 against 2, on case 1), " \
        "its mean error at most 1.5x, farther on 1 of those 2 case(s)" in worse.why, worse.why
    assert worse.to_json()["precision"]["max"]["item"] == 1
    baseline[0]["errors"] = {"dX": [0.0, 0.0]}  # the kernel exact there, the mutant not
    assert "where the unmutated kernel is exact" in survivor({0: {"dX": [1.0, 0.5]}, 1: {"dX": [2.0, 0.5]}}).why
    assert score.judged(m, [0, 1], Outcome("pass", digests={0: "c", 1: "d"}), baseline, labels, []).precision is None


def test_the_gate_judges_the_survivors(tmp_path, capsys):
    """--baseline: the cubic's mutant without its float64 upcast is HF's own float32 evaluation, so
    every case of the suite passes it; against a baseline of the kernel the gate sees its typical
    error tripled and kills it, and without one it survives. A baseline the gate cannot use is
    refused (exit 2) before any mutant runs."""
    env = _demo_env()
    demo = ["--op-module", "mutation_demo", "--impl", "mutation_demo:impl"]
    baseline = tmp_path / "baseline.json"
    made = module_runs("oracle.report", {"baseline": [
        *demo, "--ops", "cubic_it", "--workers", "2", "--json", tmp_path / "report.json",
        "--html", tmp_path / "report.html", "--update-baseline", "--baseline", baseline]}, timeout=600, env=env)
    assert made["baseline"].returncode == 0, made["baseline"].stdout + made["baseline"].stderr
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    one_mutant = [*demo, "--ops", "cubic_it", "--operators", "upcast_removed", "--dtypes", "float32",
                  "--no-float64", "--workers", "2"]
    runs = module_runs("oracle.mutate", {
        "gated": [*one_mutant, "--baseline", baseline, "--json", tmp_path / "gated.json"],
        "ungated": [*one_mutant, "--json", tmp_path / "ungated.json"],
        # the baseline is the interpreter's: judged on that platform, where only its op is wrong
        "another op's": [*demo, "--ops", "double_it", "--baseline", baseline],
    }, timeout=600, env=env)
    gated, ungated = runs["gated"], runs["ungated"]
    assert gated.returncode == 0, gated.stdout + gated.stderr  # its one mutant killed
    assert ungated.returncode == 1, ungated.stdout + ungated.stderr
    [killed] = json.loads((tmp_path / "gated.json").read_text())["mutants"]
    assert killed["line"] == _demo_line(".to(tl.float64)") and killed["class"] == "killed"
    assert killed["killed_by"] == "gate" and "precision lost" in killed["gate"]["finding"], killed
    assert killed["why"].startswith("killed by the gate on cubic_it"), killed["why"]
    gate = json.loads((tmp_path / "gated.json").read_text())["gate"]
    assert (gate["judged"], gate["killed"], gate["baseline"]) == (1, 1, str(baseline)), gate
    assert "1 by gate" in gated.stdout and "judged 1 survivor(s) of the suite, killed 1" in gated.stdout
    ungated_json = json.loads((tmp_path / "ungated.json").read_text())
    assert "gate" not in ungated_json and [m["class"] for m in ungated_json["mutants"]] == ["undetected"]
    for baseline_path, needle in ((tmp_path / "nowhere.json", "no baseline at"), (garbage, "is not readable JSON")):
        err = _usage_error(capsys, "--ops", "rms_norm", "--baseline", baseline_path)
        assert "oracle.mutate: --baseline: " in err and needle in err, (baseline_path, err)
        assert "baseline of" not in err, (baseline_path, err)  # refused before the suite's baseline ran
    other = runs["another op's"]
    assert other.returncode == 2 and "oracle.mutate: --baseline: " in other.stderr and \
        "holds no cell of double_it" in other.stderr and "baseline of" not in other.stderr, other.stderr


# --- kills on the built-in kernels: each mutant fails a case of the CI profile the unmutated kernel passes

def _kernel_mutants(op: str, picks: list[tuple[str, str, str]], wanted: dict,
                    first: dict[str, dict] | None = None) -> tuple[dict, dict]:
    """The kernels' mutants ``picks`` (function, text of the line, operator) of ``op``'s kernel file,
    each run by oracle.mutate's runner on the CI profile's items ``wanted`` keeps (_wanted), and the
    unmutated kernels on them: (item label -> the unmutated status, pick -> (status, checks)). A
    mutant stops at its first failing item, so ``first`` (operator -> a filter like ``wanted``) runs
    the items that should kill that mutant before the others; the unmutated kernels run them all. In a
    process of its own, as oracle.mutate runs: a process that imported the kernels (as pytest's may
    have) keeps their first registration of each custom op, and a mutant's would not replace it.
    Under the interpreter on every machine: these kills are the CPU profile's cases' (on a GPU the
    budget, hence the cases and the kernels' paths, differ)."""
    code = ("import json, sys; from test_mutate import _judged_here; "
            "print(json.dumps(_judged_here(*json.loads(sys.argv[1]))))")
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "",  # the CPU's cases, on its device
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code, json.dumps([op, picks, wanted, first or {}])],
                          capture_output=True, text=True, env=env, timeout=900,
                          cwd=ROOT / "tests")  # its conftest, not the root one
    assert proc.returncode == 0, proc.stderr[-3000:]
    statuses, outcomes = json.loads(proc.stdout.strip().splitlines()[-1])
    return statuses, {tuple(pick): tuple(outcome) for pick, outcome in outcomes}


def _on_the_cpu_profile() -> None:
    """The built-in kernels' kills are the CPU profile's: on a GPU machine its cases differ, and that
    machine's Triton (3.6 on the H200) cannot interpret RMSNorm's looped forward (its tl.range over
    program ids raises there), so the CPU's cases cannot run there either."""
    from oracle.engine.devices import native_gpu

    if native_gpu():
        pytest.skip("the CPU profile's kills: run on a CPU machine (its Triton interprets the looped forward)")


def _wanted(case, wanted: dict) -> bool:
    """Whether a case has ``wanted``'s dtype, variant and kind of values (where given) and one of its
    ``dims`` (each a dict of some of the case's dims; any dims when there are none)."""
    return all(getattr(case, field) == wanted[field] for field in ("dtype", "variant", "values") if field in wanted) \
        and any(all(case.dims.get(k) == v for k, v in dims.items()) for dims in wanted.get("dims", [{}]))


def _judged_here(op: str, picks: list, wanted: dict, first: dict) -> tuple[dict, list]:
    import tempfile

    from oracle import interpreter

    interpreter.choose_backend()
    from oracle.declare.registry import SPECS
    from oracle.engine.devices import case_budget, native_gpu
    from oracle.mutate.cases import items_of
    from oracle.mutate.runner import run_all

    file = ROOT / "kernels" / f"{op}.py"
    lines = file.read_text().splitlines()
    items = [item for item in items_of(SPECS[op], case_budget(), float64=False) if _wanted(item.case, wanted)]
    assert items, "no item of the CI profile is the one wanted"
    everything = list(range(len(items)))
    found, every_mutant = {}, mutants_of(str(file), f"kernels.{op}")  # once: seconds for a file of kernels
    for function, text, operator, *original in picks:  # original: the edited segment, where a line has several
        [found[(function, text, operator, *original)]] = [
            m for m in every_mutant if m.function == function
            and m.operator == operator and text in lines[m.line - 1] and m.original in (original or [m.original])]
    scratch = tempfile.mkdtemp(prefix="oracle-mutate-test-")

    def order(operator: str) -> list[int]:  # the items that should kill it first; sorted keeps the rest's order
        if operator not in first:
            return everything
        return sorted(everything, key=lambda i: not _wanted(items[i].case, first[operator]))

    # The unmutated run first: the longest job, beside the mutants rather than after them.
    jobs = [("unmutated", lambda: ("baseline", {"items": items, "chosen": everything, "impl": "kernels",
                                                "op_modules": []}), 900)]
    jobs += [(pick, (lambda m=m, order=order(pick[2]): ("mutant", {"mutant": m, "items": items, "order": order,
                                                                     "impl": "kernels", "op_modules": [],
                                                                     "scratch": scratch})), 900)
             for pick, m in found.items()]
    answers = run_all(jobs, 2, native_gpu())
    unmutated = answers.pop("unmutated")
    assert isinstance(unmutated, dict), unmutated
    return ({items[i].label(): a["status"] for i, a in unmutated["items"].items()},
            [(list(pick), (outcome.status, outcome.checks)) for pick, outcome in answers.items()])


def test_reads_past_a_tensor_fail_the_verdict():
    """Note [NaN margins]: a load past a tensor's end reads NaN. RMSNorm's backward reading each
    row's inv_var unmasked (the lanes past the last row, multiplied by a masked 0) and its row-dot
    kernel (its chunks, `_row_chunk`) reading one column past each row (into a sum of 65535 terms) passed every verdict with
    a finite sentinel; they fail now, on a pinned case and on the widest one, which the unmutated
    kernels pass."""
    _on_the_cpu_profile()
    statuses, outcomes = _kernel_mutants("rms_norm", [
        ("_rms_norm_backward_kernel", "tl.load(inv_var_ptr + rows, mask=row_mask", "mask_dropped"),
        ("_row_chunk", "mask = cols < n_cols", "mask_off_by_one"),
    ], {"dtype": "float32", "variant": "llama", "dims": [{"lead": [2, 33], "cols": 1}, {"cols": 65535}]},
        first={"mask_dropped": {"dims": [{"cols": 1}]}, "mask_off_by_one": {"dims": [{"cols": 65535}]}})
    assert set(statuses.values()) == {"pass"} and len(statuses) == 2, statuses
    for pick, (status, checks) in outcomes.items():
        assert status == "fail" and "verdict" in checks, (pick, status, checks)


# The forward kernel of the widest rows, as the launch table picks it, and a line of it computing 1/rms
WIDE_FORWARD_EPS = {"looped": ("_rms_norm_forward_looped_kernel", "eps_hi, eps_lo, COMPUTE)"),
                    "overlapped": ("_rms_norm_forward_overlapped_kernel", "COMPUTE)  # the program's first row")}


def test_every_variant_runs_the_widest_rows():
    """The widest stratified case turns its variant and its kind of values with the dtype, so
    Gemma's split backward runs too (its row-dot kernel's 1 + W, in `_row_chunk`, was never reached), and the wide
    forward (looped or overlapped, as the table picks) meets tiny values, where eps dominates: 1 - W, and the wide
    forward's eps dropped, fail the widest cases, which the unmutated kernels pass."""
    _on_the_cpu_profile()
    from kernels._rms_norm_configs import lookup
    from oracle.cases import FLOAT_DTYPES
    from oracle.declare.registry import SPECS
    from oracle.engine.devices import case_budget

    spec = SPECS["rms_norm"]
    widest = [c for d in FLOAT_DTYPES for c in spec.stratified(d, case_budget()) if c.dims.get("cols") == 65535]
    assert {c.variant for c in widest} == set(spec.variants), [c.summary() for c in widest]
    assert {c.values for c in widest} == {"normal", "large", "tiny"}, [c.summary() for c in widest]
    statuses, outcomes = _kernel_mutants("rms_norm", [
        ("_row_chunk", "w = 1.0 + w", "sign_changed"),
        (*WIDE_FORWARD_EPS[lookup("forward", 65535, 1, 4).path], "eps_moved", "eps_hi"),
    ], {"dims": [{"cols": 65535}]}, first={"sign_changed": {"variant": "gemma"}, "eps_moved": {"values": "tiny"}})
    assert set(statuses.values()) == {"pass"} and len(statuses) == 3, statuses
    for pick, (status, checks) in outcomes.items():
        assert status == "fail" and "verdict" in checks, (pick, status, checks)


def test_nan_margins_still_show_writes():
    """Note [NaN margins]: a float margin reads as NaN, yet a write there is still seen, be it the
    NaN arithmetic makes or another buffer's margin value carried over (its payload differs), also
    through a change of width; an integer tensor keeps its byte sentinel."""
    import torch

    from oracle.checks.memory import GuardedTensor

    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        x, y = (GuardedTensor((2, 3), dtype, "cpu", label=name) for name in ("X", "Y"))
        assert x.buffer[:x.start].isnan().all() and not x.corruption()
        y.buffer[0] = float("nan")
        y.buffer[1] = x.buffer[0]
        y.buffer[2] = x.buffer[0].double() if dtype != torch.float64 else x.buffer[0].float()
        assert [hit["position"] for hit in y.corruption()] == [-y.start, 1 - y.start, 2 - y.start], dtype
    ints = GuardedTensor((2, 3), torch.int32, "cpu", label="positions")
    assert (ints.buffer[:ints.start].view(torch.uint8) == 0xA5).all()
