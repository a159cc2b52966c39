"""flash-attn 2.8.3's Triton kernels behind the declarations of ``ops``, loaded at run time from its
source distribution: ``FLASH_ATTN_SOURCE`` names the sdist (``flash_attn-2.8.3.tar.gz``) or a
directory holding its ``flash_attn/`` package.

``flash_attn/__init__.py`` imports the CUDA extension, which a source distribution has not built, so
``flash_attn`` and its subpackages are registered as bare packages (their ``__init__`` never runs)
and only the modules the kernels need are imported: ``flash_attn.layers.rotary`` (the autograd
Function users call, ``apply_rotary_emb``; it needs ``einops``) and ``flash_attn.ops.triton.layer_norm``.
Each kernel is called as flash-attn's own modules call it. The kernels compute in fp32 and promise
no float64: those checks are not asked.

On a CPU (Triton's interpreter) one line of flash-attn's rotary launcher cannot run: it enters
``torch.cuda.device(x.device.index)``, which torch refuses for a CPU tensor. That module alone then
sees a ``torch`` whose ``cuda.device`` is a no-op; the kernel and everything else are flash-attn's.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import tarfile
import tempfile
import types
from pathlib import Path

import torch
from filelock import FileLock

from oracle import ImplementationUnavailable

from . import ops

SOURCE = "FLASH_ATTN_SOURCE"
GET = ("pip download --no-deps --no-binary :all: --no-build-isolation flash-attn==2.8.3 -d .whl, then "
       f"{SOURCE}=.whl/flash_attn-2.8.3.tar.gz")
BARE_PACKAGES = ("flash_attn", "flash_attn.ops", "flash_attn.ops.triton", "flash_attn.layers", "flash_attn.utils")
NEEDED = ("flash_attn/layers/rotary.py", "flash_attn/ops/triton/rotary.py", "flash_attn/ops/triton/layer_norm.py",
          "flash_attn/utils/torch.py", "flash_attn/utils/library.py")


def _package_root() -> Path:
    given = os.environ.get(SOURCE)
    if not given:
        raise ImplementationUnavailable(f"flash-attn's source is not given: {GET}")
    path = Path(given)
    if path.is_dir():
        if not (path / NEEDED[0]).is_file():
            raise ImplementationUnavailable(f"{SOURCE}={given} holds no {NEEDED[0]}")
        return path
    if not tarfile.is_tarfile(path):
        raise ImplementationUnavailable(f"{SOURCE}={given} is neither a directory nor a tarball")
    target = Path(tempfile.gettempdir()) / f"kernel-oracle-{path.stem.removesuffix('.tar')}"
    # Every xdist worker loads this module at once: one extracts, under a lock, into a folder of its
    # own renamed into place, so no worker imports a file another is still writing (on the H200 one
    # imported a truncated layers/rotary.py, and flash_attn.ops.triton.rotary was never imported).
    with FileLock(f"{target}.lock"):
        if not target.is_dir():
            partial = Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=target.parent))
            with tarfile.open(path) as archive:  # only the kernels' pure-Python files
                members = [m for m in archive.getmembers() if m.isfile() and m.name.split("/", 1)[-1] in NEEDED]
                if len(members) != len(NEEDED):
                    raise ImplementationUnavailable(f"{given} lacks some of {', '.join(NEEDED)}")
                for member in members:
                    member.name = member.name.split("/", 1)[1]
                archive.extractall(partial, members=members, filter="data")
            os.replace(partial, target)
    return target


def _import(root: Path, module: str):
    for name in BARE_PACKAGES:
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(root.joinpath(*name.split(".")))]
            sys.modules[name] = package
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImplementationUnavailable(f"cannot import {module} from {root}: {exc}") from exc


class _Forwarding(types.SimpleNamespace):
    """``target``'s attributes, but for those given."""

    def __init__(self, target, **replaced):
        super().__init__(**replaced)
        self._target = target

    def __getattr__(self, name):
        return getattr(self._target, name)


def _without_cuda_device_switch(module) -> None:
    from oracle.engine.devices import native_gpu

    if not native_gpu():
        cuda = _Forwarding(torch.cuda, device=lambda index: contextlib.nullcontext())
        module.torch = _Forwarding(torch, cuda=cuda)


def _load():
    root = _package_root()
    rotary = _import(root, "flash_attn.layers.rotary")
    _without_cuda_device_switch(sys.modules["flash_attn.ops.triton.rotary"])
    found = {"fa_rotary": lambda x, cos, sin, interleaved: rotary.apply_rotary_emb(x, cos, sin, interleaved),
             "fa_rotary_varlen": _varlen(rotary)}
    lacking = {}
    try:
        norms = _import(root, "flash_attn.ops.triton.layer_norm")
    except (ImplementationUnavailable, RuntimeError, AssertionError) as exc:
        # its autotuning configs ask the CUDA device for its warp size while the module imports
        why = f"flash_attn.ops.triton.layer_norm does not import here: {type(exc).__name__}: {exc}"
        lacking = {"fa_add_rms_norm": why, "fa_add_layer_norm": why}
    else:
        found["fa_add_rms_norm"] = lambda x, residual, W, eps: norms.rms_norm_fn(
            x, W, None, residual=residual, eps=eps, prenorm=True)
        found["fa_add_layer_norm"] = lambda x, residual, W, B, eps: norms.layer_norm_fn(
            x, W, B, residual=residual, eps=eps, prenorm=True)
    return found, lacking


def _varlen(rotary):
    def call(x, cos, sin, interleaved):
        lengths = ops.segments(x.shape[0])
        cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=x.device)
        return rotary.apply_rotary_emb(x, cos, sin, interleaved, cu_seqlens=cu_seqlens, max_seqlen=max(lengths))
    return call


def _implementation() -> types.SimpleNamespace:
    from oracle import SPECS

    found, lacking = _load()
    others = {op: "not a flash-attn kernel" for op in SPECS if op not in found and op not in lacking}
    return types.SimpleNamespace(**found, LACKING={**lacking, **others}, NO_FLOAT64=set(found))


impl = _implementation()
