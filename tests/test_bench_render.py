"""tools/bench/render.py's tables on a small synthetic run: decode step and generate with one column per context,
the batch table with one column per (prompt length, prompts), an arm missing at a context shown as "—", a partial
run marked, and several runs merged into one."""
from __future__ import annotations

import json

from veloxquant.tools.bench import render as bench_render


def _b(suite, arm, median, ratio, **info):
    extra = {"suite": suite, "arm": arm, "ratios": {"fp16": ratio}, "ratio_iqr": {"fp16": 0.01},
             "baseline_median_s": {"fp16": median / ratio}, "median_s": median, **info}
    return {"name": f"test_{suite}[{arm}]", "fullname": f"b::{arm}", "options": {"timer": "perf_counter"},
            "stats": {"median": median}, "extra_info": extra}


def _run(partial=False):
    rows = [_b("decode_step", "tq", 0.004, 0.5, context=4096, layers=8, bytes_per_layer=2e6,
               fp16_bytes_per_layer=8e6),
            _b("decode_step", "tq", 0.016, 0.8, context=32768, layers=8, bytes_per_layer=16e6,
               fp16_bytes_per_layer=64e6),
            _b("decode_step", "kivi", 0.032, 2.0, context=32768, layers=8, bytes_per_layer=20e6,
               fp16_bytes_per_layer=64e6),
            _b("generate", "tq", 0.064, 0.8, context=4096, layers=4, tokens=64, shape="llama3-8b",
               tokens_per_s=1000.0, fp16_tokens_per_s=800.0),
            _b("generate", "tq", 0.128, 0.5, context=131072, layers=4, tokens=64, shape="llama3-8b",
               tokens_per_s=500.0, fp16_tokens_per_s=250.0),
            _b("batch_generate", "tq", 1.0, 0.8, context=8192, batch=8, layers=4, tokens=32, shape="llama3-8b",
               generation_tokens_per_s=400.0, fp16_generation_tokens_per_s=200.0, generation_time_ratio=0.5),
            _b("batch_generate", "tq", 2.0, 1.25, context=32768, batch=4, layers=4, tokens=32, shape="llama3-8b",
               generation_tokens_per_s=100.0, fp16_generation_tokens_per_s=125.0, generation_time_ratio=1.25)]
    out = {"datetime": "2026-12-03T20:00:00", "version": "5.2.3", "benchmarks": rows,
           "veloxquant": {"command": "pytest benchmarks", "device": {"name": "H", "type": "gpu"},
                          "bands": {"decode_step": 0.35, "generate": 0.6, "batch_generate": 0.6},
                          "warmup": "warm-up: 5 rounds"}}
    return dict(out, partial=True) if partial else out


def _table(lines, header_start):
    i = next(k for k, line in enumerate(lines) if line.startswith(header_start))
    j = next(k for k in range(i, len(lines)) if not lines[k].startswith("|"))
    return lines[i:j]


def test_context_columns_and_batch_table():
    lines = bench_render.render(_run(), "run.json")
    assert "- Warm-up: warm-up: 5 rounds" in lines
    dec = _table(lines, "| arm | 4k: ours ÷ fp16, ours / layer")
    assert dec[0] == "| arm | 4k: ours ÷ fp16, ours / layer | 32k: ours ÷ fp16, ours / layer | bytes / layer |"
    # fp16's time per layer: median over its rounds (0.004 / 0.5 / 8 = 1 ms at 4k; 20 ms and 16 ms / 8 at 32k)
    assert dec[2] == "| fp16 KVCache (median over its rounds in every benchmark) | 1, 1.00 ms | 1, 2.25 ms | |"
    assert dec[3] == "| tq | **0.50** (0.01), 500.0 µs | **0.80** (0.01), 2.00 ms | 16.00 MB (0.25) |"
    assert dec[4] == "| kivi | — | **2.00** (0.01), 4.00 ms | 20.00 MB (0.31) |"
    gen = _table(lines, "| arm | 4k: ours ÷ fp16 (time)")
    assert gen[0].split(" | ")[1:] == ["4k: ours ÷ fp16 (time), ours tokens/s (× fp16's)",
                                       "128k: ours ÷ fp16 (time), ours tokens/s (× fp16's) |"]
    assert gen[2] == "| fp16 KVCache (median over its rounds in every benchmark) | 1, 800.0 | 1, 250.0 |"
    assert gen[3] == "| tq | **0.80** (0.01), 1000.0 (1.25×) | **0.50** (0.01), 500.0 (2.00×) |"
    bat = _table(lines, "| arm | 8k × 8")
    assert bat[0] == ("| arm | 8k × 8: ours ÷ fp16 (time), generation tokens/s (× fp16) | 32k × 4: ours ÷ fp16 "
                      "(time), generation tokens/s (× fp16) |")
    assert bat[2] == "| fp16 BatchKVCache (median over its rounds in every benchmark) | 1, 200.0 | 1, 125.0 |"
    assert bat[3] == "| tq | **0.80** (0.01), 400.0 (2.00×) | **1.25** (0.01), 100.0 (0.80×) |"
    assert not any("partial run" in line for line in lines)


def test_partial_and_merged_runs(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    first = _run()
    first["benchmarks"] = first["benchmarks"][:3]
    a.write_text(json.dumps(first))
    second = _run(partial=True)
    second["benchmarks"] = second["benchmarks"][3:]
    second["veloxquant"] = dict(second["veloxquant"], command="pytest benchmarks -k batch")
    b.write_text(json.dumps(second))
    assert any("partial run" in line for line in bench_render.render(second, "b.json"))
    out = tmp_path / "m.json"
    assert bench_render.main([str(a), str(b), "--merge", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert [x["extra_info"]["suite"] for x in merged["benchmarks"]] == \
        [x["extra_info"]["suite"] for x in _run()["benchmarks"]]
    assert merged["partial"] is True
    assert merged["veloxquant"]["command"] == "pytest benchmarks ; pytest benchmarks -k batch (merged, 2 runs)"
    assert bench_render.render(merged, "m.json")[3:] == bench_render.render(dict(_run(), partial=True), "m.json")[3:]


def test_a_kept_runs_note_is_printed_under_its_header(tmp_path):
    run = _run()
    (tmp_path / "a.json").write_text(json.dumps(run))
    (tmp_path / "notes.json").write_text(json.dumps({"a.json": "a slower host: read its decode step only"}))
    text = bench_render.page([tmp_path / "a.json"])
    assert "- Note: a slower host: read its decode step only" in text, text[:2000]
    assert "- Note:" not in bench_render.page([tmp_path / "a.json"]).replace(
        "- Note: a slower host: read its decode step only", ""), "one note, once"


def test_every_note_names_a_kept_run():
    """docs/bench/notes.json and the baselines' (where there is one) name only runs that are there: a note must not
    outlive the run it explains."""
    for folder in (bench_render.ROOT / "docs" / "bench", bench_render.ROOT / "benchmarks" / "baselines"):
        for name in bench_render.notes(folder):
            assert bench_render.is_saved_run(folder / name), f"{folder / 'notes.json'}: {name} is not a saved run there"
