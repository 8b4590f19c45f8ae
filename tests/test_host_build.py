"""tools/dev/host_build.py: the batched decode step's host build with stand-in kernels, both batch caches."""
from __future__ import annotations

import json
import subprocess
import sys


def test_host_build_measures_both_batch_caches(tmp_path):
    out = tmp_path / "hb.json"
    r = subprocess.run([sys.executable, "-m", "veloxquant.tools.dev.host_build", "--batch-sizes", "1", "3", "--context",
                        "20", "--layers", "2", "--steps", "4", "--json", str(out)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    got = {(row["batch"], row["cache"]) for row in res["rows"]}
    assert got == {(b, c) for b in (1, 3) for c in ("SharedBatchVeloxKVCache", "BatchVeloxKVCache")}, got
    for row in res["rows"]:
        assert row["host_build_layer_s"] > 0 and len(row["rounds"]) == 2, row
    assert "stand-in" in res["what"] and res["device"]["type"] == "cpu"
