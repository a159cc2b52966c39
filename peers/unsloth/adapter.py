"""Unsloth's Triton kernels behind the contract (docs/design.md §2): ``--impl unsloth`` and
``--impl unsloth-inplace``.

The kernels are those of the released ``unsloth`` package, pinned to ``PINNED``; each is called as
Unsloth's own model code calls it:

- ``rms_norm``: ``fast_rms_layernorm(norm, X, gemma=...)`` on a stand-in for the norm module (its
  ``weight`` and ``variance_epsilon``), Llama's and Gemma's paths, with the function's defaults
  (``reuse_grad=False``, ``save_output=False``: the safe call, as for a model's final norm);
- ``rope``: ``fast_rope_embedding(Q, K, cos, sin, position_ids)``, with the tables cast to Q's dtype
  first, as ``LlamaAttention_fast_forward`` does; packed positions go in as ``rope_embedding_indices``;
- the raw SwiGLU and GeGLU kernels, which LoRA_MLP calls on (batch, seq, hd) activations forward and
  on their (batch * seq, hd) views backward: 2-D cases gain a leading batch of one forward.

``unsloth-inplace`` is the other RoPE Unsloth exports, ``inplace_rope_embedding``, which rotates Q and
K in place through a (batch, seq, heads, head_dim) view and tells autograd nothing about it. Both
declare Q and K in ``CLOBBERS``: Unsloth's fast RoPE also writes in place where the layout allows.

Importing ``unsloth`` itself pulls in its training stack (PEFT, TRL, bitsandbytes, xformers, ...)
and patches transformers. The adapter needs only four kernel modules, so it registers ``unsloth``,
``unsloth.kernels`` and ``unsloth_zoo`` as bare packages (their ``__init__`` never runs) and imports
the kernel modules, whose own imports (``unsloth.device_type``, ``unsloth_zoo.utils``, ...) need no
more than torch, triton, transformers, filelock and packaging. Install both wheels without
dependencies: ``pip install --no-deps unsloth==2026.10.9 unsloth_zoo==2026.10.9``. In this process a
later ``import unsloth`` gets the bare package. Unsloth's ``device_type`` refuses to import without a
GPU, so on CPU the implementation is unavailable, with that reason.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import sys
import types
import warnings
from pathlib import Path
from types import SimpleNamespace

from oracle.errors import ImplementationUnavailable

import torch

PINNED = "2026.10.9"
INSTALL = f"pip install --no-deps unsloth=={PINNED} unsloth_zoo=={PINNED}"
KERNEL_MODULES = {"rms": "rms_layernorm", "rope": "rope_embedding", "swiglu": "swiglu", "geglu": "geglu"}
# Packages whose __init__ must not run: they import Unsloth's training stack and patch transformers.
BARE_PACKAGES = ("unsloth", "unsloth.kernels", "unsloth_zoo", "unsloth_zoo.temporary_patches")

NO_AUTOGRAD = ("Unsloth has no autograd op for it: its LoRA_MLP calls the raw SwiGLU and GeGLU kernels inside its "
               "own Function")
NO_KERNEL = "Unsloth has no kernel for it"


class Unavailable(ImplementationUnavailable):
    """Unsloth's kernels cannot be loaded here; the message says why and what to do."""


def _installed_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise Unavailable(f"{distribution} is not installed; install the tested release with: {INSTALL}") from None


def _register_bare(name: str) -> None:
    """Put package ``name`` in sys.modules with its search path but without running its __init__."""
    if name in sys.modules:
        return
    parent, _, child = name.rpartition(".")
    if parent:
        path = [str(Path(sys.modules[parent].__path__[0]) / child)]
    else:
        spec = importlib.util.find_spec(name)  # finds the package without executing it
        path = list(spec.submodule_search_locations)
    package = types.ModuleType(name)
    package.__path__ = path
    package.__package__ = name
    sys.modules[name] = package


@functools.cache
def kernel_modules() -> SimpleNamespace:
    """Unsloth's four kernel modules, imported without Unsloth's package initialisation."""
    if not torch.cuda.is_available():
        raise Unavailable("Unsloth's kernels need a CUDA GPU: unsloth.device_type refuses to import without one "
                          "('Unsloth cannot find any torch accelerator? You need a GPU.')")
    for distribution in ("unsloth", "unsloth_zoo"):
        found = _installed_version(distribution)
        if found != PINNED:
            warnings.warn(f"{distribution} {found} is installed; the README's findings are for {PINNED}", stacklevel=2)
    for name in BARE_PACKAGES:
        _register_bare(name)
    try:
        return SimpleNamespace(**{key: importlib.import_module(f"unsloth.kernels.{module}")
                                  for key, module in KERNEL_MODULES.items()})
    except Exception as exc:  # an import-time dependency this environment lacks
        raise Unavailable(f"Unsloth's kernel modules do not import here: {type(exc).__name__}: {exc}") from exc


# --- the contract's callables ---------------------------------------------------------------------


def rms_norm(X, W, eps, gemma=False):
    norm = SimpleNamespace(weight=W, variance_epsilon=eps)  # what fast_rms_layernorm reads of the module
    return kernel_modules().rms.fast_rms_layernorm(norm, X, gemma=gemma)


def rope(Q, K, cos, sin, position_ids=None):
    cos, sin = cos.to(Q.dtype), sin.to(Q.dtype)
    return kernel_modules().rope.fast_rope_embedding(Q, K, cos, sin, position_ids)


def inplace_rope(Q, K, cos, sin, position_ids=None):
    """inplace_rope_embedding indexes the tables by position and broadcasts a row over the heads of a
    (batch, seq, heads, head_dim) tensor: it is handed that view of Q and K."""
    if position_ids is None:
        position_ids = torch.arange(Q.shape[2], device=Q.device).expand(Q.shape[0], -1)
    cos, sin = cos.to(Q.dtype), sin.to(Q.dtype)
    Q_out, K_out = kernel_modules().rope.inplace_rope_embedding(Q.transpose(1, 2), K.transpose(1, 2), cos, sin,
                                                               position_ids)
    return Q_out.transpose(1, 2), K_out.transpose(1, 2)


def _forward_kernel(module: str, name: str):
    """A raw forward LoRA_MLP calls on (batch, seq, hd): 2-D cases get a leading batch of one."""
    def call(e, g):
        kernel = getattr(getattr(kernel_modules(), module), name)
        if e.dim() == 3:
            return kernel(e, g)
        batched = (e.unsqueeze(0), g.unsqueeze(0)) if e.dim() == 2 else (e.reshape(1, 1, -1), g.reshape(1, 1, -1))
        return kernel(*batched).view(e.shape)

    call.__name__ = name
    return call


def _backward_kernel(module: str, name: str):
    """A raw backward LoRA_MLP calls on (batch * seq, hd) views of DW, e and g; it writes h, df and de
    into them and returns them."""
    def call(DW, e, g):
        kernel = getattr(getattr(kernel_modules(), module), name)
        if e.dim() == 2:
            return kernel(DW, e, g)
        flat = [t.view(-1, t.shape[-1]) for t in (DW, e, g)]
        return tuple(out.view(t.shape) for out, t in zip(kernel(*flat), (DW, e, g)))

    call.__name__ = name
    return call


_RAW = {
    "swiglu_fg_kernel": _forward_kernel("swiglu", "swiglu_fg_kernel"),
    "swiglu_DWf_DW_dfg_kernel": _backward_kernel("swiglu", "swiglu_DWf_DW_dfg_kernel"),
    "geglu_approx_forward_kernel": _forward_kernel("geglu", "geglu_approx_forward_kernel"),
    "geglu_exact_forward_kernel": _forward_kernel("geglu", "geglu_exact_forward_kernel"),
    "geglu_approx_backward_kernel": _backward_kernel("geglu", "geglu_approx_backward_kernel"),
    "geglu_exact_backward_kernel": _backward_kernel("geglu", "geglu_exact_backward_kernel"),
}
_RAW_CLOBBERS = {name: {"DW", "e", "g"} for name in _RAW if name.endswith(("backward_kernel", "dfg_kernel"))}


def implementation() -> SimpleNamespace:
    """``--impl unsloth``: every op Unsloth has a kernel for."""
    kernel_modules()  # unavailable here: say why now, not at the first call
    from oracle.declare.registry import SPECS

    provided = {"rms_norm": rms_norm, "rope": rope, **_RAW}
    # Every other op of the registry is lacking: the gated MLPs' autograd ops, whose HF maths the
    # raw kernels compute (a raw GeGLU kernel's is geglu with its approximation bound), because
    # Unsloth only calls those inside LoRA_MLP; any op added later because it has no kernel for it.
    raw_maths = {getattr(spec.reference, "func", spec.reference) for name, spec in SPECS.items() if name in _RAW}
    return SimpleNamespace(
        **provided,
        CLOBBERS={"rope": {"Q", "K"}, **_RAW_CLOBBERS},
        LACKING={name: NO_AUTOGRAD if spec.reference in raw_maths else NO_KERNEL
                 for name, spec in SPECS.items() if name not in provided},
        NO_FLOAT64=set(provided),  # Unsloth's kernels compute in fp32 whatever the input: no float64 promise
    )


def inplace_implementation() -> SimpleNamespace:
    """``--impl unsloth-inplace``: Unsloth's in-place RoPE; every other op is --impl unsloth's."""
    kernel_modules()
    from oracle.declare.registry import SPECS

    return SimpleNamespace(
        rope=inplace_rope, CLOBBERS={"rope": {"Q", "K"}}, NO_FLOAT64={"rope"},
        LACKING={name: "the same kernel as --impl unsloth" for name in SPECS if name != "rope"},
    )
