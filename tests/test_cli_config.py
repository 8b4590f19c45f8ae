"""The command line as a new user meets it: a command whose extra is missing says which extra in one line
(exit 2) instead of a traceback; `generate`/`serve` check the whole configuration (flags, methods, the
model's config.json) before any weight loads or any output, in one line that names the flag typed (exit 2);
every method the README lists is accepted; the README's own generate example runs as written.

Most checks run on a model directory holding only config.json: a check that needed the weights (or reached
mlx-lm) would fail there with a traceback instead of the one line.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from veloxquant import spec
from veloxquant.tools import cli
from veloxquant.tools.cli import extras

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(model_type="llama", hidden_size=256, num_hidden_layers=2, intermediate_size=512,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-5, vocab_size=512,
            tie_word_embeddings=True)


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _config_only(tmp_path, **changes) -> Path:
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({**TINY, **changes}))
    return d


def _cli(argv, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as e:           # argparse's own usage errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


# ---- extras -------------------------------------------------------------------------------------------
def _pyproject():
    with open(ROOT / "pyproject.toml", "rb") as f:
        return spec.tomllib.load(f)["project"]["optional-dependencies"]


def _names(reqs) -> set[str]:
    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in reqs}


def test_extras_agree_with_pyproject():
    deps = _pyproject()
    for extra, modules in extras.EXTRAS.items():
        assert extra in deps, f"pyproject.toml has no extra [{extra}] (tools/cli/extras.py names it)"
        wanted = {dist for _, dist in modules}
        # tokenizers comes with mlx-lm (through transformers); every other distribution is listed by name
        listed = _names(deps[extra]) | ({"tokenizers"} if "mlx-lm" in _names(deps[extra]) else set())
        assert wanted <= listed, (extra, wanted - listed)
    dev = deps["dev"]
    brought = set().union(*(_names(deps[e]) for e in extras.EXTRAS))
    self_ref = [r for r in dev if r.replace(" ", "").startswith("veloxquant[")]
    named = set().union(*(set(r.split("[", 1)[1].split("]")[0].split(",")) for r in self_ref)) if self_ref else set()
    assert set(extras.EXTRAS) <= named or brought <= _names(dev), "[dev] must bring every extra"
    for command, needed in cli.NEEDS.items():
        assert command in cli.SUBCOMMANDS and set(needed) <= set(extras.EXTRAS), command


# sys.modules[name] = None makes `import name` fail as if it were not installed
_BLOCK = "import sys; [sys.modules.__setitem__(m, None) for m in sys.argv[1].split(',')]; sys.argv[1:2] = []; "
_CLI = _BLOCK + "from veloxquant.tools.cli import main; sys.exit(main(sys.argv[1:]))"


@pytest.mark.parametrize("blocked, argv, extra", [
    ("mlx_lm", ["generate", "--model", "DIR", "--prompt", "hi"], "lm"),
    ("mlx_lm", ["serve", "--model", "DIR"], "lm"),
    ("mlx_lm", ["quality"], "lm"),
    ("mlx_lm", ["memory"], "lm"),
    ("pytest,hypothesis", ["conformance", "--methods", "turboquant"], "conformance"),
    ("hypothesis", ["conformance"], "conformance"),
    ("mlx_lm", ["distortion", "--dims", "64", "--methods", "kivi"], "lm"),   # the trained model's keys need mlx-lm
])
def test_a_missing_extra_is_one_line(tmp_path, blocked, argv, extra):
    argv = [str(_config_only(tmp_path)) if a == "DIR" else a for a in argv]
    r = subprocess.run([sys.executable, "-c", _CLI, blocked, *argv], capture_output=True, text=True,
                       cwd=tmp_path, env=_env(), timeout=120)
    assert r.returncode == extras.MISSING_EXTRA_EXIT, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"pip install 'veloxquant[{extra}]'" in lines[0], r.stderr[-2000:]
    assert r.stdout == ""
    # --help needs no extra
    h = subprocess.run([sys.executable, "-c", _CLI, blocked, argv[0], "--help"], capture_output=True, text=True,
                       cwd=tmp_path, env=_env(), timeout=120)
    assert h.returncode == 0 and "usage:" in h.stdout, h.stderr[-2000:]


def test_tiny_model_without_mlx_lm_is_one_line(tmp_path):
    code = _BLOCK + "from veloxquant.tools.cli.tiny_model import main; sys.exit(main(sys.argv[1:]))"
    r = subprocess.run([sys.executable, "-c", code, "mlx_lm", str(tmp_path / "m")], capture_output=True, text=True,
                       cwd=tmp_path, env=_env(), timeout=120)
    assert r.returncode == extras.MISSING_EXTRA_EXIT and "veloxquant[lm]" in r.stderr, r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "m").exists()


# ---- configuration errors of generate / serve -------------------------------------------------------------
@pytest.mark.parametrize("command", ["generate", "serve"])
@pytest.mark.parametrize("flags, config, says", [
    (["--kv-fp16-layers", "1", "1"], {}, "--kv-fp16-layers 1 1: keeps all 2 layers"),
    (["--kv-fp16-layers", "0", "2"], {}, "--kv-fp16-layers 0 2: keeps all 2 layers"),
    (["--kv-method", "kivi", "--kv-group-size", "128"], {}, "--kv-group-size: 128 exceeds head dim 64"),
    (["--kv-method", "mlx_affine", "--kv-group-size", "128"], {}, "--kv-group-size: 128 exceeds head dim 64"),
    (["--kv-method", "kivi", "--kv-group-size", "32"], {"head_dim": 80}, "--kv-group-size: 32 does not divide"),
    (["--kv-bits", "9"], {}, "--kv-bits: 9 is not supported"),
    (["--kv-key-bits", "9"], {}, "--kv-key-bits: 9 is not supported"),
    (["--kv-bits", "4", "--kv-value-method", "rabitq"], {}, "--kv-bits: 4 is not supported"),
    (["--kv-value-bits", "7", "--kv-bits", "4"], {}, "--kv-value-bits: 7 is not supported"),
    (["--kv-bits2", "2"], {}, "--kv-bits2: only turboquant_rvq"),
    (["--kv-group-size", "32"], {}, "--kv-group-size: turboquant take no group size"),
    (["--kv-window", "-1"], {}, "--kv-window: -1 is outside"),
    (["--kv-seed", "-3"], {}, "--kv-seed: -3 is outside"),
    (["--max-kv-size", "64"], {}, "--max-kv-size: not supported"),
    ([], {"head_dim": 72}, "head dim 72 is not one VeloxQuant supports"),
])
def test_configuration_errors_are_one_line_before_any_work(tmp_path, capsys, command, flags, config, says):
    model = _config_only(tmp_path, **config)      # no weights: a check that loaded them would fail otherwise
    prompt = ["--prompt", "x"] if command == "generate" else []
    code, out, err = _cli([command, "--model", str(model), *flags, *prompt], capsys)
    assert code == 2, (code, err)
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert says in err, err
    assert "key_bits" not in err and "value_bits" not in err and "Traceback" not in err


@pytest.mark.parametrize("argv, says", [
    (["generate", "--prompt", "x"], "the following arguments are required: --model"),
    (["serve"], "the following arguments are required: --model"),
    (["generate", "--model", "/no/such/dir", "--prompt", "x"], "--model /no/such/dir: no such directory"),
    (["generate", "--model", "not a repo", "--prompt", "x"], "--model not a repo: no such directory"),
    (["generate", "--kv-method", "nosuch", "--model", "m"], "--kv-method: invalid choice: 'nosuch'"),
    (["generate", "--kv-key-method", "nosuch", "--model", "m"], "--kv-key-method: invalid choice: 'nosuch'"),
])
def test_model_and_method_errors(tmp_path, capsys, argv, says):
    code, out, err = _cli(argv, capsys)
    assert code == 2 and says in err and "Traceback" not in err, (code, err)
    assert out == "" and len(err.strip().splitlines()) == 1, err      # one line, not argparse's whole usage


def test_distortion_without_the_trained_model_needs_no_mlx_lm(tmp_path):
    """`--trained` with no dims measures the sphere data only: numpy and MLX, no extra."""
    r = subprocess.run([sys.executable, "-c", _CLI, "mlx_lm", "distortion", "--trained", "--dims", "64",
                        "--methods", "kivi", "--ablation-vectors", "0"], capture_output=True, text=True,
                       cwd=tmp_path, env=_env(), timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]


def test_a_plot_skipped_for_matplotlib_names_the_extra(tmp_path):
    """--markdown without matplotlib still writes the page (exit 0); the line saying the plot was skipped names
    the extra that brings it."""
    r = subprocess.run([sys.executable, "-c", _CLI, "matplotlib", "distortion", "--trained", "--dims", "64",
                        "--methods", "kivi", "--ablation-vectors", "0", "--json", str(tmp_path / "d.json"),
                        "--markdown", str(tmp_path / "d.md")], capture_output=True, text=True, cwd=tmp_path,
                       env=_env(), timeout=300)
    assert r.returncode == 0 and (tmp_path / "d.md").is_file(), r.stderr[-2000:]
    skipped = [line for line in r.stdout.splitlines() if line.startswith("plot skipped")]
    assert skipped and "pip install 'veloxquant[plots]'" in skipped[0], r.stdout[-2000:]


def test_recommend_outside_a_checkout_is_one_line(tmp_path, capsys, monkeypatch):
    """A wheel has no committed runs (docs/retrieval/, docs/distortion.json): --recommend says so in one line,
    exit 2, instead of one error per table with a heading between them."""
    pytest.importorskip("mlx_lm")
    from veloxquant.tools.quality import retrieval_doc
    monkeypatch.setattr(retrieval_doc, "committed_runs", lambda: [tmp_path / "docs" / "retrieval" / "run.json"])
    code, out, err = _cli(["quality", "--recommend"], capsys)
    assert code == 2 and out == "", (code, out, err)
    assert len(err.strip().splitlines()) == 1 and "source checkout" in err and "veloxquant quality" in err, err


def test_a_directory_without_config_is_named(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, out, err = _cli(["generate", "--model", str(tmp_path / "empty"), "--prompt", "x"], capsys)
    assert code == 2 and "no config.json" in err and out == "", err


@pytest.mark.parametrize("method", spec.METHODS)
def test_every_method_is_accepted(tmp_path, method):
    from veloxquant.tools.cli import kv_flags
    import argparse
    p = argparse.ArgumentParser()
    kv_flags.add_arguments(p)
    args = p.parse_args(["--model", str(_config_only(tmp_path)), "--kv-method", method])
    args.passthrough = []
    s = kv_flags.check(args)
    assert s["method"] == method and s["_params"]["key"].method == method


def test_readme_lists_only_accepted_methods():
    text = (ROOT / "README.md").read_text()
    listed = set(re.findall(r"`(\w+)`", text)) & set(spec.METHODS)
    from veloxquant.tools.cli import kv_flags
    assert listed and listed <= set(kv_flags.CACHE_METHODS), listed - set(kv_flags.CACHE_METHODS)


# ---- the README's example, verbatim -----------------------------------------------------------------------
def _readme_commands() -> tuple[str, str]:
    """The README's tiny-model line and its generate example (joined over backslash continuations)."""
    text = (ROOT / "README.md").read_text().replace("\\\n", " ")
    tiny = re.search(r"^python -m veloxquant\.tools\.cli\.tiny_model .*$", text, re.M)
    gen = re.search(r"^veloxquant generate .*$", text, re.M)
    assert tiny and gen, "README shows the tiny model and a generate example"
    return tiny.group(0), gen.group(0)


def test_readme_generate_example_runs_as_written(tmp_path):
    pytest.importorskip("mlx_lm")
    pytest.importorskip("tokenizers")
    tiny, gen = _readme_commands()
    # the README's commands, run from a scratch folder; only the entry point is spelled out for the checkout
    r = subprocess.run([sys.executable, *shlex.split(tiny, comments=True)[1:]], capture_output=True, text=True, cwd=tmp_path,
                       env=_env(), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    g = subprocess.run([sys.executable, "-m", "veloxquant.tools.cli", *shlex.split(gen, comments=True)[1:]], capture_output=True,
                       text=True, cwd=tmp_path, env=_env(), timeout=300)
    assert g.returncode == 0, g.stderr[-3000:]
    assert "Traceback" not in g.stderr and "[veloxquant] KV cache at the end:" in g.stdout, g.stdout + g.stderr


def test_readme_python_snippet_runs_on_the_tiny_model(tmp_path):
    """The README's cache snippet, as written, on the model the README offers to try things on (load("...") is the
    only change)."""
    pytest.importorskip("mlx_lm")
    pytest.importorskip("tokenizers")
    from veloxquant.tools.cli.tiny_model import save_tiny_llama
    model = save_tiny_llama(tmp_path / "tiny-llama", head_dim=64, layers=2, seed=1)
    code = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    assert 'load("...")' in code, code
    code = code.replace('load("...")', f"load({str(model)!r})")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=_env(),
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


def test_mlx_affine_generates(tmp_path):
    pytest.importorskip("mlx_lm")
    pytest.importorskip("tokenizers")
    from veloxquant.tools.cli.tiny_model import save_tiny_llama
    model = save_tiny_llama(tmp_path / "m", head_dim=64, layers=2, seed=1)
    g = subprocess.run([sys.executable, "-m", "veloxquant.tools.cli", "generate", "--model", str(model),
                        "--kv-method", "mlx_affine", "--kv-bits", "4", "--prompt", "hi", "--max-tokens", "4"],
                       capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=300)
    assert g.returncode == 0, g.stderr[-3000:]
    assert "keys mlx_affine (4 bits)" in g.stderr and "2 of 2 layers compressed" in g.stdout, g.stdout


# ---- the conformance report ---------------------------------------------------------------------------------
def test_conformance_report_lists_selected_methods_and_skip_reasons(tmp_path, capsys):
    pytest.importorskip("hypothesis")
    # tests written for one method (kivi's trim, turboquant's GQA mapping), one with no selected method (kivi and
    # mlx_affine's group rule), and one the reference skips with a reason (its replay compares against itself)
    k = ("kivi_trim_puts_back_decoded or gqa_head_mapping or group_must_divide_head_dim "
         "or histories_with_kept_tokens")
    report = tmp_path / "r.json"
    code, out, err = _cli(["conformance", "--impl", "reference", "--methods", "turboquant", "-k", k,
                           "--json", str(report)], capsys)
    assert code == 0, out[-3000:] + err[-3000:]
    table = out.split("-------------", 1)[1].split("\n\n", 1)[0]
    rows = [line.split()[0] for line in table.strip().splitlines()[1:]]
    assert rows and set(rows) <= {"turboquant", "(mutants)", "-"} | {r for r in rows if r.startswith("codebook")}, rows
    assert "turboquant" in rows and "kivi" not in rows, table
    r = json.loads(report.read_text())
    assert {c["method"] for c in r["cells"]} <= {"turboquant", "-"}, r["cells"]
    names = {t["id"].split("::")[-1].split("[")[0] for t in r["tests"]}
    assert "test_attention_gqa_head_mapping" in names, names
    assert not names & {"test_kivi_trim_puts_back_decoded", "test_group_must_divide_head_dim"}, \
        "another method's tests are deselected, not reported as skips"
    skipped = [t for t in r["tests"] if t["outcome"] == "skipped"]
    assert skipped, "the selection above includes skips (the reference's replay of kept tokens)"
    for t in skipped:
        assert t["message"] and t["message"] != "(no reason given)", t
        assert _first(t["message"]) in out, t      # each reason is printed under the table
    assert not any("not selected" in t["message"] for t in skipped), skipped
    assert sum(c["skipped"] for c in r["cells"]) <= len(skipped)


def test_conformance_passes_rules_report_through(tmp_path, capsys):
    """`veloxquant conformance --rules-report PATH` hands the option to the suite (conformance/conftest.py writes
    the per-rule verdicts) and prints its totals: the two golden cast cases pin R-num-output-cast alone."""
    pytest.importorskip("hypothesis")
    path = tmp_path / "rules.json"
    code, out, err = _cli(["conformance", "--impl", "reference", "-k", "golden_cast", "--rules-report", str(path)],
                          capsys)
    assert code == 0, out[-3000:] + err[-3000:]
    assert path.exists(), "--rules-report was not passed to the suite"
    r = json.loads(path.read_text())
    assert r["schema"] == "veloxquant-rules-report/1" and r["impl"] == "reference", r["schema"]
    passed = sorted(k for k, v in r["rules"].items() if v["status"] == "passed")
    assert passed == ["R-num-output-cast"], passed
    assert r["summary"] == {"passed": 1, "failed": 0, "not exercised": len(r["rules"]) - 1}, r["summary"]
    assert f"spec rules: 1 passed, 0 failed, {len(r['rules']) - 1} not exercised (wrote {path})" in out, out[-2000:]


def _first(message: str) -> str:
    return message.splitlines()[0][:60]


# ---- the README ---------------------------------------------------------------------------------------------
def test_readme_links_exist_and_it_carries_no_history():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150, "README is for users: keep it under ~150 lines (docs/ for the rest)"
    for doc in ("README.md", "docs/caches.md", "docs/changelog.md"):
        base = (ROOT / doc).parent
        for link in re.findall(r"\]\(([^)#\s]+)", (ROOT / doc).read_text()):
            if "://" not in link:
                assert (base / link).exists(), f"{doc} links to {link}, which does not exist"
    hashes = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", text) if re.search(r"\d", w) and re.search(r"[a-f]", w)]
    assert not hashes, f"commit hashes in README (history goes to docs/changelog.md): {hashes}"
    assert not re.search(r"\b\w+(th|st|nd|rd) pass\b", text), "pass numbers in README"
