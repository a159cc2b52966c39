"""The public API (``oracle/__init__.py``): the names a user imports from ``oracle``, an implementation's
ops called by name (``oracle.load("hf").rms_norm(...)``), and the lazy imports that keep
``import oracle.interpreter`` free of the registry."""

from __future__ import annotations

import importlib
import inspect
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import oracle
from oracle import errors

ROOT = Path(__file__).resolve().parent.parent


def test_the_documented_names_import_from_oracle():
    from oracle import (CaseFailed, Choice, DeclarationError, Dim, ErrorInput, Fixed, Implementation,  # noqa: F401
                        ImplementationUnavailable, Integers, Op, Tensor, implementation, load, load_declarations)

    assert Op is importlib.import_module("oracle.declare.op").Op
    assert load is importlib.import_module("oracle.declare.implementations").load
    assert ErrorInput is importlib.import_module("oracle.declare.spec").ErrorInput


def test_every_exported_name_is_its_home_modules_own_object():
    for name in oracle.__all__:
        home = importlib.import_module(oracle._HOMES[name])
        assert getattr(oracle, name) is getattr(home, name), name
    assert set(oracle.__all__) <= set(dir(oracle))


def test_every_error_class_is_exported():
    classes = {name for name, value in vars(errors).items() if inspect.isclass(value) and issubclass(value, Exception)}
    assert classes, "oracle.errors defines no error class"
    assert classes <= set(oracle.__all__), sorted(classes - set(oracle.__all__))


def test_the_registry_is_read_live():
    """SPECS is the registry's own dict, not a copy taken when oracle was imported."""
    from oracle.declare import registry

    assert oracle.SPECS is registry.SPECS and "rms_norm" in oracle.SPECS


def test_a_name_oracle_does_not_export_is_an_attribute_error_and_submodules_still_import():
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'.*public names are"):
        oracle.no_such_name  # noqa: B018
    with pytest.raises(ImportError, match="cannot import name 'no_such_name'"):
        exec("from oracle import no_such_name", {})
    from oracle import cases  # a submodule: __getattr__ declines, the import system loads it
    assert cases is importlib.import_module("oracle.cases")


def test_each_declare_module_lists_only_names_it_has():
    for module in ("oracle.declare", "oracle.declare.op", "oracle.declare.spec", "oracle.declare.registry",
                   "oracle.declare.implementations", "oracle.declare.reference"):
        loaded = importlib.import_module(module)
        assert loaded.__all__, module
        missing = [name for name in loaded.__all__ if not hasattr(loaded, name)]
        assert not missing, f"{module}.__all__ names {missing}, which it does not have"


# --- an implementation's ops by name -------------------------------------------------------------


def _rms_norm(X, W, eps, gemma=False):
    return X


def _implementation(**given) -> oracle.Implementation:
    return oracle.Implementation("mine", oracle.implementation(rms_norm=_rms_norm, **given))


def test_an_op_called_by_name_is_the_implementations_own():
    X = torch.randn(4, 64, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    W = 1 + 0.1 * torch.randn(64, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(1))
    hf = oracle.load("hf")
    Y = hf.rms_norm(X, W, 1e-6)
    assert torch.equal(Y, oracle.SPECS["rms_norm"].reference(X, W, 1e-6))
    x = X.float()
    llama = W * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)  # LlamaRMSNorm's casts
    assert torch.equal(Y, llama)
    assert hf.rms_norm is hf.op("rms_norm")
    assert _implementation().rms_norm is _rms_norm


def test_dir_lists_the_ops_provided():
    listed = dir(_implementation())
    assert "rms_norm" in listed and "rope" not in listed
    assert {"name", "target", "op", "select"} <= set(listed)  # the fields and methods as before
    assert set(oracle.SPECS) <= set(dir(oracle.load("hf")))


def test_a_lacking_op_says_it_is_lacking_and_why():
    with pytest.raises(AttributeError, match="mine lacks the op 'rope': not provided by this implementation"):
        _implementation().rope  # noqa: B018
    with pytest.raises(AttributeError, match="mine lacks the op 'rope': no tables here"):
        _implementation(LACKING={"rope": "no tables here"}).rope  # noqa: B018
    with pytest.raises(AttributeError, match="compile lacks the op 'swiglu_fg_kernel': a raw kernel has no HF"):
        oracle.load("compile").swiglu_fg_kernel  # noqa: B018
    assert not hasattr(_implementation(), "rope") and hasattr(_implementation(), "rms_norm")


def test_an_unknown_name_names_the_close_ops():
    with pytest.raises(AttributeError, match=r"'rms_nrom' is not an op of the registry: did you mean 'rms_norm'\?"):
        _implementation().rms_nrom  # noqa: B018
    with pytest.raises(AttributeError, match="'zzz' is not an op of the registry: mine provides rms_norm$"):
        _implementation().zzz  # noqa: B018


def test_a_target_attribute_that_is_no_registered_op_points_at_load_declarations():
    """An op of a module of declarations not loaded yet: the target has it, the registry does not."""
    impl = oracle.Implementation("ns", type("Target", (), {"rms_norm": staticmethod(_rms_norm),
                                                           "softmax_not_declared": staticmethod(_rms_norm)})())
    with pytest.raises(AttributeError, match="not an op of the registry.*load_declarations"):
        impl.softmax_not_declared  # noqa: B018


def test_private_names_are_not_looked_up_and_an_implementation_still_pickles():
    impl = _implementation()
    with pytest.raises(AttributeError, match="has no attribute '_secret'"):
        impl._secret  # noqa: B018
    again = pickle.loads(pickle.dumps(impl))
    assert again == impl and again.rms_norm is _rms_norm


# --- cheap imports ---------------------------------------------------------------------------------


def _oracle_modules_after(code: str) -> list[str]:
    """The oracle modules loaded by ``code`` in a fresh interpreter, run from the repository root."""
    script = f"import json, sys\n{code}\nprint(json.dumps(sorted(m for m in sys.modules if m.startswith('oracle'))))"
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_importing_the_interpreter_loads_no_registry():
    loaded = _oracle_modules_after("import oracle.interpreter")
    assert "oracle.declare.registry" not in loaded and "oracle.ops" not in loaded
    assert all(m == "oracle" or m.startswith("oracle.interpreter") for m in loaded), loaded


def test_the_import_check_sees_the_registry_once_a_public_name_loads_it():
    """The check above can fail: reading one public name loads the registry."""
    loaded = _oracle_modules_after("import oracle.interpreter, oracle\noracle.load")
    assert "oracle.declare.registry" in loaded and "oracle.ops" in loaded
