"""tools/dev/host_split.py with stand-in kernels (its own process: it replaces the kernel backend): every variant and
the timed parts of one layer's step, the launches told apart by kernel."""
from __future__ import annotations

import json
import subprocess
import sys


def test_host_split_times_the_parts_and_the_saved_launch_variants(tmp_path):
    out = tmp_path / "hs.json"
    r = subprocess.run([sys.executable, "-m", "veloxquant.tools.dev.host_split", "--stand-ins", "--contexts", "40",
                        "--arms", "fp16 KVCache", "turboquant b4", "--layers", "2", "--steps", "4", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    rows = {(row["arm"], row["variant"]): row for row in res["rows"]}
    assert set(rows) == {("fp16 KVCache", "as is"), ("fp16 KVCache", "parts timed")} | {
        ("turboquant b4", v) for v in ("as is", "partial saved", "combine saved", "both saved", "parts timed")}, rows
    assert all(row["build_layer_s"] > 0 for row in rows.values())
    ours = rows[("turboquant b4", "parts timed")]["parts"]
    # per layer and step: one update, one SDPA call through our decode step, one partial and one combine launch
    for part in ("update_and_fetch", "  DecodeStep.step", "SDPA (mlx-lm's base)", "  DecodeStep.attend",
                 "partial launch call", "combine launch call"):
        assert ours[part]["calls_per_step"] == 2, (part, ours)
    assert set(rows[("fp16 KVCache", "parts timed")]["parts"]) == {"update_and_fetch", "SDPA (mlx-lm's base)"}
    assert res["stand_ins"] is True
