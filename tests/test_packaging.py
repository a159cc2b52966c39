"""The harness as a tool for other repositories. The wheel installs ``oracle`` alone, never a
top-level ``kernels`` (the import name of Hugging Face's hub-kernels library). From a directory that
is not this checkout, in a fresh virtual environment, a kernel author runs the generic suite, the
report and the gate on an implementation of their own, and the check is shown both ways (a broken
one fails). Hugging Face's ``kernels`` installed beside it keeps its name, transformers keeps seeing
it, and ``--impl kernels`` never tests it. The pytest plugin, installed in every session of the
environment, stays inert in other projects."""

from __future__ import annotations

import configparser
import importlib.metadata
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from oracle.declare import implementations as impls
from tests.conftest import once_per_session

ROOT = Path(__file__).parent.parent
# The fresh venv pins torch==2.13.0, which resolves to a CPU build only on the CPU machines, and the
# GPU machine reaches no package index: these tests run in the CPU suite (CI).
needs_pypi = pytest.mark.skipif(torch.cuda.is_available(), reason="builds and installs from PyPI: CPU CI runs it")

AUTHOR_MODULE = '''
"""A kernel author's RMSNorm in plain torch, Hugging Face's maths (LlamaRMSNorm, GemmaRMSNorm); the
contract's other ops declared lacking. ``eps_outside`` has a classic bug: eps added to the root."""
from types import SimpleNamespace

import torch

from oracle.declare.implementations import OPS

LACKING = {op: "not written yet" for op in OPS if op != "rms_norm"}


def rms_norm(X, W, eps, gemma=False, eps_outside=False):
    h = X.to(torch.float64 if X.dtype == torch.float64 else torch.float32)
    mean_square = h.pow(2).mean(-1, keepdim=True)
    h = h / (mean_square.sqrt() + eps) if eps_outside else h * torch.rsqrt(mean_square + eps)
    if gemma:
        return (h * (1.0 + W.to(h.dtype))).to(X.dtype)
    return W * h.to(X.dtype)


ops = SimpleNamespace(rms_norm=rms_norm, LACKING=LACKING)
eps_outside = SimpleNamespace(rms_norm=lambda X, W, eps, gemma=False: rms_norm(X, W, eps, gemma, eps_outside=True),
                              LACKING=LACKING)
'''


def _run(command: list, cwd: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _outside_env(bin_dir: Path | None = None) -> dict:
    """This process's environment less what ties a child to this checkout or this pytest run."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "PYTHON", "HYPOTHESIS_", "VIRTUAL_ENV")) and k != "TRITON_INTERPRET"}
    if bin_dir:
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env | {"CI": "true"}  # the derandomized hypothesis profile


def _build_wheel(folder: Path) -> dict:
    """The wheel of this repository's files as git lists them (tracked, and untracked but not
    ignored), built from a copy so that nothing is written into the checkout."""
    src, dist = folder / "src", folder / "dist"
    listed = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], ROOT)
    assert listed.returncode == 0, listed.stderr
    for name in filter(None, listed.stdout.split("\0")):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    built = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", dist, src], ROOT)
    assert built.returncode == 0, built.stdout + built.stderr
    (path,) = dist.glob("kernel_oracle-*.whl")
    return {"path": str(path)}


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    return Path(once_per_session(tmp_path_factory, "wheel", _build_wheel)["path"])


def _install_fresh_venv(folder: Path, wheel: Path) -> dict:
    venv = folder / "venv"
    made = _run([sys.executable, "-m", "venv", venv], folder)
    assert made.returncode == 0, made.stderr
    # --no-compile: pip would byte-compile every module of torch and the extras (half the install's
    # time); the import below compiles the ones the tests use, once, for every copy of this venv.
    installed = _run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-compile", "torch==2.13.0",
                      f"{wheel}[test,report]"], folder, _outside_env(venv / "bin"), 900)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    used = "import torch, triton, transformers, hypothesis, oracle.report, oracle.suite, oracle.repro, xdist"
    imported = _run([venv / "bin" / "python", "-c", used], folder, _outside_env(venv / "bin"))
    assert imported.returncode == 0, imported.stdout + imported.stderr
    return {"venv": str(venv)}


@pytest.fixture(scope="session")
def fresh_venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv with torch and the wheel (extras test and report), installed once per session
    (minutes on 2 cores) and never changed: each module works in a copy of it (``author``)."""
    made = once_per_session(tmp_path_factory, "fresh-venv", lambda folder: _install_fresh_venv(folder, wheel))
    return Path(made["venv"])


def _copy_venv(venv: Path, copy: Path) -> None:
    """A hard-linked copy of a venv (seconds, not the minutes of an install). What pip installs or
    replaces in the copy gets files of its own, so the original stays as it was; the scripts that
    name the original's path are rewritten into new files."""
    copied = _run(["cp", "-al", venv, copy], venv.parent)
    assert copied.returncode == 0, copied.stderr
    for script in (copy / "bin").iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        text = script.read_bytes()
        if str(venv).encode() in text:
            script.unlink()  # the new file must not be the original's inode
            script.write_bytes(text.replace(str(venv).encode(), str(copy).encode()))
            script.chmod(0o755)


@pytest.fixture(scope="module")
def author(fresh_venv, tmp_path_factory) -> SimpleNamespace:
    """A copy of the fresh venv for this module (its tests install into it) and an author's
    directory holding their implementation (mykernels.py), far from this checkout."""
    root = tmp_path_factory.mktemp("outside")
    venv, home = root / "venv", root / "author"
    _copy_venv(fresh_venv, venv)
    python = venv / "bin" / "python"
    env = _outside_env(venv / "bin")
    home.mkdir()
    (home / "mykernels.py").write_text(AUTHOR_MODULE)
    where = ("import oracle, importlib.util, sys; print(oracle.__file__); print(importlib.util.find_spec('kernels')); "
             "print(sys.prefix)")
    site = _run([python, "-c", where], home, env)
    oracle_file, kernels_spec, prefix = site.stdout.split()
    # the harness comes from this copy of the venv, and the wheel claims no `kernels`
    assert Path(oracle_file).is_relative_to(venv) and Path(prefix) == venv and kernels_spec == "None", \
        site.stdout + site.stderr
    return SimpleNamespace(python=python, pytest=venv / "bin" / "pytest", home=home, env=env,
                           package=Path(oracle_file).parent)


def _suite(author, impl: str, *args: str) -> subprocess.CompletedProcess:
    """Plain ``pytest`` (not ``python -m pytest``, which would put the directory on sys.path itself)."""
    return _run([author.pytest, "-p", "no:cacheprovider", "--pyargs", "oracle.suite", "--impl", impl, *args],
                author.home, author.env)


def _report(author, impl: str, *args: str) -> subprocess.CompletedProcess:
    return _run([author.python, "-m", "oracle.report", "--impl", impl, "--ops", "rms_norm", "--dtypes", "float32",
                 "--workers", "2", *args], author.home, author.env)


@needs_pypi
def test_the_wheel_holds_the_harness_and_its_plugin_and_no_kernels(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    assert {n.split("/")[0] for n in names} == {"oracle", dist_info}, "a top-level name besides oracle"
    packages = {str(p.parent.relative_to(ROOT)) for p in (ROOT / "oracle").rglob("__init__.py")}
    assert packages >= {"oracle", "oracle/ops", "oracle/report", "oracle/suite"}
    missing = sorted(f"{p}/__init__.py" for p in packages if f"{p}/__init__.py" not in names)
    assert not missing, missing
    assert "oracle/suite/test_contract.py" in names and "oracle/pytest_plugin.py" in names
    assert any(n.startswith("oracle/report/templates/") and n.endswith(".j2") for n in names)
    entry_points = configparser.ConfigParser()
    entry_points.read_string(zipfile.ZipFile(wheel).read(f"{dist_info}/entry_points.txt").decode())
    assert dict(entry_points["pytest11"]) == {"oracle.pytest_plugin": "oracle.pytest_plugin"}


@needs_pypi
def test_an_author_runs_the_suite_the_report_and_the_gate_outside_the_checkout(author):
    passed = _suite(author, "mykernels:ops", "-n", "2")
    out = passed.stdout + passed.stderr
    assert passed.returncode == 0 and " passed" in out and "failed" not in out, out
    assert "ops not tested" in out and "rope: mykernels:ops declares it lacks it (not written yet)" in out, out

    broken = _suite(author, "mykernels:eps_outside", "--ops", "rms_norm")
    out = broken.stdout + broken.stderr
    assert broken.returncode == 1 and " failed" in out, out
    assert "rerun: python -m oracle.repro --impl mykernels:eps_outside" in out, out

    baseline = author.home / "ci" / "baseline.json"
    stored = _report(author, "mykernels:ops", "--update-baseline", "--baseline", baseline)
    assert stored.returncode == 0 and baseline.is_file(), stored.stdout + stored.stderr
    # the default outputs land under the working directory, never in the installed package
    assert sorted(p.name for p in (author.home / "reports" / "out").iterdir()) == \
        ["drift-cpu-interpreter.html", "drift-cpu-interpreter.json"]
    assert not list(author.package.rglob("*.json")) and not list(author.package.rglob("*.html"))

    same = _report(author, "mykernels:ops", "--gate", "--baseline", baseline)
    assert same.returncode == 0 and " 0 regressions" in same.stdout, same.stdout + same.stderr
    regressed = _report(author, "mykernels:eps_outside", "--gate", "--baseline", baseline)
    assert regressed.returncode == 1, regressed.stdout + regressed.stderr


@needs_pypi
def test_hugging_faces_kernels_and_this_package_share_an_environment(author, wheel, fresh_venv):
    def python(code: str) -> str:
        proc = _run([author.python, "-c", code], author.home, author.env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout.strip()

    installed = _run([author.python, "-m", "pip", "install", "-q", "kernels==0.17.2"], author.home, author.env)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    hf = "import kernels, importlib.metadata as m; print(kernels.__file__, callable(kernels.get_kernel), m.version('kernels'))"
    where, has_get_kernel, version = python(hf).split()
    assert Path(where).is_relative_to(author.package.parent) and has_get_kernel == "True" and version == "0.17.2"
    # transformers finds it by that name with its version; whether it uses it is its own version window
    seen = python("from transformers.utils import import_utils as u; from packaging.version import Version as V; "
                  "print(u.is_kernels_available(MIN_VERSION='0.17.2', MAX_VERSION='0.17.3'), u.is_kernels_available() == "
                  "(V(u.KERNELS_MIN_VERSION) <= V('0.17.2') < V(u.KERNELS_MAX_VERSION)))")
    assert seen == "True True", seen
    checked = _run([author.python, "-m", "pip", "check"], author.home, author.env)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    assert _suite(author, "mykernels:ops", "--ops", "rms_norm").returncode == 0
    refused = _suite(author, "kernels")
    out = refused.stdout + refused.stderr
    assert refused.returncode == pytest.ExitCode.USAGE_ERROR, out
    assert "--impl kernels: this project's own kernels live in its repository and are not installed with the wheel" \
        in out and "passed" not in out, out

    again = _run([author.python, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", wheel],
                 author.home, author.env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert python(hf).split() == [where, "True", "0.17.2"]
    # all of it happened in this module's copy: the session's venv has no `kernels`, and its harness is intact
    spec_of_kernels = "import importlib.util as u, oracle.suite; print(u.find_spec('kernels'))"
    original = _run([fresh_venv / "bin" / "python", "-c", spec_of_kernels], author.home, author.env)
    assert original.returncode == 0 and original.stdout.strip() == "None", original.stdout + original.stderr


def test_the_builtin_kernels_are_this_checkouts_and_never_another_package(tmp_path, monkeypatch):
    import kernels

    assert impls._kernels() is kernels and Path(kernels.__file__).parent == ROOT / "kernels"
    # an installed harness: site-packages holds someone else's kernels/ and no pyproject.toml
    site = tmp_path / "site-packages"
    for package in ("oracle", "kernels"):
        (site / package).mkdir(parents=True)
        (site / package / "__init__.py").write_text("")
    monkeypatch.setattr(impls, "__file__", str(site / "oracle" / "impls.py"))
    with pytest.raises(impls.ImplementationUnavailable, match="not installed with the wheel"):
        impls._kernels()
    monkeypatch.undo()
    # a checkout behind another `kernels` on sys.path (Hugging Face's, say)
    monkeypatch.delitem(sys.modules, "kernels")
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(impls.ImplementationUnavailable, match="`import kernels` finds .*site-packages/kernels, not"):
        impls._kernels()


@pytest.mark.skipif(not any(e.name == "oracle.pytest_plugin" for e in importlib.metadata.entry_points(group="pytest11")),
                    reason="kernel-oracle is not installed here (a PYTHONPATH run): no plugin outside the checkout")
def test_the_plugin_is_inert_in_another_project(tmp_path):
    (tmp_path / "test_theirs.py").write_text(
        "import sys\n\n"
        "from hypothesis import settings\n\n"
        "def test_untouched():\n"
        "    assert 'torch' not in sys.modules and 'oracle.engine' not in sys.modules\n"
        "    # CI is set: hypothesis's own ci profile, as loaded by hypothesis, not the harness's\n"
        "    assert settings().max_examples == settings.get_profile('default').max_examples\n\n"
        "def test_asks_for_an_implementation(impl):\n"
        "    pass\n\n"
        "import pytest\n\n"
        "@pytest.mark.scale  # their own marker of that name: the inert plugin must not deselect it\n"
        "def test_their_own_scale_mark():\n"
        "    pass\n")
    (tmp_path / "conftest.py").write_text(
        "def pytest_configure(config):\n"
        "    config.addinivalue_line('markers', 'scale: their own marker')\n")

    def pytest_(*args: str) -> str:
        proc = _run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], tmp_path, _outside_env())
        return f"rc={proc.returncode}\n{proc.stdout}{proc.stderr}"

    out = pytest_()
    assert out.startswith("rc=1") and "2 passed, 1 error" in out and "deselected" not in out, out
    assert "fixture 'impl' of kernel-oracle: no implementation asked: pass --impl" in out, out
    for option in ("--ops", "--scale"):
        out = pytest_(option, *(["rms_norm"] if option == "--ops" else []))
        assert out.startswith("rc=4") and f"{option}: no implementation asked" in out, out
    out = pytest_("-p", "no:oracle.pytest_plugin", "--impl", "hf")
    assert out.startswith("rc=4") and "unrecognized arguments: --impl" in out, out


# --- Hugging Face's `kernels` shadowed by another package of that name ------------------------------


def _hub_kernels_metadata(site: Path) -> Path:
    """A distribution named kernels in the version window this transformers supports, without its
    package: what transformers reads (metadata) to decide it may import HF's hub-kernels library."""
    from transformers.utils import import_utils

    version = import_utils.KERNELS_MIN_VERSION
    dist_info = site / f"kernels-{version}.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: kernels\nVersion: {version}\n")
    return site


def test_a_shadowed_hub_kernels_library_stops_the_suite_and_the_report_with_the_reason(tmp_path):
    """HF's kernels installed (as transformers >= 5.25 requires) while the checkout's kernels/ takes the
    name: transformers' own import would fail far from the cause, so both commands stop first, saying why."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(_hub_kernels_metadata(tmp_path))])}
    for command, usage_error in (
            (["-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests/test_devices.py"], 4),
            (["-m", "oracle.report", "--ops", "rms_norm"], 2)):
        proc = subprocess.run([sys.executable, *command], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300)
        out = proc.stdout + proc.stderr
        assert proc.returncode == usage_error, out
        assert f"`import kernels` finds {ROOT / 'kernels'}, not Hugging Face's hub-kernels library" in out, out
        assert "pip install -e '.[test]' (transformers below 5.25) and pip uninstall kernels" in out, out


def test_hub_kernels_found_as_itself_or_absent_is_no_clash(monkeypatch):
    """The shadowed case is the test above, end to end (transformers' own check reads real metadata)."""
    from oracle import environment

    assert environment.shadowed_hub_kernels() is None  # this environment: no distribution named kernels
    ours = ROOT / "kernels" / "__init__.py"
    monkeypatch.setattr(environment, "_version", lambda package: "0.19.1")
    monkeypatch.setattr(importlib.metadata, "distribution",
                        lambda name: SimpleNamespace(locate_file=lambda path: ours))
    assert environment.shadowed_hub_kernels() is None  # what `import kernels` finds is the distribution's own
