"""The Unsloth adapter (peers/unsloth/adapter.py): unavailable on CPU with the reason, its loader
skips Unsloth's package initialisation, and it hands the kernels the arguments and shapes Unsloth's
own code does (checked on CPU with stand-ins that have Unsloth's signatures and HF's maths). The
adapter against the real kernels runs on the GPU: ``pytest --impl unsloth`` (README)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from peers.unsloth import adapter as unsloth
from oracle.engine.devices import case_budget
from oracle.engine import run_case
from oracle.declare.implementations import Implementation, ImplementationUnavailable, load
from oracle.declare.registry import SPECS

ROOT = Path(__file__).parent.parent
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the adapter loads (or names what is missing)")


@cpu_only
def test_on_cpu_it_is_unavailable_with_the_reason():
    for name in ("unsloth", "unsloth-inplace"):
        with pytest.raises(ImplementationUnavailable, match="Unsloth's kernels need a CUDA GPU"):
            load(name)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "tests/test_ops.py",
                           "--impl", "unsloth"], capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    assert "--impl unsloth: Unsloth's kernels need a CUDA GPU" in proc.stderr


def test_bare_packages_never_run_the_package_init(tmp_path, monkeypatch):
    """Unsloth's __init__ imports its training stack: the loader must reach a kernel module (and the
    sibling modules it imports relatively) without running any package's __init__."""
    package = tmp_path / "fake_unsloth"
    (package / "kernels").mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('the package init ran')\n")
    (package / "kernels" / "__init__.py").write_text("raise RuntimeError('the kernels init ran')\n")
    (package / "device_type.py").write_text("DEVICE = 'gpu'\n")
    (package / "kernels" / "norm.py").write_text("from ..device_type import DEVICE\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("fake_unsloth", "fake_unsloth.kernels", "fake_unsloth.device_type", "fake_unsloth.kernels.norm"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    unsloth._register_bare("fake_unsloth")
    unsloth._register_bare("fake_unsloth.kernels")
    from fake_unsloth.kernels import norm

    assert norm.DEVICE == "gpu"  # both inits raise: had either run, the import would have failed


# --- stand-ins with Unsloth's signatures and shape requirements, computing HF's maths -------------


def _hf(op: str):
    return SPECS[op].contract_callable()


def _raw_forward(op: str):
    def kernel(e, g):
        batch, seq_len, hd = e.shape  # as Unsloth's: LoRA_MLP hands (batch, seq, hd)
        return _hf(op)(e.reshape(-1, hd), g.reshape(-1, hd)).view(batch, seq_len, hd)
    return kernel


def _raw_backward(op: str):
    def kernel(DW, e, g):
        _, _ = e.shape  # as Unsloth's: (batch * seq, hd) views, two dimensions
        return _hf(op)(DW, e, g)  # HF's raw backward writes h, df, de into DW, e, g, as Unsloth's does
    return kernel


def _stand_ins() -> SimpleNamespace:
    def fast_rms_layernorm(layernorm, X, gemma=False, save_output=False, reuse_grad=False):
        return _hf("rms_norm")(X, layernorm.weight, layernorm.variance_epsilon, gemma)

    def fast_rope_embedding(Q, K, cos, sin, rope_embedding_indices=None):
        assert cos.dtype == Q.dtype, "Unsloth's attention casts the tables to Q's dtype"
        return _hf("rope")(Q.clone(), K.clone(), cos, sin, rope_embedding_indices)

    raw = {op: (_raw_backward if op.endswith(("backward_kernel", "dfg_kernel")) else _raw_forward)(op)
           for op in SPECS if op.endswith("_kernel")}
    return SimpleNamespace(rms=SimpleNamespace(fast_rms_layernorm=fast_rms_layernorm),
                           rope=SimpleNamespace(fast_rope_embedding=fast_rope_embedding),
                           swiglu=SimpleNamespace(**{k: v for k, v in raw.items() if k.startswith("swiglu")}),
                           geglu=SimpleNamespace(**{k: v for k, v in raw.items() if k.startswith("geglu")}))


def test_the_adapter_calls_each_kernel_as_unsloth_does(monkeypatch, device):
    monkeypatch.setattr(unsloth, "kernel_modules", _stand_ins)
    impl = Implementation("unsloth (stand-ins)", unsloth.implementation())
    assert set(impl.select()) == set(SPECS) - set(impl.declared_lacking())
    assert all("LoRA_MLP" in why for why in impl.declared_lacking().values())
    for op in impl.select():
        for case in SPECS[op].stratified("float32", case_budget())[:2]:
            result = run_case(SPECS[op], case, impl, device)
            assert result.passed, result.explain()


def test_an_op_added_to_the_registry_is_declared_lacking(monkeypatch):
    """The adapter enumerates the registry: a new op (here a declared one) is lacking, not missing."""
    import torch.nn.functional as F

    from oracle.declare import Dim, Op, Tensor

    monkeypatch.setattr(unsloth, "kernel_modules", _stand_ins)
    softmax = Op("softmax_for_the_adapter_test", reference=lambda X: F.softmax(X, -1), inputs={"X": Tensor("n")},
                 dims={"n": Dim(1, 8)})
    monkeypatch.setitem(SPECS, softmax.name, softmax.spec)
    impl = Implementation("unsloth (stand-ins)", unsloth.implementation())
    assert impl.declared_lacking()[softmax.name] == unsloth.NO_KERNEL
    assert softmax.name not in impl.select()
