"""The runner cannot pass by accident: an implementation that is not there, misnames an op or lacks
one fails the session before anything runs; gradcheck skips only where an implementation says it
has no float64 path; ops left out are listed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from oracle.declare.implementations import OPS, load
from oracle.declare.registry import SPECS
from oracle.suite import test_contract

ROOT = Path(__file__).parent.parent


def _pytest(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)


CANNOT_ANSWER = {
    "mypkg.typo:ops": ["cannot import 'mypkg.typo': No module named 'mypkg'"],
    "tests.broken_impls:misnamed_rms_norm": ["lacks ", "rms_norm,", "swiglu,", "'rmsnorm' is not 'rms_norm'"],
    "tests.broken_impls:only_swiglu": ["lacks ", "rms_norm,", "rope,", "swiglu_fg_kernel,"],
    "nonsense": ["unknown implementation 'nonsense'"],
}


@pytest.mark.parametrize("impl, workers", [
    ("mypkg.typo:ops", []),
    # under xdist the controller loads the implementation while its workers start (pytest_plugin.py,
    # Note [The controller settles beside its workers]): the session still ends before any test
    ("nonsense", ["-n", "2"]),
])
def test_an_implementation_that_cannot_answer_fails_the_session(impl, workers):
    """End to end, one session per path a refusal takes (pytest_configure, and xdist's controller at
    session start); every refusal's words are the test below, in-process."""
    proc = _pytest("tests/test_ops.py", "--impl", impl, *workers)
    out = proc.stdout + proc.stderr
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, out
    assert f"--impl {impl}: " in out and all(part in out for part in CANNOT_ANSWER[impl]), out
    assert "passed" not in out and "skipped" not in out, out


@pytest.mark.parametrize("impl", CANNOT_ANSWER)
def test_an_implementation_that_cannot_answer_is_a_usage_error_naming_why(impl):
    """What the plugin settles before the session (oracle/pytest_plugin.py, _settle): the usage error
    that the test above sees end the session, here without a session of its own (seconds each)."""
    from types import SimpleNamespace

    from oracle import pytest_plugin

    options = {"--ops": None, "--op-module": []}
    config = SimpleNamespace(oracle_impl_name=impl, getoption=options.__getitem__, getini=lambda name: [])
    with pytest.raises(pytest.UsageError) as refused:
        pytest_plugin._settle(config)
    said = str(refused.value)
    assert said.startswith(f"--impl {impl}: ") and all(part in said for part in CANNOT_ANSWER[impl]), said


def test_an_unknown_noise_model_fails_the_session():
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "tests/test_ops.py",
                           "--ops", "swiglu_fg_kernel", "--co"], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "ORACLE_NOISE_MODEL": "tight"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, out
    assert "ORACLE_NOISE_MODEL must be one of declared, derived, got 'tight'" in out, out


def test_misnamed_ops_are_named_and_missing_ones_can_be_left_out_with_ops():
    misnamed = load("tests.broken_impls:misnamed_rms_norm")
    with pytest.raises(ValueError, match="'rmsnorm' is not 'rms_norm'"):
        misnamed.select()
    assert misnamed.select(["rope"]) == ["rope"]
    with pytest.raises(ValueError, match="lacks rms_norm"):
        misnamed.select(["rope", "rms_norm"])
    with pytest.raises(ValueError, match="unknown op"):
        misnamed.select(["rmsnorm"])


def test_declared_lacks_are_skipped_but_never_asked_for():
    partial = load("tests.broken_impls:declares_what_it_lacks")
    assert partial.select() == ["rope"]
    with pytest.raises(ValueError, match="declares it lacks rms_norm"):
        partial.select(["rms_norm"])
    assert load("kernels").select() == list(OPS) and load("hf").select() == list(OPS)


def test_ops_declared_lacking_are_listed_at_the_end_of_the_session():
    """Under xdist, as CI runs: the controller, which runs no test, settled the ops for its summary."""
    proc = _pytest("tests/test_ops.py", "-k", "float64 and not every_variant", "-n", "2",
                   "--impl", "tests.broken_impls:declares_what_it_lacks")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "ops not tested" in out and "rms_norm: tests.broken_impls:declares_what_it_lacks declares it lacks it " \
                                       "(not written yet)" in out, out
    assert "2 passed" in out, out  # rope's two float64 cases; the others are skipped with the reason


def test_a_backward_raising_a_dtype_type_error_fails_gradcheck(device):
    case = SPECS["rms_norm"].float64_cases[0]
    with pytest.raises(TypeError, match="accumulator dtype mismatch"):
        test_contract.test_float64(case, load("tests.broken_impls:backward_type_error"), device, ["rms_norm"])
    with pytest.raises(pytest.skip.Exception, match="NO_FLOAT64"):
        test_contract.test_float64(case, load("tests.broken_impls:declares_no_float64"), device, ["rms_norm"])
    test_contract.test_float64(case, load("kernels"), device, ["rms_norm"])  # and the check passes where all is well


def test_no_dependency_is_imported_or_skipped():
    """A dependency's absence must fail the run: a skip would hide the proof the oracle matches HF."""
    import re
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dependencies = {re.split(r"[<>=\[ ]", d)[0] for d in project["dependencies"]}
    for path in (ROOT / "tests").glob("*.py"):
        skipped = set(re.findall(r"importorskip\(\s*[\"']([\w.]+)", path.read_text()))
        assert not skipped & dependencies, f"{path.name} skips on missing {sorted(skipped & dependencies)}"


def test_shrinking_is_bounded_so_a_failure_is_reported_within_a_minute(monkeypatch):
    """The plugin caps hypothesis's shrinking (5 minutes of its own) at ORACLE_SHRINK_SECONDS."""
    from hypothesis.internal.conjecture import engine as conjecture

    from oracle import pytest_plugin

    monkeypatch.setattr(conjecture, "MAX_SHRINKING_SECONDS", 300)
    monkeypatch.setenv("ORACLE_SHRINK_SECONDS", "12")
    pytest_plugin._bound_shrinking()
    assert conjecture.MAX_SHRINKING_SECONDS == 12
    monkeypatch.delenv("ORACLE_SHRINK_SECONDS")
    pytest_plugin._bound_shrinking()
    assert conjecture.MAX_SHRINKING_SECONDS == pytest_plugin.SHRINK_SECONDS


def test_max_examples_of_the_chosen_profile_can_be_set_for_a_split_run(monkeypatch):
    """ORACLE_MAX_EXAMPLES replaces the examples per test of the profile HYPOTHESIS_PROFILE names,
    and keeps its other settings; anything but a positive whole number is a usage error."""
    from hypothesis import settings

    from oracle import pytest_plugin

    name_before = pytest_plugin._loaded_profile()
    try:
        monkeypatch.setenv("HYPOTHESIS_PROFILE", "thorough")
        monkeypatch.setenv("ORACLE_MAX_EXAMPLES", "100")
        pytest_plugin._load_profile()
        assert settings.default.max_examples == 100 and settings.default.deadline is None
        assert pytest_plugin._loaded_profile() == "thorough, 100 examples"
        monkeypatch.delenv("ORACLE_MAX_EXAMPLES")
        pytest_plugin._load_profile()
        assert settings.default.max_examples == 400
        for bad in ("0", "-3", "ten", "2.5"):
            monkeypatch.setenv("ORACLE_MAX_EXAMPLES", bad)
            with pytest.raises(pytest.UsageError, match="ORACLE_MAX_EXAMPLES must be a positive whole number"):
                pytest_plugin._load_profile()
    finally:
        settings.load_profile(name_before)


def test_each_cpu_capability_gets_its_own_compile_cache(monkeypatch):
    """Inductor's cache would serve one capability's kernels to another (oracle/environment.py)."""
    from oracle.environment import separate_compile_caches

    seen = {}
    for capability in ("avx2", "default", "avx2"):
        monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)
        seen.setdefault(capability, set()).add(separate_compile_caches())
    assert len(seen["avx2"]) == 1 and seen["avx2"] != seen["default"]
    assert all(path.endswith(capability) for capability, paths in seen.items() for path in paths)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere/chosen")
    assert separate_compile_caches() == "/somewhere/chosen"
