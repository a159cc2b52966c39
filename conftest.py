# The harness's pytest plugin (oracle/pytest_plugin.py). An install registers it through its pytest11
# entry point under this same name, and pytest then skips this line; a checkout used without
# installing (PYTHONPATH=$PWD, as on the GPU machine) gets it from here.
pytest_plugins = ["oracle.pytest_plugin"]

# Note [Longest first]
#     Under pytest -n auto the suite's wall time is its tail: xdist hands each worker a run of
#     consecutive tests at the start, so a long test collected late starts late, and the session
#     waits for it. So this suite's own tests are handed out one at a time (--maxschedchunk 1, a
#     work queue) and the longest go first, measured on the H200 (16 workers) and the 2-core CPU
#     machine. A test missing from the list only starts later; the order changes no result.
#     Consumers of one shared fixture (a fresh venv, a small report) sit next to each other, so
#     that the worker that builds it runs them rather than others waiting on its lock. Where the
#     consumers are many short tests (the docs' pages, all reading one probe), only one goes early:
#     all of them early left seven workers waiting 27 s each on the probe's lock on the H200. Tests
#     that start processes of their own (reports, child sessions, mutants) are not all put first:
#     sixteen of them at once oversubscribe the H200's 16 cores (with five more of them first, the
#     suite took 207 s where it had taken 176 s, each of them up to three times as long).
LONGEST_FIRST = (
    "tests/test_declared_project.py::test_compile_of_every_reference_passes",  # CPU: Inductor, in a fresh venv
    "tests/test_packaging.py::test_an_author_runs_the_suite",                   # the same venv
    "tests/test_noise.py::test_welfords_mean_and_variance",                     # Inductor compiles
    "tests/test_crash.py::test_a_crashing_case_is_named",                       # a child pytest session
    "tests/test_gate_own_op.py",                                                # a user's repository and its baseline
    "tests/test_gate.py::test_updating_a_baseline_twice",                       # the small report and its rerun
    "tests/test_models.py::test_short_training_run",
    "tests/test_report.py::test_a_crash_loses_only_its_case",
    "tests/test_report.py::test_one_extra_rounding_step",
    "tests/test_shards.py::test_the_union_of_the_shards",
    "tests/test_report.py::test_ops_an_implementation_declares_lacking",
    "tests/test_crash.py::test_the_first_failure_stops",
    "tests/test_sanitize.py::test_memcheck",
    "tests/test_sanitize.py::test_the_kernels_raw_swiglu_forward",
    "tests/test_scale.py::test_pytest_deselects",
    "tests/test_docs.py::test_links_and_markup[README.md]",                     # starts the docs' probe
    "tests/test_ops.py::test_matches_hf__rope",
    "tests/test_compile.py::test_a_patched_model_compiles_whole",
    "tests/test_packaging.py",
    "tests/test_declared_project.py",
    "tests/test_models.py::test_patched_model_matches_unpatched",
    "tests/test_runtime.py::test_an_explicit_choice",
    "tests/test_exact.py::test_the_gate_fails_a_broken_promise",                # two reports and a gate
    "tests/test_gradient_kinds.py::test_the_suite_fails_the_sixteen_bit_sum",   # two child pytest sessions
    "tests/test_mutate.py::test_a_run_classes_each_mutant",                     # a process per mutant
    "tests/test_kernel_coverage.py::test_a_stored_run_renders_again",           # a report, rendered twice
    "tests/test_kernel_coverage.py::test_pytest_names_the_kernel",              # a child pytest session
    "tests/test_mutate.py::test_the_gate_judges_the_survivors",                 # a report, two mutation runs
    "tests/test_mutate.py::test_every_variant_runs_the_widest_rows",            # mutants under the interpreter
    "tests/test_mutate.py::test_reads_past_a_tensor",                           # the same
    "tests/test_ops.py::test_matches_hf",
    "tests/test_runner.py",
    "tests/test_engine.py::test_repro_command",
    "tests/test_models.py",
    "tests/test_catalogue.py",
    "tests/test_ops.py::test_aliasing",
)


def pytest_configure(config):
    if getattr(config.option, "maxschedchunk", "absent") is None:  # xdist is loaded and nobody chose
        config.option.maxschedchunk = 1


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        return next((i for i, prefix in enumerate(LONGEST_FIRST) if item.nodeid.startswith(prefix)),
                    len(LONGEST_FIRST))

    items.sort(key=rank)  # stable: within a rank, collection order
