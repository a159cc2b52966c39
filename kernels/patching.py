"""Swap the kernels into a Hugging Face transformers model, and back.

``patch_model(model)`` replaces, in place:

- the forward of every RMSNorm module of a known class (Llama, Mistral, Qwen2/3 and their q/k
  norms; Gemma 1/2/3 with the (1 + W) scale) with ``kernels.rms_norm``;
- the ``apply_rotary_pos_emb`` function of the model's modeling module with ``kernels.rope``
  (module-wide: every model of that architecture uses it until the last patched model is
  unpatched). HF passes cos/sin already gathered per token, (batch, seq, head_dim); they become a
  table of batch * seq rows that the kernel indexes with the token's own row;
- the forward of every gated MLP (gate_proj, up_proj, down_proj, act_fn) whose activation a kernel
  module claims through its ``MLP_PATCH`` (see _mlp_patch): SiLU with ``kernels.swiglu``, Gemma's
  GeLU (tanh or erf) with ``kernels.geglu``. A gated MLP that no kernel claims stays as it is and
  is listed in ``report.left_alone``.

It raises ``ValueError`` naming what it cannot patch (an RMSNorm class it does not know, a model
without RMSNorm or without ``apply_rotary_pos_emb``) before changing anything.
``unpatch_model(model)`` restores everything; ``patched(model)`` does both around a block.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import pkgutil
import sys
import types
from dataclasses import dataclass, field

import torch
from torch import nn

from ._library import tracing
from ._mlp_patch import GatedMLPPatch, is_gated_mlp
from .rms_norm import rms_norm
from .rope import rope

# RMSNorm classes by name: (attribute holding eps, Gemma's (1 + W) scale?)
RMS_NORMS = {
    "LlamaRMSNorm": ("variance_epsilon", False), "MistralRMSNorm": ("variance_epsilon", False),
    "Qwen2RMSNorm": ("variance_epsilon", False), "Qwen3RMSNorm": ("variance_epsilon", False),
    "GemmaRMSNorm": ("eps", True), "Gemma2RMSNorm": ("eps", True), "Gemma3RMSNorm": ("eps", True),
}
_ROPE_ORIGINALS: dict[str, object] = {}  # modeling module -> its own apply_rotary_pos_emb
_ROPE_USERS: dict[str, int] = {}  # modeling module -> how many patched models use ours


@dataclass
class PatchReport:
    rms_norms: list[str] = field(default_factory=list)
    rotary_modules: list[str] = field(default_factory=list)
    gated_mlps: dict[str, str] = field(default_factory=dict)  # module -> the op replacing act_fn(gate) * up
    left_alone: list[str] = field(default_factory=list)  # what was deliberately not patched, and why


def _rms_norm_forward(module, hidden_states):
    eps_attr, gemma = RMS_NORMS[type(module).__name__]
    return rms_norm(hidden_states, module.weight, getattr(module, eps_attr), gemma, **module._kernels_rms_options)


@functools.cache
def mlp_patches() -> tuple[GatedMLPPatch, ...]:
    """Every kernel module's ``MLP_PATCH``, in module-name order: each kernel declares the MLPs it replaces."""
    package = sys.modules[__package__]
    names = sorted(info.name for info in pkgutil.iter_modules(package.__path__) if not info.name.startswith("_"))
    modules = (importlib.import_module(f"{__package__}.{name}") for name in names)
    return tuple(module.MLP_PATCH for module in modules if hasattr(module, "MLP_PATCH"))


def _claim(act_fn: nn.Module) -> tuple[GatedMLPPatch, dict] | None:
    """The first kernel that recognises act_fn, with the options it reads from it."""
    for patch in mlp_patches():
        options = patch.options_for(act_fn)
        if options is not None:
            return patch, options
    return None


@functools.lru_cache(maxsize=64)
def _token_rows(rows: int, seq: int, device: torch.device) -> torch.Tensor:
    """Each token's row in the (rows * seq, head_dim) table, one tensor per shape (no allocation per layer)."""
    return torch.arange(rows * seq, device=device).view(rows, seq)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """HF's signature on the kernel: q, k (batch, heads, seq, head_dim) (unsqueeze_dim=1) or
    (batch, seq, heads, head_dim) (unsqueeze_dim=2); cos, sin (batch or 1, seq, head_dim)."""
    if unsqueeze_dim == 2:
        q_rot, k_rot = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin, 1)
        return q_rot.transpose(1, 2), k_rot.transpose(1, 2)
    if unsqueeze_dim != 1:
        raise ValueError(f"unsqueeze_dim must be 1 or 2, got {unsqueeze_dim}")
    rows, seq, head_dim = cos.shape
    if rows == 1:  # one row set for the whole batch: token s takes row s, no position_ids (nor their range check)
        return rope(q, k, cos[0], sin[0])
    # Traced, the table of rows is part of the graph (Dynamo would trace through the cache anyway).
    positions = torch.arange(rows * seq, device=cos.device).view(rows, seq) if tracing() else \
        _token_rows(rows, seq, cos.device)
    return rope(q, k, cos.reshape(rows * seq, head_dim), sin.reshape(rows * seq, head_dim), positions)


def _modeling_module(model: nn.Module) -> tuple[str, types.ModuleType] | None:
    for module in model.modules():
        if type(module).__name__.endswith("Attention"):
            name = type(module).__module__
            candidate = sys.modules.get(name)
            if candidate is not None and hasattr(candidate, "apply_rotary_pos_emb"):
                return name, candidate
    return None


def _plan(model: nn.Module) -> tuple[PatchReport, list[str], dict]:
    """What patch_model would do: the report, what it cannot patch, and each claimed MLP's new forward."""
    report, problems, mlp_forwards = PatchReport(), [], {}
    norms = [(name, m) for name, m in model.named_modules() if type(m).__name__.endswith("RMSNorm")]
    unknown = sorted({type(m).__name__ for _, m in norms if type(m).__name__ not in RMS_NORMS})
    if unknown:
        problems.append(f"RMSNorm: unknown class(es) {', '.join(unknown)} (known: {', '.join(RMS_NORMS)})")
    elif not norms:
        found = sorted({type(m).__name__ for m in model.modules() if "Norm" in type(m).__name__})
        problems.append(f"RMSNorm: no RMSNorm module (norm layers found: {', '.join(found) or 'none'})")
    report.rms_norms = [name for name, _ in norms]
    located = _modeling_module(model)
    if located is None:
        problems.append("rotary embedding: no attention module whose modeling module defines apply_rotary_pos_emb")
    else:
        report.rotary_modules = [located[0]]
    for name, m in model.named_modules():
        if not is_gated_mlp(m):
            continue
        claim = _claim(m.act_fn)
        if claim is None:
            known = ", ".join(patch.name for patch in mlp_patches())
            report.left_alone.append(f"{name}: gated MLP with {type(m.act_fn).__name__}, which no kernel "
                                     f"replaces (MLP kernels: {known})")
        else:
            patch, options = claim
            report.gated_mlps[name] = patch.label(options)
            mlp_forwards[name] = patch.forward(options)
    return report, problems, mlp_forwards


def patch_model(model: nn.Module, *, write_dx_into_dy: bool = False) -> PatchReport:
    """Put the kernels into ``model`` (see the module docstring); returns what was patched.

    ``write_dx_into_dy`` passes the RMSNorm opt-in through: UNSAFE wherever a norm's output meets
    a residual add (Gemma's post-norms), which is exactly what the end-to-end tests prove.
    """
    if getattr(model, "_kernels_patch", None) is not None:
        raise ValueError("this model is already patched; unpatch_model(model) first")
    report, problems, mlp_forwards = _plan(model)
    if problems:
        raise ValueError(f"cannot patch {type(model).__name__}: " + "; ".join(problems))
    modules = dict(model.named_modules())
    for name in report.rms_norms:
        module = modules[name]
        module._kernels_rms_options = {"write_dx_into_dy": write_dx_into_dy}
        module.forward = types.MethodType(_rms_norm_forward, module)
    for name, forward in mlp_forwards.items():
        modules[name].forward = types.MethodType(forward, modules[name])
    for module_name in report.rotary_modules:
        modeling = sys.modules[module_name]
        if _ROPE_USERS.get(module_name, 0) == 0:
            _ROPE_ORIGINALS[module_name] = modeling.apply_rotary_pos_emb
            modeling.apply_rotary_pos_emb = apply_rotary_pos_emb
        _ROPE_USERS[module_name] = _ROPE_USERS.get(module_name, 0) + 1
    model._kernels_patch = report
    return report


def unpatch_model(model: nn.Module) -> None:
    """Undo patch_model: the model runs HF's own code again."""
    report = getattr(model, "_kernels_patch", None)
    if report is None:
        raise ValueError("this model is not patched")
    modules = dict(model.named_modules())
    for name in report.rms_norms + list(report.gated_mlps):
        modules[name].__dict__.pop("forward", None)
        modules[name].__dict__.pop("_kernels_rms_options", None)
    for module_name in report.rotary_modules:
        _ROPE_USERS[module_name] -= 1
        if _ROPE_USERS[module_name] == 0:
            sys.modules[module_name].apply_rotary_pos_emb = _ROPE_ORIGINALS.pop(module_name)
    model._kernels_patch = None


@contextlib.contextmanager
def patched(model: nn.Module, **options):
    """``with kernels.patched(model): ...`` runs the block with the kernels in, then restores HF's code."""
    report = patch_model(model, **options)
    try:
        yield report
    finally:
        unpatch_model(model)
