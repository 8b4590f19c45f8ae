"""Exit codes a CI can trust: a usage error (unknown --impl or method, an implementation or device that cannot
run here, a reference that does not import) is an error with one line and no table; a missing golden/ fails
the golden test instead of skipping it; an XPASS fails `veloxquant conformance`."""
from __future__ import annotations

import subprocess
import sys

import pytest

from veloxquant.tools.cli import conformance as cli

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


def _pytest(*args, env=None):
    import os
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          cwd=ROOT, capture_output=True, text=True, env=e, timeout=300)


@pytest.mark.parametrize("args, says", [
    (["--impl", "mlx"], "--impl: 'mlx' is neither"),
    (["--impl", "no_such_module:make"], "cannot import 'no_such_module'"),
    (["--methods", "nosuch"], "--methods: unknown"),
])
def test_usage_errors_are_one_line(args, says):
    r = _pytest("conformance/test_golden.py", "--collect-only", *args)
    assert r.returncode == pytest.ExitCode.USAGE_ERROR, r.stdout + r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr + r.stdout, r.stderr


def test_a_device_that_is_not_there_is_an_error():
    import mlx.core as mx
    if mx.is_available(mx.gpu):
        pytest.skip("this machine has a GPU")
    for args in (["--device", "gpu"], ["--impl", "mlx_kernels"], ["--impl", "reference", "--device", "gpu"]):
        r = _pytest("conformance/test_golden.py", "--collect-only", *args)
        assert r.returncode == pytest.ExitCode.USAGE_ERROR, (args, r.stderr)
        assert "cannot run here" in r.stderr or "does not select devices" in r.stderr, (args, r.stderr)


def test_missing_golden_fails_not_skips(tmp_path):
    r = _pytest("conformance/test_golden.py", "--impl", "reference", env={"VELOXQUANT_GOLDEN_DIR": str(tmp_path)})
    assert r.returncode == pytest.ExitCode.TESTS_FAILED, r.stdout
    assert "golden-missing" in r.stdout and "skipped" not in r.stdout.splitlines()[-1]


def test_reference_import_failure_is_an_error():
    # sys.modules[name] = None makes `import name` raise ImportError: a reference that does not import
    code = ("import sys, pytest; sys.modules['veloxquant.reference.stream'] = None; "
            "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', 'conformance/test_golden.py', '--collect-only', "
            "'--impl', sys.argv[1]]))")
    for impl in ("reference", "mlx_ops"):
        r = subprocess.run([sys.executable, "-c", code, impl], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == pytest.ExitCode.USAGE_ERROR and "reference" in r.stderr, (impl, r.stderr)


def test_cli_usage_error_prints_no_table(capsys):
    import argparse
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    code = cli.run(p.parse_args(["--methods", "nosuch"]))
    out = capsys.readouterr()
    assert code == pytest.ExitCode.USAGE_ERROR
    assert "summary:" not in out.out and "first failure" not in out.out


@pytest.mark.parametrize("code, counts, want", [
    (0, {"passed": 3, "xpassed": 0}, 0),
    (0, {"passed": 3, "xpassed": 1}, 1),
    (1, {"passed": 3, "xpassed": 1}, 1),
])
def test_xpass_fails_the_cli(code, counts, want):
    assert cli.exit_code(code, counts) == want


@pytest.mark.parametrize("methods, tables", [("turboquant", {"gaussian"}), ("turboquant_rvq", {"gaussian", "residual"}),
                                             ("kivi", set()), ("turboquant_prod,rabitq", {"gaussian"})])
def test_a_restricted_run_collects_only_the_codebooks_its_methods_read(methods, tables):
    """--methods M: the exhaustive codebook cases of the codebooks M's records read (spec/formats.toml `tables`),
    the others deselected, so the report lists no codebook a run did not ask for."""
    r = _pytest("conformance/test_exhaustive.py", "--collect-only", "--methods", methods)
    ids = [ln for ln in r.stdout.splitlines() if "test_codebook[" in ln]
    got = {ln.split("test_codebook[")[1].split("-")[0] for ln in ids}
    assert got == tables, f"--methods {methods}: codebooks {sorted(got)}, want {sorted(tables)}\n{r.stdout[-400:]}"


@pytest.mark.parametrize("methods, absent, present", [
    ("turboquant", ["test_kivi_trim_puts_back_decoded", "test_group_must_divide_head_dim"], ["test_attention_gqa_head_mapping"]),
    ("kivi", ["test_attention_gqa_head_mapping"], ["test_kivi_trim_puts_back_decoded", "test_group_must_divide_head_dim"]),
])
def test_a_restricted_run_collects_no_other_methods_tests(methods, absent, present):
    """--methods M: a test of another method's own rule (the `method` marker) and a method-parametrized test with no
    selected method left are deselected, not skipped, so the report has nothing of the methods not asked for."""
    r = _pytest("conformance/test_cache_sequences.py", "conformance/test_bad_input.py",
                "conformance/test_attention.py", "--collect-only", "--methods", methods)
    names = {ln.split("::")[-1].split("[")[0] for ln in r.stdout.splitlines() if "::" in ln}
    assert not names & set(absent) and set(present) <= names, f"--methods {methods}: {sorted(names)}"
