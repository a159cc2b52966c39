"""The harness's pytest plugin: --impl, the device each xdist worker owns, hypothesis profiles, case counts, crashes.

Installed with the package, it is loaded by every pytest session of the environment (the ``pytest11``
entry point ``oracle.pytest_plugin``; this repository's conftest.py names it too, for a checkout used
without installing). So it stays inert until an implementation is asked for, with ``--impl`` or the
ini option ``oracle_impl`` (this repository's pyproject.toml sets ``kernels``); inert, it imports no
torch, touches no hypothesis profile and changes nothing, and its fixtures fail saying how to ask.
``-p no:oracle.pytest_plugin`` turns it off.

Active:

- ``--impl NAME|module:attr`` picks the implementation the generic tests (oracle/suite/) judge,
  ``--ops a,b`` restricts the ops asked of it, ``--scale`` adds the scale grid (tests marked
  ``scale``: the sizes people train at, one case at a time per GPU; deselected without it).
  Before anything runs, the implementation is loaded and must provide every op asked (oracle/declare/implementations.py, ``select``): an unimportable module, a typo in
  an op name or a missing op fails the session with the reason; ops it declares it lacks are
  skipped and listed at the end.
- Each worker runs on its own GPU when there are several (oracle/engine/devices.py), else the CPU
  interpreter. The device of every worker is logged in the summary.
- Kernel coverage (oracle/kernel_coverage/): each worker's record of the Triton kernels its cases
  ran (under the interpreter, the lines; on a GPU, the constexpr specialisations and autotune
  configs) is merged into one summary per op at the end. ORACLE_KERNEL_COVERAGE=0 turns it off.
- The compile check's notes (a graph break of an op the implementation does not declare in
  COMPILES: oracle/checks/compile.py, Note [Notes]) are gathered from every worker and listed once
  in the summary, not warned case by case.
- Hypothesis profiles: ``ci`` (loaded when CI is set: derandomized, no deadline, bounded examples),
  ``dev`` (the default: example database on), ``thorough`` (opt in: many examples) and ``sample``
  (a short random sample, four times CI's examples: GPU landings, scripts/h200.sh). Choose with
  ``--hypothesis-profile`` or HYPOTHESIS_PROFILE. A conftest.py's own profile of one of these names,
  or one it loaded itself, is kept. ORACLE_MAX_EXAMPLES=N sets the examples per test of the profile
  HYPOTHESIS_PROFILE names: K sessions of N examples under K distinct ``--hypothesis-seed`` values
  draw K*N cases per test, so a profile's long tests can be split across processes (each hypothesis
  test runs its examples in one worker; scripts/h200.sh thorough-sharded).
- A worker killed by a crash (a segfault under the interpreter, an illegal address on the GPU)
  loses only the case it was running: xdist replaces the worker, and the crash report names the
  case and the command that reruns it.
- Failures are reported fast: hypothesis shrinks a failing case for at most ORACLE_SHRINK_SECONDS
  (default 30; hypothesis's own limit is 5 minutes, and a long case under the interpreter takes
  seconds a run), and under ``-x`` the first failure stops the other workers at their next case
  (they skip what is left, saying why) instead of when their current test ends.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.errors import InvalidArgument

# Registered and loaded by an active session only (pytest_configure, before any test module is
# imported): registering "ci" at import would replace, in every session of the environment, the
# profile hypothesis itself loads on CI machines.
_common = {"deadline": None, "print_blob": True,
           "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]}
PROFILES = {
    "ci": {"derandomize": True, "database": None, "max_examples": 10, **_common},
    "dev": {"max_examples": 10, **_common},
    "thorough": {"max_examples": 400, **_common},
    "sample": {"max_examples": 40, **_common},  # a short random sample beyond CI's ten (scripts/h200.sh landing)
}


def _profile(name: str):
    try:
        return settings.get_profile(name)
    except InvalidArgument:
        return None


# What these names hold before any conftest.py runs (hypothesis's own "ci"): a name that a
# conftest.py registers again keeps its profile.
_BEFORE = {name: _profile(name) for name in PROFILES}

# Where each worker notes the case it is running; one folder per session (the controller's pid),
# so that a pytest run inside a test (tests/test_crash.py) cannot overwrite its parent's notes.
INFLIGHT = Path(".oracle") / "inflight" / str(os.getpid())

INACTIVE = "no implementation asked: pass --impl NAME|package.module:attr, or set the ini option oracle_impl"
SHRINK_SECONDS = 30.0  # default of ORACLE_SHRINK_SECONDS


def pytest_addoption(parser):
    group = parser.getgroup("kernel-oracle")
    group.addoption("--impl", default=None,
                    help="implementation under test: kernels, hf, compile, liger, or package.module:attr "
                         "(default: the ini option oracle_impl; with neither, the plugin stays inactive)")
    group.addoption("--ops", default=None,
                    help="comma-separated ops to test (default: every op of the contract)")
    group.addoption("--scale", action="store_true", default=False,
                    help="also run the scale grid (tests marked scale; needs a CUDA GPU, minutes)")
    group.addoption("--op-module", action="append", default=[], metavar="MODULE",
                    help="a module of op declarations (oracle.declare.Op) to test like the built-in ops; repeatable")
    group.addoption("--noise-model", default=None, choices=("declared", "derived"),
                    help="derived (default): the noise model derived from the reference, everywhere; declared: each "
                         "op's hand-written noise model where it has one (ORACLE_NOISE_MODEL)")
    parser.addini("oracle_impl", "kernel-oracle: the implementation under test when --impl is not given", default="")
    parser.addini("oracle_op_modules", "kernel-oracle: modules of op declarations, one per line", type="linelist",
                  default=[])


def _asked(config) -> str | None:
    """The implementation this session tests, or None: the plugin is inactive."""
    return getattr(config, "oracle_impl_name", None)


@pytest.hookimpl(tryfirst=True)  # the profile first: hypothesis's own configure applies --hypothesis-profile over it
def pytest_configure(config):
    """Load the implementation asked and settle the ops asked of it, or fail the session before collection."""
    config.oracle_impl_name = config.getoption("--impl") or config.getini("oracle_impl") or None
    _CONFIG["config"] = config
    name = _asked(config)
    if name is None:
        for option in ("--ops", "--scale", "--op-module", "--noise-model"):
            if config.getoption(option):
                raise pytest.UsageError(f"{option}: {INACTIVE}")
        return
    from oracle.environment import shadowed_hub_kernels

    if (why := shadowed_hub_kernels()) is not None:
        raise pytest.UsageError(why)
    config.addinivalue_line("markers", "scale: the scale grid, the sizes people train at (opt in with --scale)")
    global INFLIGHT
    if hasattr(config, "workerinput"):  # an xdist worker: note into the controller's folder
        INFLIGHT = Path(config.workerinput["oracle_inflight"])
        from oracle.environment import share_cores

        share_cores(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    _load_profile()
    _bound_shrinking()
    if config.getoption("--noise-model"):
        os.environ["ORACLE_NOISE_MODEL"] = config.getoption("--noise-model")  # the workers' too
    if _xdist_controller(config):
        config.oracle_settling = _Settling(config)  # Note [The controller settles beside its workers]
    else:
        _settle(config)


# Note [The controller settles beside its workers]
#     Under pytest-xdist the controller runs no test, but it must refuse a bad --impl, --ops or
#     --op-module before the session (one usage error, exit 4) and know the ops declared lacking
#     for its summary. That needs the implementation loaded: torch, triton and the kernels, about
#     7 s of the GPU machine's 9 s before its workers even started, and the workers load it all
#     again. So the controller loads it in a thread while xdist starts the workers, and waits for
#     it once they are started (pytest_sessionstart below): a usage error still ends the session
#     before any test runs, with the same message and exit status.


def _xdist_controller(config) -> bool:
    return not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses", None)) \
        and getattr(config.option, "dist", "no") != "no"


class _Settling:
    """``_settle(config)`` in a thread; ``wait()`` re-raises what it raised."""

    def __init__(self, config):
        import threading

        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(config,), name="kernel-oracle settle", daemon=True)
        self.thread.start()

    def _run(self, config) -> None:
        try:
            _settle(config)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread by wait()
            self.error = exc

    def wait(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


@pytest.hookimpl(wrapper=True)
def pytest_sessionstart(session):
    result = yield  # xdist's controller has started its workers (its own pytest_sessionstart)
    settling = getattr(session.config, "oracle_settling", None)
    if settling is not None:
        try:
            settling.wait()
        except pytest.UsageError:
            dsession = session.config.pluginmanager.getplugin("dsession")
            manager = getattr(dsession, "nodemanager", None)
            if manager is not None:  # the session ends here, before its finish hooks: stop the workers
                manager.teardown_nodes()
            raise
    return result


def _settle(config) -> None:
    """Load the implementation and the declarations, check the noise model, settle the ops asked."""
    name = _asked(config)
    from oracle import engine
    from oracle.declare.implementations import ImplementationUnavailable, load
    from oracle.declare.registry import SPECS

    if _record_inflight not in engine.INFLIGHT_HOOKS:
        engine.INFLIGHT_HOOKS.append(_record_inflight)
    from oracle.declare.registry import DeclarationError, load_declared
    from oracle.environment import separate_compile_caches

    separate_compile_caches()
    try:
        engine.noise_rule()  # a bad ORACLE_NOISE_MODEL stops the session, not every case one by one
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from exc
    wanted = config.getoption("--ops")
    try:
        load_declared(list(config.getini("oracle_op_modules")) + list(config.getoption("--op-module")))
    except DeclarationError as exc:
        raise pytest.UsageError(str(exc)) from exc
    try:
        impl = load(name)
        config.oracle_ops = impl.select([op.strip() for op in wanted.split(",") if op.strip()] if wanted else None)
    except (ImplementationUnavailable, ValueError) as exc:
        raise pytest.UsageError(f"--impl {name}: {exc}") from exc
    # --ops names what the run is about: the other ops are left out quietly (deselected), while a run
    # of every op lists each one the implementation lacks, with its reason.
    config.oracle_not_tested = {} if wanted else {op: why for op, why in impl.declared_lacking().items()
                                                  if impl.op(op) is None}
    config.oracle_not_asked = [op for op in SPECS if op not in config.oracle_ops] if wanted else []


def _bound_shrinking() -> None:
    """Report a failure within about a minute: shrinking stops after ORACLE_SHRINK_SECONDS."""
    try:
        from hypothesis.internal.conjecture import engine as conjecture
    except ImportError:  # a hypothesis without that module: its own limit holds
        return
    if hasattr(conjecture, "MAX_SHRINKING_SECONDS"):
        conjecture.MAX_SHRINKING_SECONDS = float(os.environ.get("ORACLE_SHRINK_SECONDS", SHRINK_SECONDS))


def _load_profile() -> None:
    """HYPOTHESIS_PROFILE, else ``ci`` on CI, else ``dev``; a profile a conftest.py loaded stays, and
    hypothesis applies ``--hypothesis-profile`` after this."""
    for name, options in PROFILES.items():
        if _profile(name) is _BEFORE[name]:
            settings.register_profile(name, settings.get_profile("default"), **options)
    explicit = os.environ.get("HYPOTHESIS_PROFILE")
    if explicit or _loaded_profile() in (None, "default", "ci"):  # nobody's choice but hypothesis's
        settings.load_profile(explicit or ("ci" if os.environ.get("CI") else "dev"))
    examples = os.environ.get("ORACLE_MAX_EXAMPLES")
    if examples is not None:
        if not examples.isdigit() or int(examples) < 1:
            raise pytest.UsageError(f"ORACLE_MAX_EXAMPLES must be a positive whole number, got {examples!r}")
        name = f"{_loaded_profile()}, {int(examples)} examples"
        settings.register_profile(name, settings.default, max_examples=int(examples))
        settings.load_profile(name)


def _loaded_profile() -> str | None:
    if hasattr(settings, "get_current_profile_name"):
        return settings.get_current_profile_name()
    return getattr(settings, "_current_profile", None)  # hypothesis releases before that method (>= 6.100)


def pytest_collection_modifyitems(config, items):
    """Deselect the scale grid unless --scale asks for it; skip, with the reason, the generic tests
    of ops the run does not ask for. Inert, it leaves another project's ``scale`` marks alone."""
    if _asked(config) is None:
        return
    if not config.getoption("--scale"):
        kept = [item for item in items if item.get_closest_marker("scale") is None]
        if len(kept) < len(items):
            config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker("scale")])
            items[:] = kept
    from oracle.declare.implementations import load

    impl = load(_asked(config))
    unasked = []
    for item in items:
        op = _op_of(item)
        if op is None or op in config.oracle_ops:
            continue
        if config.getoption("--ops"):
            unasked.append(item)
        else:
            why = impl.declared_lacking().get(op) or "not in --ops"
            item.add_marker(pytest.mark.skip(reason=f"{op} not asked of {impl.name}: {why}"))
    if unasked:
        config.hook.pytest_deselected(items=unasked)
        left_out = set(unasked)
        items[:] = [item for item in items if item not in left_out]


def _op_of(item) -> str | None:
    """The op a generic test tests: its function's ``oracle_op``, or a parameter's case's op."""
    op = getattr(getattr(item, "function", None), "oracle_op", None)
    if op is None and hasattr(item, "callspec"):
        case = item.callspec.params.get("case")
        op = getattr(case, "op", None)
    return op


def _require_active(request) -> str:
    name = _asked(request.config)
    if name is None:
        pytest.fail(f"fixture {request.fixturename!r} of kernel-oracle: {INACTIVE}", pytrace=False)
    return name


@pytest.fixture(scope="session")
def device(request):
    _require_active(request)
    from oracle.engine.devices import default_device

    return default_device()


@pytest.fixture(scope="session")
def impl_name(request) -> str:
    return _require_active(request)


@pytest.fixture(scope="session")
def impl(request):
    name = _require_active(request)
    from oracle.declare.implementations import load

    return load(name)  # pytest_configure has loaded it once already


@pytest.fixture(scope="session")
def asked_ops(request) -> list[str]:
    _require_active(request)
    return request.config.oracle_ops


# --- which case is running, so that a crash can name it -----------------------------------------


def _inflight_file(worker: str) -> Path:
    return INFLIGHT / f"{worker}.json"


def _stop_flag() -> Path:
    return INFLIGHT / "stop"


def _record_inflight(case, impl: str | None, check: str | None = None) -> None:
    from oracle import engine

    if case is not None and _stop_flag().exists():  # -x: another worker's test failed
        pytest.skip("stopped: a test failed and -x (--maxfail) ends the session")

    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    path = _inflight_file(worker)
    if case is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    what = case.summary() + (f" [check {check}]" if check else "")
    path.write_text(json.dumps({"case": what, "repro": engine.repro_command(case, impl, check)}))


_failed = 0


def pytest_runtest_logreport(report):
    """Under -x (--maxfail=N), the N-th failure tells every worker to stop at its next case."""
    global _failed
    config = getattr(report, "config", None) or _CONFIG.get("config")
    if config is None or _asked(config) is None or hasattr(config, "workerinput") or not report.failed:
        return
    _failed += 1
    maxfail = config.getoption("maxfail", 0)
    if maxfail and _failed >= maxfail:
        _stop_flag().parent.mkdir(parents=True, exist_ok=True)
        _stop_flag().touch()


_CONFIG: dict = {}


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput["oracle_inflight"] = str(INFLIGHT)


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    path = _inflight_file(report.node.gateway.id)
    if path.exists():
        inflight = json.loads(path.read_text())
        report.longrepr = f"{report.longrepr}\ncrashed in case: {inflight['case']}\nrerun: {inflight['repro']}"
        path.unlink()


# --- cases run per op and dtype, summed over workers ------------------------------------------


_totals: Counter = Counter()
_coverage: Counter = Counter()
_worker_devices: dict[str, str] = {}
_compile_notes: Counter = Counter()  # each distinct note of the compile check -> the runs that noted it
_kernel_coverage: dict = {}  # kernel coverage's records, merged over the workers (summary.merge)


def _notes_of_this_process() -> list[str]:
    """The compile check's notes here (oracle/checks/compile.py, Note [Notes]); none where it never ran."""
    compile_check = sys.modules.get("oracle.checks.compile")
    return [finding.describe() for finding in getattr(compile_check, "NOTES", ())]


def pytest_sessionfinish(session):
    if _asked(session.config) is None:
        return
    from oracle import engine, kernel_coverage
    from oracle.engine.devices import default_device

    counts = {f"{op}|{dtype}": n for (op, dtype), n in engine.CASES_RUN.items()}
    if hasattr(session.config, "workeroutput"):  # an xdist worker: hand the counts to the controller
        session.config.workeroutput["oracle_counts"] = json.dumps(counts)
        session.config.workeroutput["oracle_coverage"] = json.dumps([[list(k), n] for k, n in engine.COVERAGE.items()])
        session.config.workeroutput["oracle_device"] = str(default_device())
        session.config.workeroutput["oracle_compile_notes"] = json.dumps(_notes_of_this_process())
        session.config.workeroutput["oracle_kernel_coverage"] = json.dumps(kernel_coverage.RECORDER.to_json())
    else:
        _totals.update(counts)
        _coverage.update(engine.COVERAGE)
        _compile_notes.update(_notes_of_this_process())
        kernel_coverage.merge(_kernel_coverage, kernel_coverage.RECORDER.to_json())
        shutil.rmtree(INFLIGHT, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    output = getattr(node, "workeroutput", {})
    _totals.update(json.loads(output.get("oracle_counts", "{}")))
    _coverage.update({tuple(key): n for key, n in json.loads(output.get("oracle_coverage", "[]"))})
    if "oracle_device" in output:
        _worker_devices[node.gateway.id] = output["oracle_device"]
    _compile_notes.update(json.loads(output.get("oracle_compile_notes", "[]")))
    if "oracle_kernel_coverage" in output:  # a worker that crashed hands nothing over
        from oracle.kernel_coverage import merge

        merge(_kernel_coverage, json.loads(output["oracle_kernel_coverage"]))


def coverage_lines(coverage: Counter) -> list[str]:
    """Per op: what the session's cases and aliasing checks covered out of what its spec declares
    (variant x dtype, input and gradient layouts, kinds of values, cases past the tiles, and
    check x variant x dtype), naming whatever was missed."""
    from oracle.checks import aliasing
    from oracle.cases import FLOAT_DTYPES
    from oracle.declare.registry import SPECS

    cases = [key[1:] for key in coverage if key[0] == "case"]
    checks = {key[1:] for key in coverage if key[0] == "check"}
    lines = []
    for name, spec in SPECS.items():
        mine = [c for c in cases if c[0] == name]
        if not mine and not any(c[0] == name for c in checks):
            continue
        wanted = {
            "variant x dtype": {(v, d) for v in spec.variants for d in FLOAT_DTYPES},
            "layouts": spec.input_layouts(),
            "gradient layouts": spec.gradient_layouts(),
            "checks x variant x dtype": {(k, v, d) for k in aliasing.applicable(spec) for v in spec.variants
                                         for d in FLOAT_DTYPES},
        }
        seen = {
            "variant x dtype": {(c[1], c[2]) for c in mine},
            "layouts": {c[3] for c in mine},
            "gradient layouts": {c[4] for c in mine},
            "checks x variant x dtype": {(c[3], c[1], c[2]) for c in checks if c[0] == name},
        }
        parts = [f"{label} {len(seen[label] & want)}/{len(want)}" for label, want in wanted.items()]
        long = sum(coverage[("case",) + c] for c in set(mine) if c[-1])
        lines.append(f"coverage {name}: " + ", ".join(parts) + f", values {len({c[5] for c in mine})}, "
                     f"cases past the tiles {long}")
        for label, want in wanted.items():
            missed = sorted(map(str, want - seen[label]))
            if missed and seen[label]:  # a category the session ran at all (a subset run skips the rest)
                lines.append(f"  missed {label}: {', '.join(missed[:8])}{' ...' if len(missed) > 8 else ''}")
    return lines


def pytest_terminal_summary(terminalreporter, config):
    name = _asked(config)
    if name is None:
        return
    write = terminalreporter.write_line
    lacking = getattr(config, "oracle_not_tested", {})
    if lacking:
        terminalreporter.section("kernel-oracle: ops not tested")
        for op, why in lacking.items():
            write(f"{op}: {name} declares it lacks it ({why})")
    if getattr(config, "oracle_not_asked", None):
        write(f"kernel-oracle: {len(config.oracle_not_asked)} other ops left out by --ops "
              f"({', '.join(config.oracle_not_asked)})")
    _write_compile_notes(terminalreporter)
    if _totals:
        _write_cases_run(terminalreporter)
    _write_kernel_coverage(terminalreporter)


def _write_cases_run(terminalreporter) -> None:
    """The cases run per op and dtype, what they covered of each spec, and the workers' devices."""
    from oracle.engine.devices import default_device, worker_index

    write = terminalreporter.write_line
    terminalreporter.section("kernel-oracle: cases run per op and dtype")
    dtypes = sorted({key.split("|")[1] for key in _totals})
    ops = sorted({key.split("|")[0] for key in _totals})
    write(f"{'op':28s}" + "".join(f"{d:>10s}" for d in dtypes) + f"{'total':>10s}")
    for op in ops:
        row = [_totals.get(f"{op}|{d}", 0) for d in dtypes]
        write(f"{op:28s}" + "".join(f"{n:>10d}" for n in row) + f"{sum(row):>10d}")
    write(f"{'all':28s}" + "".join(f"{sum(_totals.get(f'{o}|{d}', 0) for o in ops):>10d}" for d in dtypes)
          + f"{sum(_totals.values()):>10d}")
    for line in coverage_lines(_coverage):
        write(line)
    if _worker_devices:
        write("devices: " + ", ".join(f"{w}={d}" for w, d in sorted(_worker_devices.items(), key=lambda kv: worker_index(kv[0]) or 0)))
    else:
        write(f"device: {default_device()}")


def _write_compile_notes(terminalreporter) -> None:
    """The compile check's notes, each once (Note [Notes]): graph breaks of ops whose implementation
    does not declare COMPILES, which fail only where it does."""
    if not _compile_notes:
        return
    terminalreporter.section("kernel-oracle: compile notes")
    terminalreporter.write_line(f"{len(_compile_notes)} note(s) of the compile check, not failures (an op the "
                                "implementation declares in COMPILES fails on them instead):")
    for text, times in sorted(_compile_notes.items()):
        terminalreporter.write_line(f"{text}" + (f" (noted {times} times)" if times > 1 else ""))


def _write_kernel_coverage(terminalreporter) -> None:
    """Per op, each Triton kernel its cases launched: lines run out of its statements (under the
    interpreter), the constexpr values it launched with, the configs judged, the lines never reached
    and the branch conditions over them (oracle/kernel_coverage/summary.py)."""
    from oracle.kernel_coverage import summary_lines
    from oracle.kernel_coverage.collect import SWITCH, enabled

    if not enabled():
        terminalreporter.write_line(f"kernel-oracle: kernel coverage off ({SWITCH}={os.environ[SWITCH]})")
        return
    lines = summary_lines(_kernel_coverage)
    if lines:
        terminalreporter.section("kernel-oracle: kernel coverage")
        for line in lines:
            terminalreporter.write_line(line)
