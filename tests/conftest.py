"""The test profiles: `pytest` runs the quick one, `pytest --full` everything (CI runs that).

The quick profile leaves out the families below, marked `slow` here (so `-m slow` selects them): each costs
a minute or more on 2 CPU cores for what a contributor's edit rarely touches (C++ emulation and compiles of the
GPU kernels, whole models and servers, multi-process runs). They were found with `pytest --durations`; a family
is a test file, or one test function (file::name) where the rest of its file is quick.

The profile applies to a run that names no paths (pytest's testpaths: tests/ and conformance/): `pytest
tests/test_x.py` runs all of that file, slow or not, and `-m EXPR` overrides the profile.
"""
from __future__ import annotations

import os

# MLX runs float32 matmuls as TF32 on CUDA by default (MLX_ENABLE_TF32, read by MLX itself): ~1e-3 relative error,
# past the tolerances that compare the ops path with the kernels and float64. The tests ask for full float32
# unless the caller set the variable; benchmarks/ keeps MLX's default (what users run).
os.environ.setdefault("MLX_ENABLE_TF32", "0")

import pytest

# Measured with `--durations` on a shared, loaded 2-core machine (per family: its tests' total there).
SLOW: tuple[str, ...] = (
    # C++ emulation of the GPU kernel bodies (a compile per configuration): 380 s, 20-70 s a test
    "tests/test_append_kernel_emulated.py",
    "tests/test_attention_kernels_emulated.py",
    "tests/test_batch_kivi_kernels_emulated.py",
    "tests/test_commit_kernel_emulated.py",
    "tests/test_kernels_emulated.py",
    "tests/test_kernels_head_dims.py",
    "tests/test_ragged_plan_growth_emulated.py",
    "tests/test_tc_ragged_kivi_emulated.py",
    "tests/test_tc_ragged_mixed_emulated.py",
    "tests/test_batch_ragged_mixed_kernels_emulated.py",
    "tests/test_ragged_mixed_step_emulated.py",
    "tests/test_ragged_kivi_keys_step_emulated.py",
    "tests/test_ragged_step_emulated.py",
    "tests/test_kernels_glue.py::test_one_shot_matches_ops",
    "tests/test_kernels_glue.py::test_faults_raise_like_ops",
    "tests/test_kernels_glue.py::test_deferred_faults_are_recorded_not_raised",
    "tests/test_kernels_glue.py::test_encode_chunk_checks_the_chunk",
    "tests/test_kernels_glue.py::test_stream_through_kernels",
    # nvcc / ptxas compiles of the CUDA sources (where a CUDA toolkit is installed): 30-280 s a test
    "tests/test_attention_kernels_source.py::test_cuda_partial_with_the_append_inside_compiles",
    "tests/test_attention_kernels_source.py::test_cuda_sources_compile",
    "tests/test_attention_kernels_source.py::test_cuda_tensor_core_partial_compiles_without_spills",
    "tests/test_attention_kernels_source.py::test_cold_loops_make_the_tensor_core_partial_smaller",
    "tests/test_attention_kernels_source.py::test_cuda_scalar_partial_of_turboquant_prod_b4_keeps_to_registers",
    "tests/test_tc_two_stage_emulated.py::test_cuda_two_stage_tensor_core_partial_compiles_without_spills",
    "tests/test_tc_two_stage_emulated.py::test_cuda_prod_b4_tensor_core_partial_compiles_without_spills",
    "tests/test_tc_mixed_emulated.py::test_cuda_tc_mixed_partial_compiles_without_spills",
    "tests/test_kernels_source.py::test_cuda_resources_no_spills",
    "tests/test_kernels_source.py::test_cuda_source_compiles_without_fma",
    "tests/test_kernels_glue.py::test_launch_fits_ptxas_registers",
    # whole models, generation, servers, multi-process runs: 10-40 s a test
    "tests/test_cli_serve.py",
    "tests/test_quality_trained.py",
    "tests/test_batch_cache.py::test_batch_generate_equals_single_sequence_runs",
    "tests/test_attention_packed.py::test_greedy_tokens_packed_equal_decoded",
    "tests/test_distributed_sharding.py",
    "tests/test_host_build.py",
    "tests/test_host_split.py",
    "tests/test_bench_kernels.py::test_runs_every_case_with_emulated_kernels",
    # whole commands in subprocesses (golden regeneration, pytest and CLI runs): 10-80 s a test
    "tests/test_golden_check.py",
    "tests/test_conformance_exit_codes.py",
    "tests/test_thorough_check.py::test_end_to_end_on_the_ops_path_then_resumed",
    "tests/test_thorough_check.py::test_end_to_end_reports_a_broken_implementation_as_failed",
    "tests/test_thorough_check.py::test_a_skipped_cell_is_reported_and_fails_the_run",
    "tests/test_thorough_check.py::test_deadline_marks_running_cells_cut_and_the_rest_not_started",
    "tests/test_cli_config.py::test_a_missing_extra_is_one_line",
    "tests/test_cli_config.py::test_distortion_without_the_trained_model_needs_no_mlx_lm",
    "tests/test_cli_config.py::test_a_plot_skipped_for_matplotlib_names_the_extra",
    "tests/test_cli_config.py::test_readme_generate_example_runs_as_written",
    "tests/test_cli_config.py::test_mlx_affine_generates",
    "tests/test_cli_config.py::test_readme_python_snippet_runs_on_the_tiny_model",
    "tests/test_cli_config.py::test_conformance_report_lists_selected_methods_and_skip_reasons",
    "tests/test_cli_config.py::test_conformance_passes_rules_report_through",
    "tests/test_profiles.py::test_slow_families_exist",
)


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true", default=False,
                     help="run every test, the slow families included (the quick profile is the default)")


def _is_slow(nodeid: str) -> bool:
    path, _, rest = nodeid.partition("::")
    name = rest.split("[", 1)[0]
    return any(s == path or s == f"{path}::{name}" for s in SLOW)


def pytest_collection_modifyitems(config, items):
    slow = [item for item in items if _is_slow(item.nodeid)]
    for item in slow:
        item.add_marker(pytest.mark.slow)
    if not quick(config):
        return
    if slow:
        ids = {id(item) for item in slow}
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if id(item) not in ids]
    config._vq_quick_deselected = len(slow)


def quick(config) -> bool:
    """The quick profile is in force: no --full, no -m, no paths named."""
    return not (config.getoption("--full") or config.getoption("markexpr")
                or config.args_source != pytest.Config.ArgsSource.TESTPATHS)


def pytest_report_header(config):
    if quick(config):
        return ["profile: quick (slow families left out; pytest --full runs everything)"]
    return ["profile: full" if config.getoption("--full") else "profile: as selected (paths or -m given)"]


def pytest_terminal_summary(terminalreporter, config):
    n = getattr(config, "_vq_quick_deselected", 0)
    if n:
        terminalreporter.write_line(f"quick profile: {n} slow tests not run (pytest --full runs them)")


@pytest.fixture
def tune():
    """`tune(**knobs)`: accelerated.tuning knobs changed until the end of the test (like monkeypatch.setattr, through
    tuning.override: names and types checked). Every change of one test goes through this one fixture, so they
    are undone in reverse order, after the fixtures that use it."""
    import contextlib

    from veloxquant.accelerated import tuning
    with contextlib.ExitStack() as stack:
        yield lambda **knobs: stack.enter_context(tuning.override(**knobs))
