"""The measured speed of a recommended key/value configuration: its decode step and end-to-end generation against
fp16, from pytest-benchmark JSONs of benchmarks/test_decode_step.py and benchmarks/test_generate.py (e.g.
benchmarks/baselines/h200.json, or a run with `--bench-kv`). A benchmark arm matches a configuration where what its
caches store is the same (tools/bench/kv_arms.stored_config: method, bits, bits2, group size and window per role),
whatever the arm is called; a configuration no arm matches is "not measured", never a neighbour's number."""
from __future__ import annotations

import json
import pathlib

from ..bench import kv_arms
from ..bench.render import shown

SUITES = ("decode_step", "generate")
NOT_MEASURED = "not measured"
ROOT = pathlib.Path(__file__).resolve().parents[2]
# the speed sources the committed recommendations cite (docs/quality-retrieval.md, docs/distortion.md): the H200
# baseline, then the run of the recommended configurations (--bench-kv); the first that measured a cell wins
COMMITTED = ("benchmarks/baselines/h200.json", "docs/bench/h200-recommended-32k.json")
BENCH_HEAD_DIM = 128      # the benchmarks' layers (Llama-3-8B-shaped)


def committed() -> list[pathlib.Path]:
    """COMMITTED's files that are here (the source checkout; a wheel has none)."""
    return [ROOT / p for p in COMMITTED if (ROOT / p).is_file()]


def arm_settings(info: dict) -> dict | None:
    """make_prompt_cache's settings of a benchmark's arm: its extra_info's `cache` where the run recorded it, else
    from the arm's name (an arm of tools/bench/arms.py OURS or of --bench-kv); None for fp16, mlx-lm's caches and
    arms with tuning knobs ("turboquant b4 [FUSE_COMBINE=0]": an A/B, not the configuration as shipped)."""
    if info.get("cache"):
        return info["cache"]
    name = info.get("arm") or ""
    if name.endswith("]"):
        return None
    kv = kv_arms.kv_arm_settings(name)
    if kv is not None:
        return kv
    from ..bench import arms as bench_arms        # MLX: only for runs that did not record their settings
    return dict(bench_arms.OURS[name]) if name in bench_arms.OURS else None


def load(paths: list[pathlib.Path]) -> list[dict]:
    """One source per JSON: {"path", "device", "date", "cells": {(suite, stored config, context): ours ÷ fp16 time}}."""
    out = []
    for p in paths:
        data = json.loads(pathlib.Path(p).read_text())
        meta = data.get("veloxquant", {})
        dev = meta.get("device", {})
        cells = {}
        for b in data.get("benchmarks", []):
            info = b.get("extra_info", {})
            ratio = info.get("ratios", {}).get("fp16")
            s = arm_settings(info) if info.get("suite") in SUITES and ratio else None
            if s is not None:
                cells.setdefault((info["suite"], kv_arms.stored_config(s), info.get("context")), ratio)
        out.append({"path": shown(p), "device": dev.get("name") or dev.get("type") or "device not recorded",
                    "date": str(data.get("datetime") or "")[:10] or "date not recorded", "cells": cells,
                    "sizes": meta.get("sizes", {})})
    return out


def lookup(sources: list[dict], k: tuple, v: tuple) -> dict[str, dict[int, tuple[float, int]]]:
    """{suite: {context: (fp16 time ÷ ours, source index)}} of keys k and values v (each (method, bits, bits2)) at
    window 0, the first source that measured a (suite, context) winning."""
    cfg = kv_arms.stored_config(kv_arms.kv_settings(k, v))
    out: dict = {s: {} for s in SUITES}
    for i, src in enumerate(sources):
        for (suite, c, ctx), ratio in src["cells"].items():
            if c == cfg and ctx not in out[suite]:
                out[suite][ctx] = (1.0 / ratio, i)
    return out


def cell(measured: dict[int, tuple[float, int]], several: bool) -> str:
    """"4k 0.84×, 32k 0.77×" (with the source's number where there are several), or "not measured"."""
    if not measured:
        return NOT_MEASURED
    return ", ".join(f"{_ctx(c)} {x:.2f}×" + (f" [{i + 1}]" if several else "") for c, (x, i) in sorted(measured.items()))


def caption(sources: list[dict]) -> str:
    """What the speed columns are and where they come from (device, date and sizes of each source)."""
    what = ("Speed, × fp16 (higher is faster), per context measured: decode step = fp16's step time ÷ ours (append + "
            "attend through the layers); generate = ours ÷ fp16's tokens/s (mlx_lm generate_step on a random llama); "
            "an arm matched by what its caches store, not by its name; `not measured` where no benchmark ran this "
            "key/value configuration (`--bench-kv`, benchmarks/conftest.py). From ")
    src = []
    for i, x in enumerate(sources):
        ds, gen = x["sizes"].get("decode_step", {}), x["sizes"].get("generate", {})
        src.append(f"{'[%d] ' % (i + 1) if len(sources) > 1 else ''}`{x['path']}` ({x['device']}, {x['date']}; "
                   f"decode step {ds.get('layers', '?')} layers, generate {gen.get('layers', '?')}-layer llama "
                   f"shape {gen.get('shape', '?')})")
    return what + ", ".join(src) + "."


def _ctx(c) -> str:
    return f"{c // 1024}k" if isinstance(c, int) and c % 1024 == 0 else str(c)
