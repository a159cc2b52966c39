"""oracle.mutate on a kernel file that defines a helper twice in branches taken at import
(oracle/mutate/runner.py, Note [A definition the module does not use]): a mutant of the definition
the module does not hold is not reached, said so, and runs no case; one of the definition it holds
is judged as before."""

from __future__ import annotations

import importlib.util
import sys
import textwrap

from oracle.mutate import score
from oracle.mutate.mutants import Mutant
from oracle.mutate.runner import live_definitions
from oracle.mutate.session import Session

KERNELS = textwrap.dedent('''\
    import triton
    import triton.language as tl

    if False:  # the other machine's helper
        @triton.jit
        def _twice(x):
            return x * 2.0
    else:
        @triton.jit
        def _twice(x):
            return x + x


    @triton.jit
    def _kernel(X, Y):
        tl.store(Y, _twice(tl.load(X)))


    def host(x):
        return x
''')


def _module(tmp_path):
    path = tmp_path / "two_defs.py"
    path.write_text(KERNELS)
    spec = importlib.util.spec_from_file_location("two_defs_for_mutate", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return path, module


def _mutant(path, function: str, line: int, jit: bool = True) -> Mutant:
    return Mutant(1, "sign_changed", str(path), "two_defs_for_mutate", function, line - 1, line, line, jit,
                  (line, 0), (line, 1), "+", "-")


def test_the_module_holds_the_branch_taken_and_a_mutant_of_the_other_is_not_reached(tmp_path):
    path, module = _module(tmp_path)
    try:
        assert not callable(getattr(module._twice, '__code__', None))  # a kernel object, not a function
        live = live_definitions({str(path)})
        assert live[str(path)]["_twice"] == (9, 11) and live[str(path)]["_kernel"] == (14, 16)
        assert "host" not in live[str(path)]  # host code is not a kernel
        session = Session.__new__(Session)
        session.live = live
        dead, held = _mutant(path, "_twice", 7), _mutant(path, "_twice", 11)
        assert session.shadowed(dead) == (9, 11) and session.shadowed(held) is None
        assert session.shadowed(_mutant(path, "host", 20, jit=False)) is None
        assert session.reached(dead, [0, 1], {}, set(), {}) == []
        judged = score.judged(dead, [], None, {}, [], None, frozenset(), session.shadowed(dead))
        assert judged.verdict == score.NOT_REACHED and "not the one its module uses here: the one at lines 9-11" \
            in judged.why
    finally:
        sys.modules.pop("two_defs_for_mutate", None)
