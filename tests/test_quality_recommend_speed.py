"""The recommendation's way to the benchmarks and back: `--bench-kv` arms (tools/bench/kv_arms.py,
benchmarks/conftest.py) build caches of exactly the recommended key/value configuration, and the recommendation's
speed columns (tools/quality/speed.py) take each configuration's numbers from the arm that stored the same thing."""
from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

from veloxquant.tools.bench import kv_arms
from veloxquant.tools.quality import retrieval_doc as qd
from veloxquant.tools.quality import speed

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _harness():
    spec = importlib.util.spec_from_file_location("bench_harness_kv", ROOT / "benchmarks" / "harness.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _stored(p) -> tuple:
    return p.method, p.bits, p.bits2, p.group_size, p.window


@pytest.mark.parametrize("text, keys, values", [
    ("turboquant:3/turboquant:2", ("turboquant", 3, None, None, 0), ("turboquant", 2, None, None, 0)),
    ("turboquant_rvq:2+1/kivi:4", ("turboquant_rvq", 2, 1, None, 0), ("kivi", 4, None, 32, 0)),
    ("kivi:2/turboquant_prod:3", ("kivi", 2, None, 32, 0), ("turboquant_prod", 3, None, None, 0)),
])
def test_bench_kv_arm_builds_caches_of_exactly_that_configuration(text, keys, values):
    """Both ways the benchmarks make caches (decode step: tools/bench/arms.make; generate: harness.make_caches
    through make_prompt_cache) give every layer these key and value params, window 0 for both roles."""
    h = _harness()
    name, _ = kv_arms.kv_arm(text)
    assert name.startswith("keys ") and " + values " in name
    model, _ = h.model(2, "cpu")
    for caches in (h.bench_arms.make(name, 2), h.make_caches(name, model, 2)):
        assert len(caches) == 2
        for c in caches:
            assert (_stored(c.key_params), _stored(c.value_params)) == (keys, values), c
    for suite in ("decode_step", "generate"):                 # measured on the CPU too: no skip raised
        try:
            h.skip_unless_measured("cpu", suite, name)
        except pytest.skip.Exception as e:
            pytest.fail(f"{name} skipped in {suite}: {e}")


def test_bench_kv_names_follow_the_mixed_arm_and_read_back():
    h = _harness()
    name, s = kv_arms.kv_arm("turboquant:3/kivi:2")
    assert name == "keys turboquant b3 + values kivi b2 (window 0)"       # OURS' mixed arm keeps kivi's window 128
    assert kv_arms.stored_config(s) != kv_arms.stored_config(h.ALL_ARMS["keys turboquant b3 + values kivi b2"])
    assert kv_arms.kv_arm("turboquant:3/turboquant:2")[0] == "keys turboquant b3 + values turboquant b2"
    assert kv_arms.kv_arm_settings(name) == s
    assert kv_arms.kv_arm_settings("keys turboquant b3 + values kivi b2") is None      # not a --bench-kv name
    for bad in ("turboquant:3", "turboquant:9/turboquant:2", "nope:2/kivi:2", "turboquant_rvq:2/kivi:2",
                "turboquant_rvq:2+1/turboquant_rvq:2+2"):
        with pytest.raises(ValueError):
            kv_arms.kv_arm(bad)


def test_bench_kv_option_adds_the_arms_to_decode_step_and_generate():
    """The pytest options end to end (collection only): the arms are added, or measured alone with
    --bench-kv-only; a malformed one is a usage error naming --bench-kv."""
    cmd = [sys.executable, "-m", "pytest", "benchmarks/test_decode_step.py", "benchmarks/test_generate.py",
           "--device", "cpu", "--collect-only", "-q", "-p", "no:cacheprovider", "--bench-contexts", "256"]
    kv = ["--bench-kv", "turboquant:3/turboquant:2", "kivi:4/turboquant:4"]
    run = lambda *a: subprocess.run(cmd + list(a), cwd=ROOT, capture_output=True, text=True)  # noqa: E731
    only = run(*kv, "--bench-kv-only")
    ids = sorted(x for x in only.stdout.splitlines() if "::" in x)
    assert ids == sorted(f"benchmarks/test_{s}.py::test_{s}[ctx256-{n}]" for s in ("decode_step", "generate")
                         for n in ("keys turboquant b3 + values turboquant b2",
                                   "keys kivi b4 + values turboquant b4 (window 0)")), only.stdout + only.stderr
    added = [x for x in run(*kv).stdout.splitlines() if "::" in x]
    assert len(added) > len(ids) and set(ids) <= set(added) and any("turboquant b4]" in x for x in added)
    bad = run("--bench-kv", "turboquant:9/turboquant:2")
    assert bad.returncode != 0 and "--bench-kv" in bad.stderr


# ---- the speed columns ----------------------------------------------------------------------------------------
def _cell(method, bits, variant, kl, bpc, bits2=None):
    return {"model": "plain", "label": f"{method}/{bits}{'+' + str(bits2) if bits2 else ''}/{variant}",
            "method": method, "bits": bits, "bits2": bits2, "variant": variant, "context": 1024, "kl_mean": kl,
            "role_bits_per_coord": bpc, "hits": 1, "sequences": 2}


ROWS = [_cell("turboquant", 2, "k", 0.30, 2.25), _cell("turboquant", 2, "v", 0.10, 2.25),
        _cell("turboquant", 3, "k", 0.10, 3.25), _cell("turboquant", 3, "v", 0.05, 3.25),
        _cell("turboquant", 4, "k", 0.02, 4.25), _cell("turboquant", 4, "v", 0.01, 4.25)]
# budgets (retrieval_doc.BUDGETS) 2.5: turboquant 2 / 2; 3.0: keys 3 / values 2 (2.75 bits); 4.0: 4 / 3; 5.0: 4 / 4


def _bench_json(tmp_path, arms: dict, name="bench.json", device="NVIDIA H200", date="2026-12-05T01:02") -> pathlib.Path:
    """A pytest-benchmark JSON as the benchmarks write it: {(suite, arm, context): ours ÷ fp16 time}."""
    bms = [{"name": f"test_{s}[{a}]", "extra_info": {"suite": s, "arm": a, "context": c, "ratios": {"fp16": r}}}
           for (s, a, c), r in arms.items()]
    p = tmp_path / name
    p.write_text(json.dumps({"datetime": date, "benchmarks": bms, "veloxquant": {
        "device": {"name": device, "type": "gpu"}, "sizes": {"decode_step": {"layers": 8},
                                                             "generate": {"layers": 4, "shape": "llama3-8b"}}}}))
    return p


def _table(lines: list[str]) -> dict[float, list[str]]:
    return {float(x.split("|")[1]): [c.strip() for c in x.split("|")[1:-1]] for x in lines
            if x.startswith("| ") and x.split("|")[1].strip()[:1].isdigit()}


def test_speed_lands_in_the_row_of_the_arm_with_that_configuration(tmp_path):
    """Two measured arms: the --bench-kv arm of keys turboquant 3 / values turboquant 2 (by name) and OURS'
    'turboquant b4' (the same configuration as keys 4 / values 4 at window 0); each row gets its own arm's numbers,
    as × fp16 (the inverse of the time ratio); turboquant 2 / 2, which no arm ran, is `not measured`."""
    mixed = kv_arms.kv_arm("turboquant:3/turboquant:2")[0]
    p = _bench_json(tmp_path, {("decode_step", "turboquant b4 (window 32)", 32768): 4.0,     # a neighbour, first
                               ("decode_step", "keys turboquant b3 + values kivi b2", 32768): 8.0,
                               ("decode_step", mixed, 32768): 1.25, ("generate", mixed, 32768): 0.8,
                               ("decode_step", "turboquant b4", 32768): 2.0, ("generate", "turboquant b4", 4096): 0.5,
                               ("decode_step", "fp16 KVCache", 32768): 1.0})
    lines = qd._recommendation(ROWS, speed.load([p]))
    head = next(x for x in lines if x.startswith("| budget"))
    assert "decode step × fp16 | generate × fp16" in head
    rows = {b: r[-3:-1] for b, r in _table(lines).items()}
    assert rows[3.0] == ["32k 0.80×", "32k 1.25×"]
    assert rows[5.0] == ["32k 0.50×", "4k 2.00×"]
    assert rows[2.5] == rows[4.0] == ["not measured", "not measured"]
    assert "NVIDIA H200, 2026-12-05" in next(x for x in lines if x.startswith("Budget"))


def test_a_later_source_fills_only_what_the_first_did_not_measure(tmp_path):
    mixed = kv_arms.kv_arm("turboquant:3/turboquant:2")[0]
    a = _bench_json(tmp_path, {("decode_step", mixed, 32768): 2.0}, "a.json")
    b = _bench_json(tmp_path, {("decode_step", mixed, 32768): 4.0, ("generate", mixed, 32768): 0.5}, "b.json",
                    device="Apple M3", date="2026-12-06")
    got = speed.lookup(speed.load([a, b]), ("turboquant", 3, None), ("turboquant", 2, None))
    assert got == {"decode_step": {32768: (0.5, 0)}, "generate": {32768: (2.0, 1)}}
    assert speed.cell(got["generate"], True) == "32k 2.00× [2]"
    assert "[2] `" in speed.caption(speed.load([a, b])) and "Apple M3, 2026-12-06" in speed.caption(speed.load([a, b]))


def test_bench_args_are_the_recommended_configurations(tmp_path, capsys):
    res = {"model": {"preset": "t"}, "run": {"device": "cpu", "date": "2026-12-05"}, "results": ROWS}
    p = tmp_path / "q.json"
    p.write_text(json.dumps(res))
    assert qd.main(["--json", str(p), "--bench-kv"]) == 0
    args = capsys.readouterr().out.split()
    assert args == ["turboquant:2/turboquant:2", "turboquant:3/turboquant:2", "turboquant:4/turboquant:3",
                    "turboquant:4/turboquant:4"]
    for a in args:                                  # each one a valid --bench-kv argument
        kv_arms.kv_arm(a)


def test_distortion_recommendation_takes_its_speed_from_the_benchmarks(tmp_path):
    """budget.speed_of (docs/distortion.md's speed column): the arm storing the configuration, × fp16 per suite;
    `not measured` where no arm ran it, and at a head dim the benchmarks' layers do not have."""
    from veloxquant.tools.quality import budget

    mixed = kv_arms.kv_arm("turboquant:3/turboquant:2")[0]
    src = speed.load([_bench_json(tmp_path, {("decode_step", mixed, 32768): 1.25, ("generate", mixed, 32768): 0.8,
                                             ("decode_step", "turboquant b4", 32768): 2.0})])
    tq = lambda b: ("turboquant", b, None)  # noqa: E731
    assert budget.speed_of(tq(3), tq(2), 128, src) == "decode step 32k 0.80×; generate 32k 1.25×"
    assert budget.speed_of(tq(4), tq(4), 128, src) == "decode step 32k 0.50×; generate not measured"
    assert budget.speed_of(tq(2), tq(2), 128, src) == "decode step not measured; generate not measured"
    assert budget.speed_of(tq(3), tq(2), 64, src).startswith("not measured (the benchmarks' head dim is 128)")
