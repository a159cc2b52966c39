"""The oracle is bit-for-bit the installed transformers' maths: forward outputs and gradients.

Every test id carries the transformers version it ran against, so a report of "passed" says which
HF it proved. transformers is a dependency: without it this module fails to import, never skips.
"""

from __future__ import annotations

import importlib
import inspect
import re

import pytest
import torch

import transformers
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
from transformers.models.llama import modeling_llama
from transformers.models.llama.configuration_llama import LlamaConfig
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from oracle.declare import reference as R
from oracle.ops import rms_norm as norm_ops, rope as rope_ops, swiglu as swiglu_ops

VERSION = transformers.__version__
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
IDS = [f"transformers-{VERSION}-{str(d).removeprefix('torch.')}" for d in DTYPES]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(-1).view(torch.uint8) if a.numel() else a,
                                                                        b.view(-1).view(torch.uint8) if b.numel() else b)


def _grads(out: torch.Tensor, inputs, upstream: torch.Tensor):
    return torch.autograd.grad(out, inputs, upstream)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("cls, ours", [(modeling_llama.LlamaRMSNorm, norm_ops.llama_rms_norm), (Qwen3RMSNorm, norm_ops.llama_rms_norm),
                                       (GemmaRMSNorm, norm_ops.gemma_rms_norm), (Gemma3RMSNorm, norm_ops.gemma_rms_norm)],
                         ids=lambda v: getattr(v, "__name__", ""))
@pytest.mark.parametrize("weight_fp32", [False, True], ids=["weight-in-dtype", "weight-fp32"])
def test_rms_norms_bit_identical(cls, ours, dtype, weight_fp32, device):
    gen = torch.Generator().manual_seed(0)
    module = cls(96, eps=1e-6).to(device)
    with torch.no_grad():
        module.weight.copy_(torch.randn(96, generator=gen) * 0.1 + (1.0 if ours is norm_ops.llama_rms_norm else 0.0))
    if not weight_fp32:
        module = module.to(dtype)
    x = (torch.randn(3, 5, 96, generator=gen) * 2).to(device=device, dtype=dtype).requires_grad_()
    y_hf = module(x)
    dy = torch.randn(y_hf.shape, generator=gen).to(device=device, dtype=y_hf.dtype)
    dx_hf, dw_hf = _grads(y_hf, (x, module.weight), dy)

    w = module.weight.detach().clone().requires_grad_()
    y = ours(x, w, 1e-6)
    dx, dw = _grads(y, (x, w), dy)
    assert _same_bits(y, y_hf) and _same_bits(dx, dx_hf) and _same_bits(dw, dw_hf)


def _llama_config(head_dim: int, rope_type: str, params: dict, theta: float = 10000.0) -> LlamaConfig:
    """A LlamaConfig for the rotary embedding, in whichever format this transformers expects."""
    common = dict(hidden_size=head_dim * 4, num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
                  max_position_embeddings=256, intermediate_size=64, vocab_size=32)
    rope = {"rope_type": rope_type, **params}
    if "rope_parameters" in inspect.signature(LlamaConfig.__init__).parameters:  # transformers 5
        return LlamaConfig(**common, rope_parameters={"rope_theta": theta, **rope})
    return LlamaConfig(**common, rope_theta=theta, rope_scaling=None if rope_type == "default" else rope)


SCALINGS = {
    "default": {},
    "linear": {"factor": 4.0},
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
}


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("rope_type", list(SCALINGS))
def test_rotary_embedding_and_apply_bit_identical(rope_type, dtype, device):
    head_dim, theta = 80, 500000.0
    rotary = modeling_llama.LlamaRotaryEmbedding(_llama_config(head_dim, rope_type, SCALINGS[rope_type], theta)).to(device)
    gen = torch.Generator().manual_seed(1)
    positions = torch.stack([torch.tensor([0, 1, 2, 0, 1, 5, 6]), torch.tensor([3, 4, 0, 1, 2, 3, 0])]).to(device)
    q = torch.randn(2, 4, 7, head_dim, generator=gen).to(device=device, dtype=dtype).requires_grad_()
    k = torch.randn(2, 2, 7, head_dim, generator=gen).to(device=device, dtype=dtype).requires_grad_()

    cos_hf, sin_hf = rotary(q, positions)
    inv_freq, scaling = rope_ops.rope_inv_freq(head_dim, theta, rope_type, **SCALINGS[rope_type])
    cos, sin = rope_ops.rotary_cos_sin(inv_freq, scaling, positions, dtype)
    assert _same_bits(cos, cos_hf) and _same_bits(sin, sin_hf)
    assert rotary.attention_scaling == scaling
    # The contract's tables: rows of the same computation, indexed by position, then cast.
    cos_table, sin_table = rope_ops.rotary_table(256, head_dim, theta, rope_type, device=device, **SCALINGS[rope_type])
    assert _same_bits(cos_table[positions].to(dtype), cos_hf) and _same_bits(sin_table[positions].to(dtype), sin_hf)

    q_hf, k_hf = modeling_llama.apply_rotary_pos_emb(q, k, cos_hf, sin_hf)
    q_ours, k_ours = rope_ops.rope(q, k, cos_table, sin_table, positions)
    assert _same_bits(q_ours, q_hf) and _same_bits(k_ours, k_hf)
    dq, dk = torch.randn_like(q_hf), torch.randn_like(k_hf)
    grads_hf = torch.autograd.grad((q_hf, k_hf), (q, k), (dq, dk))
    grads = torch.autograd.grad((q_ours, k_ours), (q, k), (dq, dk))
    assert all(_same_bits(a, b) for a, b in zip(grads, grads_hf))


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_llama_mlp_bit_identical(dtype, device):
    config = _llama_config(16, "default", {})
    config.hidden_act = "silu"
    torch.manual_seed(2)
    mlp = modeling_llama.LlamaMLP(config).to(device=device, dtype=dtype)
    x = torch.randn(3, 5, config.hidden_size, device=device).to(dtype).requires_grad_()
    out_hf = mlp(x)
    params = [mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight]
    out = swiglu_ops.llama_mlp(x, *params)
    assert _same_bits(out, out_hf)
    dy = torch.randn_like(out)
    grads_hf = torch.autograd.grad(out_hf, [x, *params], dy)
    grads = torch.autograd.grad(out, [x, *params], dy)
    assert all(_same_bits(a, b) for a, b in zip(grads, grads_hf))


def test_no_hub_kernel_swapped_in():
    """transformers can replace these layers with downloaded "hub kernels" when the hub's ``kernels``
    package is installed. Our own package is also called ``kernels``; transformers must not mistake
    it for the hub's (it checks a version range our 0.1.0 is far below), and the modules we prove
    against must run the forward written in their modeling files."""
    from transformers.utils import import_utils

    assert not import_utils.is_kernels_available()
    for cls in (modeling_llama.LlamaRMSNorm, Qwen3RMSNorm, GemmaRMSNorm, Gemma3RMSNorm, modeling_llama.LlamaMLP,
                modeling_llama.LlamaRotaryEmbedding):
        module = inspect.getmodule(cls)
        assert inspect.getsourcefile(inspect.unwrap(cls.forward)) == inspect.getsourcefile(module), cls
    assert inspect.getsourcefile(modeling_llama.apply_rotary_pos_emb) == inspect.getsourcefile(modeling_llama)


def _resolve(dotted: str):
    """The object a dotted transformers path names (module, then attributes)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def test_each_mirror_names_a_source_the_installed_transformers_has():
    """Every mirror in the registry says which transformers object it copies, and that object exists
    in the installed version (whose bit-identity the tests above prove; the version is in their ids)."""
    assert {"llama_rms_norm", "gemma_rms_norm", "rope_inv_freq", "rotary_cos_sin", "rotate_half",
            "apply_rotary_pos_emb", "swiglu", "llama_mlp"} <= set(R.MIRRORS)
    for name, mirror in R.MIRRORS.items():
        dotted = re.match(r"transformers(\.\w+)+", mirror.source)
        assert dotted, f"{name}: {mirror.source!r} names no transformers object"
        assert _resolve(dotted.group(0)) is not None