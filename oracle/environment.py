"""What a run ran on (for reports, baselines and benchmarks), and atomic JSON writes.

``platform_key`` names the kind of machine a baseline belongs to: results under Triton's CPU
interpreter and on a given GPU model differ legitimately, so the gate only compares like with like.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import torch


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def shadowed_hub_kernels() -> str | None:
    """Why transformers cannot load its activations here, or None. transformers imports Hugging
    Face's hub-kernels library by its import name, ``kernels``, whenever that distribution is installed
    in the version window it supports (5.25 and later require it); where ``import kernels`` finds
    another package first (this repository's kernels/ when run from its checkout), that import fails
    with an ImportError far from the cause."""
    if _version("kernels") is None:
        return None
    from importlib.util import find_spec

    from transformers.utils.import_utils import is_kernels_available

    spec = find_spec("kernels")
    theirs = Path(metadata.distribution("kernels").locate_file("kernels/__init__.py")).resolve()
    if spec is None or spec.origin is None or Path(spec.origin).resolve() == theirs or not is_kernels_available():
        return None
    return (f"`import kernels` finds {Path(spec.origin).parent}, not Hugging Face's hub-kernels library "
            f"(kernels {_version('kernels')}, installed, and imported by that name by transformers "
            f"{_version('transformers')} when its activations load), so transformers will fail to import here. "
            "In this repository's checkout: pip install -e '.[test]' (transformers below 5.25) and "
            "pip uninstall kernels; elsewhere, run from a directory where `kernels` is not another package.")


def git_repository(folder: Path) -> tuple[str, str] | None:
    """The git repository holding ``folder``: its root and its commit (``-dirty`` with uncommitted
    changes to tracked files), or None. The root is for comparing repositories on this machine;
    ``repository`` is what a document records."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True, timeout=10)

    try:
        root, head, dirty = git("rev-parse", "--show-toplevel"), git("rev-parse", "--short=12", "HEAD"), \
            git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    if root.returncode or head.returncode:
        return None
    return root.stdout.strip(), head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def repository(path: Path, found: tuple[str, str] | None = None) -> dict | None:
    """The git repository holding ``path`` (a module's file or folder) as a document records it: its
    ``name`` (the root directory's name), ``path`` (of ``path`` inside it, POSIX) and ``commit``; never
    an absolute path, which says nothing on another machine and names the user's home. None outside
    a repository. ``found``: git_repository's answer, where the caller has it already."""
    path = Path(path).resolve()
    found = found or git_repository(path if path.is_dir() else path.parent)
    if found is None:
        return None
    root = Path(found[0]).resolve()
    inside = path.relative_to(root).as_posix() if path.is_relative_to(root) else None  # None: reached by a link
    return {"name": root.name, "path": inside, "commit": found[1]}


def git_commit() -> str | None:
    """The harness checkout's commit (see git_repository), or None outside a repository."""
    found = git_repository(Path(__file__).resolve().parent)
    return found[1] if found else None


def harness() -> dict:
    """The harness that made a document: its distribution's ``version`` (None when it runs from a
    checkout that is not installed) and, run from a checkout, its repository (see ``repository``);
    installed as a wheel it has no commit, and the version is what identifies it."""
    found = repository(Path(__file__).resolve().parent)
    return {"version": _version("kernel-oracle"), "name": None, "path": None, "commit": None, **(found or {})}


def platform_key() -> str:
    """'cpu-interpreter', or 'cuda-' + the GPU's name (e.g. 'cuda-NVIDIA-H200')."""
    from oracle.engine.devices import native_gpu

    if not native_gpu():
        return "cpu-interpreter"
    return "cuda-" + torch.cuda.get_device_name().replace(" ", "-")


def host_maths(device=None) -> dict:
    """What HF's results depend on beyond the platform: the vector kernels torch and numpy pick on
    this CPU (or the GPU's maths), fingerprinted by their answers.

    Note [Host maths]
        torch's CPU kernels are compiled for several instruction sets and pick one at start-up
        (ATEN_CPU_CAPABILITY forces one); numpy (the Triton interpreter's arithmetic) dispatches its
        own. Their exp, erf, tanh and reductions round differently from one to another, so HF's
        bits, and every metric measured against HF (bit-identity, error ratio), move between hosts
        of one platform while an implementation's own error does not. ``digest`` hashes the bits
        of those functions on a fixed probe, so two runs share it exactly when HF's maths rounds
        alike; the gate judges HF-relative metrics only between runs that do (report/gate.py)."""
    import hashlib

    import numpy as np

    from oracle.engine.devices import default_device, native_gpu

    device = device or (default_device() if native_gpu() else torch.device("cpu"))
    probe = torch.linspace(-9, 9, 4099, dtype=torch.float64, device=device)
    rows = torch.sin(torch.arange(3 * 4099, dtype=torch.float64, device=device)).reshape(3, 4099)
    digest = hashlib.sha256()
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x, r = probe.to(dtype), rows.to(dtype)
        strided = torch.stack([x, x], 1)[:, 0]
        for y in (torch.exp(x), torch.erf(x), torch.tanh(x), torch.sigmoid(x), torch.rsqrt(x.abs() + 1),
                  torch.log(x.abs() + 1), torch.sin(x), torch.nn.functional.gelu(x),
                  torch.nn.functional.gelu(x, approximate="tanh"), torch.nn.functional.silu(x),
                  torch.nn.functional.gelu(strided), torch.nn.functional.silu(strided), r.float().pow(2).mean(-1),
                  torch.softmax(r.float(), -1), r.sum(-1)):
            digest.update(y.detach().to("cpu", torch.float64).numpy().tobytes())
    digest.update(np.exp(np.linspace(-9, 9, 4099, dtype=np.float32)).tobytes())
    simd = _numpy_simd()
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "numpy_simd": simd,
            "cpu": _cpu_model(), "digest": digest.hexdigest()[:16]}


def _numpy_simd() -> list[str]:
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    except ImportError:  # numpy < 2
        from numpy.core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    return [name for name in __cpu_dispatch__ if __cpu_features__.get(name)]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment() -> dict:
    # Where the Triton kernels of the implementation the run loaded ran (interpreter or GPU, bf16 casts);
    # nothing is imported for the sake of a label.
    from oracle import interpreter
    from oracle.engine.devices import native_gpu
    from oracle.engine import noise_rule

    summary = interpreter.loaded_runtime() or {}
    return {
        "platform": platform_key(),
        "device": summary.get("device") or (torch.cuda.get_device_name() if native_gpu() else "cpu"),
        "backend": summary.get("backend"),
        "bf16_casts": summary.get("bf16_casts"),
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "transformers": _version("transformers"),
        "liger_kernel": _version("liger-kernel"),
        "cuda": torch.version.cuda,
        "host": platform.node(),
        "host_maths": host_maths(),
        "noise_model": noise_rule(),  # the verdicts were judged by it (ORACLE_NOISE_MODEL)
        "commit": git_commit(),  # the same as harness's, for readers of the documents made before it
        "harness": harness(),
    }


def separate_compile_caches() -> str:
    """Point Inductor's on-disk cache at a directory of this CPU capability, unless one is chosen.

    torch 2.13's FX graph cache does not key its entries by the vector ISA a kernel was compiled
    for: after a run under one ``ATEN_CPU_CAPABILITY`` (say AVX-512), a run under another (AVX2)
    loads the first run's kernels and computes garbage (tests/declared_project's compiled
    fused_add_rms_norm: gradients of 1e23 and more). Runs of several capabilities on one host, as
    the suite is checked, each get a cache of their own. Returns the directory."""
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen:
        return chosen
    capability = os.environ.get("ATEN_CPU_CAPABILITY") or torch.backends.cpu.get_cpu_capability()
    user = os.environ.get("USER") or str(os.getuid())
    directory = str(Path(tempfile.gettempdir()) / f"torchinductor_{user}_{capability.lower()}")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = directory  # read when Inductor first compiles; workers inherit it
    return directory


def share_cores(workers: int) -> int:
    """Give this process its share of the host's cores when ``workers`` processes run at once
    (pytest-xdist's workers, the report's): torch's CPU thread pool defaults to every core, so 16
    workers on 16 cores ran 256 threads, and the CPU-bound tests (derived noise, report sweeps in
    subprocesses) took minutes on the GPU machine. Sets torch's pool and ``OMP_NUM_THREADS`` (for
    the processes this one starts) unless the user chose it; returns the thread count."""
    chosen = os.environ.get("OMP_NUM_THREADS")
    threads = int(chosen) if chosen and chosen.isdigit() and int(chosen) > 0 else \
        max(1, (os.cpu_count() or 1) // max(1, workers))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    return threads


def write_json_atomic(path: Path, data: dict) -> None:
    """JSON written atomically (see write_text_atomic)."""
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True, default=_plain) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Write to a temporary file beside ``path``, then rename: an interrupted run never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide the file from everyone else
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _plain(value):
    if isinstance(value, float | int | str | bool) or value is None:
        return value
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, tuple | set):
        return list(value)
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")
