"""Cold start: a fresh Python process's first request (imports, a small random llama, the cache, a prompt and a few
generated tokens: what `veloxquant generate` or a server's first request pays, kernel compilation included), ours
against the same process with mlx-lm's fp16 KVCache, in the same rounds. The whole process is timed; gated: ours /
fp16 per round (median). The child's own phases (import, model, first request) are kept in extra_info."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import harness
from veloxquant.tools.bench import arms as bench_arms

pytest.importorskip("mlx_lm")
CHILD = harness.ROOT / "benchmarks" / "cold_start_child.py"


@pytest.mark.parametrize("arm", list(harness.ARMS))
def test_cold_start(benchmark, bench, request, arm):
    sz = bench.sizes["cold_start"]
    if arm not in sz.get("arms", harness.ARMS):
        pytest.skip(f"{bench.device} sizes: cold start of {sz['arms']} only (each round is two fresh processes)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(harness.ROOT), os.environ.get("PYTHONPATH")])))
    phases = {"ours": [], "fp16": []}
    shape = json.dumps(bench_arms.SHAPES[sz["shape"]])

    def run(settings, key):
        def go(_i):
            out = subprocess.run([sys.executable, str(CHILD), json.dumps(settings), bench.device, shape,
                                  str(sz["layers"]), str(sz["context"]), str(sz["tokens"])],
                                 capture_output=True, text=True, env=env, timeout=600)
            if out.returncode:
                raise RuntimeError(f"cold-start child ({key}) exited {out.returncode}:\n{out.stderr[-2000:]}")
            phases[key].append(json.loads(out.stdout.strip().splitlines()[-1]))
        return go

    benchmark.group = f"cold start: fresh process, {sz['layers']}-layer llama ({sz['shape']}), prompt {sz['context']}"
    res = harness.paired(benchmark, run(harness.ARMS[arm], "ours"), {"fp16": run(None, "fp16")},
                         rounds=sz["rounds"], warmup=sz["warmup"],
                         info=dict(suite="cold_start", arm=arm, context=sz["context"], layers=sz["layers"],
                                   tokens=sz["tokens"], shape=sz["shape"]))
    for key, rows in phases.items():     # medians of the timed rounds' phases (the warm-up rounds come first)
        rows = rows[sz["warmup"]:] or rows
        benchmark.extra_info[f"{key}_phases_s"] = {k: sorted(r[k] for r in rows)[len(rows) // 2] for k in rows[0]}
    bench.gate(request, "cold_start", res)
