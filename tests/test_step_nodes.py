"""The decode step's graph besides its launches (tools/dev/step_nodes.py, stand-in kernels in a process of its own):
each node is host time per layer per token on a GPU's host, so these are budgets a change must not exceed. Each
arm launches its partial (append inside) and its combine per layer; records without a window build nothing else but
the step's shared count view; a window adds its four views (the tokens leaving each role's window and the window
after the step: accelerated/in_place.py `windows`), and nothing else; with tuning's whole_windows (the window buffers
whole and their rows in one small input per launch: csrc/window_bind.h) a window adds none. The same for a batch of
ragged prompts merged into one B-row cache (KIVI's rows each at its own group phase: cache/ragged.py; its views stay:
cache/ragged_step.py is not on whole_windows)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

WHOLE = " [WHOLE_WINDOWS=1]"
ARMS = ("turboquant b4", "turboquant_prod b4", "turboquant b4 (window 32)", "kivi b4 (window 128)",
        "keys turboquant b3 + values kivi b2", "turboquant b4 (window 32)" + WHOLE, "kivi b4 (window 128)" + WHOLE,
        "keys turboquant b3 + values kivi b2" + WHOLE)
WINDOW_INPUTS = ("kw", "vw", "kf", "vf")


def _run(tmp_path_factory, batch: int) -> dict:
    out = tmp_path_factory.mktemp("nodes") / "nodes.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, "-m", "veloxquant.tools.dev.step_nodes", "--arms", *ARMS, "--context", "600",
                        "--batch", str(batch), "--json", str(out)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return {x["arm"]: x for x in json.loads(out.read_text())["rows"]}


@pytest.fixture(scope="module", params=[1, 4], ids=["single", "batch4"])
def rows(request, tmp_path_factory):
    got = _run(tmp_path_factory, request.param)
    if request.param > 1:       # one B-row cache per layer, not a cache per sequence
        caches = {a: r["cache"] for a, r in got.items()}
        assert set(caches.values()) == {"SharedBatchVeloxKVCache"}, caches
    return got


@pytest.mark.parametrize("arm", ARMS)
def test_each_layer_launches_its_partial_and_its_combine(rows, arm):
    launches = rows[arm]["launches_per_layer"]
    assert sorted(k.split("_")[2] for k in launches) == ["combine", "partial"] and set(launches.values()) == {1.0}, \
        f"{arm}: launches per layer {launches}"


@pytest.mark.parametrize("arm, views", [("turboquant b4", 0), ("turboquant_prod b4", 0),
                                        ("turboquant b4 (window 32)", 4), ("kivi b4 (window 128)", 4),
                                        ("keys turboquant b3 + values kivi b2", 2),
                                        ("turboquant b4 (window 32)" + WHOLE, 0), ("kivi b4 (window 128)" + WHOLE, 0),
                                        ("keys turboquant b3 + values kivi b2" + WHOLE, 0)])
def test_the_step_builds_only_its_window_views_and_one_count_view(rows, arm, views):
    r = rows[arm]
    if r["batch"] > 1 and arm.endswith(WHOLE) and "kivi" in arm:     # (a ragged batch's plan keeps its views)
        views = 4 if arm.startswith("kivi") else 2
    nodes = dict(r["nodes_per_layer"])
    assert nodes.pop("AsStrided", 0) <= views and nodes.pop("Slice", 0) * r["layers"] <= 1 and not nodes, \
        f"{arm}: nodes per layer besides the launches {r['nodes_per_layer']} (budget: {views} window views + 1 count " \
        f"view per step)"
    fed = {k.rsplit(".", 1)[1] for k in r["inputs_fed"]}
    window_inputs = () if views == 0 else WINDOW_INPUTS     # (whole_windows: buffers and wrow, no node feeds them)
    assert fed <= {"nenc", *window_inputs}, f"{arm}: graph nodes feed launch inputs {sorted(fed)}"
