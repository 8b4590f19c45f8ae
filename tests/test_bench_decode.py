"""tools/bench_decode.py's layer suite on the CPU at a toy size (a benchmark's plumbing, not a timing): every row has
the step alone, the pipelined step and the host build, the build is part of the step, and the table renders old
runs (no pipelined / build fields) and new ones."""
from __future__ import annotations

import mlx.core as mx
import pytest

from veloxquant.tools import bench_decode as bd

pytest.importorskip("mlx_lm")


def test_layer_suite_rows_and_table():
    with mx.stream(mx.cpu):
        rows = bd.layer_suite([64], layers=1, steps=2, arms=["fp16 KVCache", "turboquant b4"], log=lambda *a: None)
    assert [r["arm"] for r in rows] == ["fp16 KVCache", "turboquant b4"], rows
    for r in rows:
        for f in ("layer_s", "pipelined_layer_s", "build_layer_s", "vs_fp16", "pipelined_vs_fp16"):
            assert f in r and r[f] > 0, (r["arm"], f, r.get(f))
        assert r["build_layer_s"] < r["layer_s"], (r["arm"], r["build_layer_s"], r["layer_s"])
    old = dict(rows[1])
    for f in ("pipelined_layer_s", "pipelined_vs_fp16", "build_layer_s"):
        del old[f]
    res = {"device": {"name": "cpu", "type": "cpu"}, "versions": {}, "date": "2026-12-01T00:00:00",
           "command": "test", "copy_bytes_per_s": 1e9, "layer": rows + [old]}
    table = [ln for ln in bd.render(res, "x.json") if ln.startswith("| 64 ")]
    assert len(table) == 3 and all(ln.count("|") == 13 for ln in table), table
    assert "— | —" in table[2] and table[2].count("—") == 3, table[2]


def test_an_arm_with_knobs_sets_them_for_its_steps_only(monkeypatch):
    from veloxquant.accelerated.kernels import attention as katt
    from veloxquant.accelerated.kernels import methods as km
    seen = []
    real = bd._step

    def spy(caches, q, k, v):
        seen.append((type(caches[0]).__name__, katt.FUSE_COMBINE, km.DEVICE_COUNTS))
        return real(caches, q, k, v)
    monkeypatch.setattr(bd, "_step", spy)
    arm = "turboquant b4 [FUSE_COMBINE=1, DEVICE_COUNTS=0]"
    with mx.stream(mx.cpu):
        rows = bd.layer_suite([32], layers=1, steps=1, arms=["fp16 KVCache", arm], log=lambda *a: None)
    assert [r["arm"] for r in rows] == ["fp16 KVCache", arm], rows
    assert {s for s in seen if s[0] == "KVCache"} == {("KVCache", False, True)}, seen
    assert {s for s in seen if s[0] != "KVCache"} == {("VeloxKVCache", True, False)}, seen
    assert katt.FUSE_COMBINE is False and km.DEVICE_COUNTS is True


@pytest.mark.parametrize("name", ["turboquant b4 [NOPE=1]", "turboquant b4 [FUSE_COMBINE=x]", "fp16 KVCache [FUSE_COMBINE=0]",
                                  "nope [FUSE_COMBINE=0]"])
def test_bad_arm_names_are_errors(name):
    with pytest.raises(ValueError, match="arm"):
        bd._arm_names([name])
