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


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10, cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode:
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def platform_key() -> str:
    """'cpu-interpreter', or 'cuda-' + the GPU's name (e.g. 'cuda-NVIDIA-H200')."""
    from .devices import native_gpu

    if not native_gpu():
        return "cpu-interpreter"
    return "cuda-" + torch.cuda.get_device_name().replace(" ", "-")


def environment() -> dict:
    # This project's kernels describe their runtime (interpreter or GPU, bf16 casts) when the run
    # loaded them; another implementation's run does not import them for the sake of a label.
    from .devices import native_gpu

    runtime = sys.modules.get("kernels._runtime")
    summary = runtime.runtime_summary() if runtime else {}
    return {
        "platform": platform_key(),
        "device": summary.get("device") or (torch.cuda.get_device_name() if native_gpu() else "cpu"),
        "backend": summary.get("backend"),
        "bf16_casts": runtime.ensure_faithful_bf16() if runtime else None,
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "transformers": _version("transformers"),
        "liger_kernel": _version("liger-kernel"),
        "cuda": torch.version.cuda,
        "host": platform.node(),
        "commit": git_commit(),
    }


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
