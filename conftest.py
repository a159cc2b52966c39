"""pytest wiring: --impl, the device each xdist worker owns, hypothesis profiles, case counts, crashes.

- ``--impl NAME|module:attr`` picks the implementation the generic tests (tests/test_ops.py) judge.
- Each worker runs on its own GPU when there are several (oracle/devices.py), else the CPU
  interpreter. The device of every worker is logged in the summary.
- Hypothesis profiles: ``ci`` (loaded when CI is set: derandomized, no deadline, bounded examples),
  ``dev`` (the default: example database on) and ``thorough`` (opt in: many examples). Choose with
  ``--hypothesis-profile`` or HYPOTHESIS_PROFILE.
- A worker killed by a crash (a segfault under the interpreter, an illegal address on the GPU)
  loses only the case it was running: xdist replaces the worker, and the crash report names the
  case and the command that reruns it.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from oracle import engine
from oracle.devices import default_device, worker_index

_common = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
settings.register_profile("ci", derandomize=True, database=None, max_examples=10, **_common)
settings.register_profile("dev", max_examples=10, **_common)
settings.register_profile("thorough", max_examples=400, **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))

INFLIGHT = Path(".oracle") / "inflight"


def pytest_addoption(parser):
    group = parser.getgroup("kernel-oracle")
    group.addoption("--impl", default="kernels",
                    help="implementation under test: kernels (default), hf, compile, liger, or package.module:attr")


@pytest.fixture(scope="session")
def device():
    return default_device()


@pytest.fixture(scope="session")
def impl_name(request) -> str:
    return request.config.getoption("--impl")


# --- which case is running, so that a crash can name it -----------------------------------------


def _inflight_file(worker: str) -> Path:
    return INFLIGHT / f"{worker}.json"


def _record_inflight(case, impl: str | None) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    path = _inflight_file(worker)
    if case is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"case": case.summary(), "repro": engine.repro_command(case, impl)}))


engine.INFLIGHT_HOOKS.append(_record_inflight)


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    path = _inflight_file(report.node.gateway.id)
    if path.exists():
        inflight = json.loads(path.read_text())
        report.longrepr = f"{report.longrepr}\ncrashed in case: {inflight['case']}\nrerun: {inflight['repro']}"
        path.unlink()


# --- cases run per op and dtype, summed over workers ------------------------------------------


_totals: Counter = Counter()
_worker_devices: dict[str, str] = {}


def pytest_sessionfinish(session):
    counts = {f"{op}|{dtype}": n for (op, dtype), n in engine.CASES_RUN.items()}
    if hasattr(session.config, "workeroutput"):  # an xdist worker: hand the counts to the controller
        session.config.workeroutput["oracle_counts"] = json.dumps(counts)
        session.config.workeroutput["oracle_device"] = str(default_device())
    else:
        _totals.update(counts)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    output = getattr(node, "workeroutput", {})
    _totals.update(json.loads(output.get("oracle_counts", "{}")))
    if "oracle_device" in output:
        _worker_devices[node.gateway.id] = output["oracle_device"]


def pytest_terminal_summary(terminalreporter):
    if not _totals:
        return
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
    if _worker_devices:
        write("devices: " + ", ".join(f"{w}={d}" for w, d in sorted(_worker_devices.items(), key=lambda kv: worker_index(kv[0]) or 0)))
    else:
        write(f"device: {default_device()}")
