"""Render docs/quality-retrieval.md from one or more JSONs of `python -m veloxquant.tools.quality.retrieval run`.

Several JSONs merge (e.g. the CPU for short contexts, the H200 for long ones): a cell (model variant,
configuration, context) comes from the first JSON that has it, and every table says which run each
context's column came from (device, MLX version, date). Runs of the same model, device, dtype, chunk and
seed over disjoint rounds (`run --first-round K`) pool instead: sequences and hits add up, means are
weighted by sequences, the 99th percentile is the larger of the two. `--exclude MODEL=REASON` leaves a
model variant out of the page (cells, key statistics, errors) and says why.

    python -m veloxquant.tools.quality.retrieval_doc --json a.json [b.json ...] --markdown docs/quality-retrieval.md
    python -m veloxquant.tools.quality.retrieval_doc --committed      # the page from RUNS and speed.COMMITTED
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

from ..bench.kv_arms import kv_spec
from ..bench.render import shown
from . import retrieval_plot
from . import speed as speed_src
from .budget import cache_flags

ROOT = pathlib.Path(__file__).resolve().parents[2]
# docs/quality-retrieval.md: the runs on the committed model in merge order (a cell from the first run that has it;
# the outliers run first, see docs/retrieval-model.md run 6); the speed sources are speed.COMMITTED. `--committed`
# renders the page from them; `veloxquant quality --recommend` reads them.
PAGE = "docs/quality-retrieval.md"
RUNS = ("docs/retrieval/quality-h200-run6-outliers.json", "docs/retrieval/quality-h200-run6-a.json",
        "docs/retrieval/quality-h200-run6-b.json",
        "docs/retrieval/quality-h200-run6-d.json")


def committed_runs() -> list[pathlib.Path]:
    return [ROOT / p for p in RUNS]


def committed_speed() -> list[pathlib.Path]:
    return speed_src.committed()


def _run_label(i: int) -> str:
    return chr(ord("A") + i)


def _same_measurement(a: dict, b: dict, method: str) -> bool:
    """Whether two runs measured `method`'s cell the same way (model, device, dtype, chunk, seed), so their rounds
    pool. The model is its recipe, step and commands, wherever its folder was (a copy on the GPU machine, the
    checkout); how mlx-lm's QuantizedKVCache attends (`mlx_q_native`) matters only for its own cells."""
    keys = ("dtype", "chunk", "seed") + (("mlx_q_native",) if method.startswith("mlx_q") else ())
    model = lambda r: {k: v for k, v in r["model"].items() if k != "dir"}  # noqa: E731
    return (model(a) == model(b) and a["run"]["device"] == b["run"]["device"]
            and all(a["settings"].get(k) == b["settings"].get(k) for k in keys))


def _pool(a: dict, b: dict) -> dict | None:
    """One cell from two runs' cells over disjoint rounds (None when the rounds overlap)."""
    if {s["round"] for s in a["per_sequence"]} & {s["round"] for s in b["per_sequence"]}:
        return None
    na, nb = a["sequences"], b["sequences"]
    n = na + nb
    out = {**a, "sequences": n, "hits": a["hits"] + b["hits"], "retrieval": (a["hits"] + b["hits"]) / n,
           "per_sequence": a["per_sequence"] + b["per_sequence"], "run": a["run"] + "+" + b["run"]}
    for k in ("nll", "kl_mean", "kl_answer_mean"):
        if a.get(k) is not None and b.get(k) is not None:
            out[k] = (a[k] * na + b[k] * nb) / n
    out["ppl"] = math.exp(out["nll"])
    if a.get("kl_p99") is not None and b.get("kl_p99") is not None:
        out["kl_p99"] = max(a["kl_p99"], b["kl_p99"])
    return out


def merge(results: list[dict]) -> tuple[list[dict], dict]:
    """(rows with a `run` letter, {(model, label, context): run letters}): runs of the same measurement over
    disjoint rounds pool their cells; otherwise the cell with more sequences stands (the first JSON's on a tie)."""
    rows, at = [], {}
    for i, res in enumerate(results):
        for r in res["results"]:
            key = (r["model"], r["label"], r["context"])
            row = {**r, "run": _run_label(i)}
            if key not in at:
                at[key] = len(rows)
                rows.append(row)
                continue
            prev = rows[at[key]]
            first = results[ord(prev["run"][0]) - ord("A")]
            pooled = _pool(prev, row) if _same_measurement(first, res, r["method"]) else None
            if pooled is not None:
                rows[at[key]] = pooled
            elif row["sequences"] > prev["sequences"]:     # measured apart: the cell with more sequences stands
                rows[at[key]] = row
    return rows, {k: rows[i]["run"] for k, i in at.items()}


def exclude(results: list[dict], excluded: dict[str, str]) -> list[dict]:
    """The results without the excluded model variants' cells, key statistics and errors."""
    out = []
    for res in results:
        res = {**res, "results": [r for r in res["results"] if r["model"] not in excluded],
               "errors": [e for e in res.get("errors", []) if e["model"] not in excluded],
               "key_statistics": {k: v for k, v in res.get("key_statistics", {}).items() if k not in excluded}}
        out.append(res)
    return out


def _pct(x: float) -> str:
    return f"{x:+.2f} %"


def render(results: list[dict], sources: list[str], speed: list[dict] | None = None) -> str:
    """The page: runs, model and data, key statistics, then per model variant its retrieval tables."""
    rows, _ = merge(results)
    lines = _runs(results, sources) + _model_and_data(results) + _key_statistics(results[0])
    contexts = sorted({r["context"] for r in rows})
    by = {(r["model"], r["label"], r["context"]): r for r in rows}
    lines += _recommendation(rows, speed)
    for model in dict.fromkeys(r["model"] for r in rows):
        labels = list(dict.fromkeys(r["label"] for r in rows if r["model"] == model))
        src = {ctx: sorted({x for r in rows if r["model"] == model and r["context"] == ctx for x in r["run"].split("+")})
               for ctx in contexts}
        lines += _retrieval_table(model, labels, contexts, src, by)
        lines += _fp16_by_depth(model, contexts, by)
        for ctx in contexts:
            lines += _context_table(model, labels, ctx, src[ctx], by)
    return "\n".join(lines) + "\n"


BUDGETS = (2.5, 3.0, 4.0, 5.0)    # mean stored bits per coordinate over keys and values


def recommend(rows: list[dict], budgets=BUDGETS) -> list[dict]:
    """Per budget: the key and value configurations (model `plain`, keys-only and values-only cells at the
    shortest context where both roles were measured) with the least KL_k + KL_v whose mean stored bits fit;
    equal KL: fewer bits. Only configurations the caches offer (mlx_affine is an external format)."""
    cells = {(r["label"].rsplit("/", 1)[0], r["variant"], r["context"]): r for r in rows
             if r["model"] == "plain" and r["variant"] in ("k", "v") and r["method"] != "mlx_affine"}
    ctxs = sorted({c for (_, _, c) in cells})
    ctx = next((c for c in ctxs if any(v == "k" and cc == c for (_, v, cc) in cells)), None)
    if ctx is None:
        return []
    k = {n: r for (n, v, c), r in cells.items() if v == "k" and c == ctx}
    v = {n: r for (n, vv, c), r in cells.items() if vv == "v" and c == ctx}
    out = []
    for budget in budgets:
        best = None
        for nk, rk in k.items():
            for nv, rv in v.items():
                if rk.get("bits2") and rv.get("bits2") and rk["bits2"] != rv["bits2"]:
                    continue                                    # the caches take one bits2
                bits = (rk["role_bits_per_coord"] + rv["role_bits_per_coord"]) / 2
                if bits > budget + 1e-9:
                    continue
                key = (rk["kl_mean"] + rv["kl_mean"], bits)
                if best is None or key < best[0]:
                    best = (key, nk, nv, bits)
        if best is None:
            out.append({"budget": budget, "context": ctx, "keys": None})
            continue
        (kl, _), nk, nv, bits = best
        ck, cv = (_config(r) for r in (k[nk], v[nv]))
        out.append({"budget": budget, "context": ctx, "keys": nk, "values": nv, "mean_bits": bits, "kl_sum": kl,
                    "key_config": ck, "value_config": cv, "bench_kv": kv_spec(ck, cv),
                    "key_retrieval": {c: (r["hits"], r["sequences"]) for (n, vv, c), r in cells.items()
                                      if n == nk and vv == "k"},
                    "value_retrieval": {c: (r["hits"], r["sequences"]) for (n, vv, c), r in cells.items()
                                        if n == nv and vv == "v"},
                    "flags": cache_flags(ck, cv)})
    return out


def bench_kv_args(rows: list[dict]) -> list[str]:
    """The benchmarks' --bench-kv arguments of the recommended configurations (each once, in budget order)."""
    return list(dict.fromkeys(r["bench_kv"] for r in recommend(rows) if r["keys"] is not None))


def print_recommendation(json_paths: list[pathlib.Path], excluded: tuple[str, ...] = ("outliers",),
                         speed_paths: list[pathlib.Path] | None = None, bench_args: bool = False) -> int:
    """`veloxquant quality --recommend`: the table of recommend() from these runs (the committed page's), with the
    speed of each configuration from the benchmark JSONs `speed_paths` (none: no speed columns); `bench_args`: only
    the benchmarks' --bench-kv arguments of the recommended configurations, on one line."""
    missing = [p for p in [*json_paths, *(speed_paths or [])] if not p.is_file()]
    if missing:
        print(f"quality --recommend: {missing[0]} is not here (the runs live in the source checkout's docs/retrieval/, "
              "the benchmarks' in benchmarks/baselines/)", file=sys.stderr)
        return 2
    results = exclude([json.loads(p.read_text()) for p in json_paths], {m: "" for m in excluded})
    rows, _ = merge(results)
    if bench_args:
        print(" ".join(bench_kv_args(rows)))
        return 0
    speed = speed_src.load(speed_paths) if speed_paths else None
    run = results[0]["run"]
    print(f"Retrieval model {results[0]['model'].get('preset')} ({run['device']}, {run.get('gpu') or '-'}, "
          f"{run['date'][:10]}; docs/quality-retrieval.md):")
    print("\n".join(_recommendation(rows, speed)[4:]))
    if speed is not None:
        print(speed_src.caption(speed))
    return 0


def _config(r: dict) -> tuple:
    """(method, bits, bits2) of a retrieval cell."""
    return r["method"], r["bits"], r.get("bits2")


def _recommendation(rows: list[dict], speed: list[dict] | None = None) -> list[str]:
    """The section: its text, then the table (with speed columns from `speed`, speed.load's sources, if given)."""
    rec = recommend(rows)
    if not rec:
        return []
    ctx = rec[0]["context"]
    cols, sep = (" decode step × fp16 | generate × fp16 |", "---|---|") if speed is not None else ("", "")
    lines = ["## Recommendation by bit budget (this model)", "",
             f"Budget = mean stored bits per coordinate over keys and values (measured, window 0). Per budget, the "
             f"key and value configurations with the least KL_k + KL_v, each measured alone (the `k` and `v` "
             f"variants, model `plain`, {ctx} bytes), whose bits fit; mlx_affine is left out (an external format). "
             "Retrieval: hits / sequences of the same configurations, keys-only and values-only, per context. "
             "Flags: `veloxquant generate` / `serve`. "
             + (speed_src.caption(speed) if speed is not None else "Speed: docs/benchmarks.md."), "",
             f"| budget | keys | values | mean bits | KL_k + KL_v | keys-only retrieval | values-only retrieval |{cols} flags |",
             f"|---:|---|---|---:|---:|---|---|{sep}---|"]
    fmt = lambda d: ", ".join(f"{c // 1024}k {h}/{n}" for c, (h, n) in sorted(d.items()))  # noqa: E731
    for r in rec:
        if r["keys"] is None:
            lines.append(f"| {r['budget']:.1f} | none fits | | | | | |" + " |" * (1 + 2 * (speed is not None)))
            continue
        sp = ""
        if speed is not None:
            got = speed_src.lookup(speed, r["key_config"], r["value_config"])
            sp = "".join(f" {speed_src.cell(got[suite], len(speed) > 1)} |" for suite in speed_src.SUITES)
        lines.append(f"| {r['budget']:.1f} | {r['keys']} | {r['values']} | {r['mean_bits']:.2f} | {r['kl_sum']:.3g} | "
                     f"{fmt(r['key_retrieval'])} | {fmt(r['value_retrieval'])} |{sp} `{r['flags']}` |")
    lines.append("")
    return lines


def _runs(results: list[dict], sources: list[str]) -> list[str]:
    """The title and the table of runs (one letter each)."""
    lines = ["# Quality on the retrieval model: passkey retrieval over context and depth, perplexity and KL",
             "", "Generated from " + ", ".join(f"`{s}`" for s in sources) + " by "
             "`python -m veloxquant.tools.quality.retrieval_doc`; do not edit by hand.", "",
             "## Runs", "", "| run | command | device | GPU | mlx | mlx-lm | veloxquant (git) | date | wall | budget |",
             "|---|---|---|---|---|---|---|---|---:|---:|"]
    for i, res in enumerate(results):
        run, v = res["run"], res["run"]["versions"]
        lines.append(f"| {_run_label(i)} | `{res['command']}` | {run['device']} ({run['host']}) | {run.get('gpu') or '-'} | "
                     f"{v.get('mlx')} | {v.get('mlx-lm')} | {v.get('veloxquant')} ({v.get('git')}) | {run['date']} | "
                     f"{run['wall_s']:.0f} s | {run['budget_s']:.0f} s |")
    return lines


def _model_and_data(results: list[dict]) -> list[str]:
    """The model, corpus and method (from the first run), then what the budget skipped and what failed."""
    res0 = results[0]
    m, c, s = res0["model"], res0["corpus"], res0["settings"]
    lines = ["", "## Model and data", "",
             f"Byte-level mlx-lm llama from `tools/quality/retrieval_train.py`, preset `{m.get('preset')}`, "
             f"{(m.get('parameters') or 0):,} parameters, step {m.get('step')}/{m.get('total')} (seed {m.get('seed')}); "
             f"model arguments `{json.dumps(m.get('model_args'))}`. Held-out text: corpus "
             f"`{c['sha256'][:16]}` (Python {c['python']}, {c['files']} files, every {c['heldout_every']}th held out)"
             + ("" if c["matches_model"] else " — **not the model's training corpus: the held-out text may overlap "
                "its training text**") + ".", "",
             "Each sequence is the trainer's passkey format: held-out text with the line `PASSKEY = <5 digits>` at "
             "a line start at the given depth, ending in the query `PASSKEY = ` and the digits. Every cache reads it "
             f"as generate_step would (prefill in chunks of {s['chunk']} bytes, the answer one byte per call, "
             "teacher-forced). Retrieval = exact match of the 5 digits (argmax given the correct prefix = greedy). "
             "Perplexity = exp(mean next-byte NLL) over text positions; KL(fp16 ‖ cache) in nats, float64, over the "
             "same positions (mean, 99th percentile) and over the 5 answer positions (mean). Bits/coord: stored "
             "bits per quantized coordinate, measured. Variants: `kv` keys and values, `k` keys only, `v` values only, "
             f"`kv+window` with the newest {s['window']} tokens exact. kivi and mlx_affine group "
             f"{s['kivi_group_size']}; mlx-lm QuantizedKVCache group min(64, head_dim), "
             f"{'its own quantized attention' if s['mlx_q_native'] else 'attended dequantized'}; our caches "
             f"attended {s['cache_attention']}d. Compute dtype {s['dtype']}; caches see float16. Seed {s['seed']}.",
             "",
             "`outliers` is the same model with "
             f"{s['outliers']['pairs_per_kv_head']} RoPE channel pairs per KV head and layer scaled by fixed random "
             f"factors in {s['outliers']['scale']} and the matching query channels by the inverse (q·k unchanged, so "
             "the fp16 model computes the same function): the caches see keys with outlier channels.", ""]
    return lines + _skipped_and_failed(results)


def _skipped_and_failed(results: list[dict]) -> list[str]:
    """How many rounds the budget skipped or cut, and the configurations that raised (nothing if none)."""
    lines = []
    if any(r.get("skipped_rounds") for r in results):
        sk = [x for r in results for x in r.get("skipped_rounds", [])]
        lines += [f"Budget: {len(sk)} round(s) skipped or cut (one round = one sequence at one context through a "
                  "tier's configurations); the `n` of each cell says how many sequences it saw.", ""]
    errs = [(_run_label(i), e) for i, r in enumerate(results) for e in r.get("errors", [])]
    if errs:
        lines += ["Configurations that failed (their cells count only the sequences they finished):", ""]
        lines += [f"- run {i}: `{e['model']}` {e['label']} at {e['context']} bytes, round {e['round']}: `{e['error']}`"
                  for i, e in errs]
        lines.append("")
    return lines


def _key_statistics(res0: dict) -> list[str]:
    """Kurtosis and outlier channels of the keys and values per model variant and layer (the first run's)."""
    lines = ["## Keys and values: kurtosis and outlier channels per layer", "",
             "Post-RoPE, float16, as the cache receives them, over two held-out sequences. Kurtosis is Pearson's "
             "(3 for a Gaussian) per (KV head, channel); ratio = largest channel RMS / median channel RMS of its "
             "head; outlier channels have ratio > 4; per-token kurtosis is over one vector's coordinates (median "
             "over tokens and heads), what a rotation spreads out (a channel's own kurtosis does not change when it "
             "is scaled).", "",
             "| model | layer | keys: kurtosis median | max | ratio max | outliers | per-token kurtosis | values: "
             "kurtosis median | max | ratio max | outliers | per-token kurtosis |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, table in res0["key_statistics"].items():
        for row in table:
            k, v = row["k"], row["v"]
            lines.append(f"| {name} | {row['layer']} | {k['kurtosis_median']:.2f} | {k['kurtosis_max']:.1f} | "
                         f"{k['rms_ratio_max']:.1f} | {k['outlier_channels']}/{k['channels']} | "
                         f"{k['token_kurtosis_median']:.1f} | {v['kurtosis_median']:.2f} | {v['kurtosis_max']:.1f} | "
                         f"{v['rms_ratio_max']:.1f} | {v['outlier_channels']}/{v['channels']} | "
                         f"{v['token_kurtosis_median']:.1f} |")
    lines.append("")
    return lines


def _retrieval_table(model: str, labels: list[str], contexts: list[int], src: dict, by: dict) -> list[str]:
    """Hits / sequences per configuration and context for one model variant, naming each column's run."""
    lines = [f"## Retrieval, model `{model}`: exact match (hits / sequences) per context", "",
             "Columns from run " + ", ".join(f"{ctx}: {'+'.join(src[ctx]) or '-'}" for ctx in contexts) + ".", "",
             "| configuration | bits/coord | " + " | ".join(f"{ctx} B" for ctx in contexts) + " |",
             "|---|---:|" + "---:|" * len(contexts)]
    for lab in labels:
        cells = [by.get((model, lab, ctx)) for ctx in contexts]
        bpc = next((x["role_bits_per_coord"] for x in cells if x), float("nan"))
        lines.append(f"| {lab} | {bpc:.2f} | " + " | ".join(
            f"{x['hits']}/{x['sequences']}" if x else "-" for x in cells) + " |")
    lines.append("")
    return lines


def _fp16_by_depth(model: str, contexts: list[int], by: dict) -> list[str]:
    """The fp16 cache's hits per context and needle depth (nothing without fp16 cells)."""
    fp = [by.get((model, "fp16", ctx)) for ctx in contexts]
    depths = sorted({sq["depth"] for x in fp if x for sq in x["per_sequence"]})
    if not depths:
        return []
    lines = [f"fp16 cache by needle depth (model `{model}`; hit = 1):", "",
             "| context | " + " | ".join(f"{d:.1f}" for d in depths) + " |", "|---:|" + "---:|" * len(depths)]
    for ctx, x in zip(contexts, fp):
        if not x:
            continue
        hit = {}
        for sq in x["per_sequence"]:
            hit.setdefault(sq["depth"], []).append(int(sq["hit"]))
        lines.append(f"| {ctx} | " + " | ".join(
            "/".join(map(str, hit[d])) if d in hit else "-" for d in depths) + " |")
    lines.append("")
    return lines


def _delta_vs_fp16(x: dict, base: dict) -> float | None:
    """Perplexity change in % against fp16 over the same sequences: the cells' own perplexities when they saw
    the same rounds, else fp16's per-sequence NLL on the cell's rounds (None when a run did not record it)."""
    rounds = {s["round"] for s in x["per_sequence"]}
    if rounds == {s["round"] for s in base["per_sequence"]}:
        return 100 * (x["ppl"] / base["ppl"] - 1)
    ref = [s.get("nll") for s in base["per_sequence"] if s["round"] in rounds]
    if len(ref) != len(rounds) or None in ref:
        return None
    return 100 * (math.exp(x["nll"] - sum(ref) / len(ref)) - 1)


def _context_table(model: str, labels: list[str], ctx: int, src: list[str], by: dict) -> list[str]:
    """Perplexity, KL and retrieval of every configuration against fp16 at one context (nothing without fp16)."""
    base = by.get((model, "fp16", ctx))
    if base is None:
        return []
    lines = [f"### Model `{model}`, context {ctx} bytes (run {'+'.join(src)})", "",
             f"fp16: perplexity {base['ppl']:.4f}, retrieval {base['hits']}/{base['sequences']}. Δ vs fp16 compares "
             "the same sequences (n/a: the configuration saw fewer sequences than fp16 and the run did not record "
             "fp16's per-sequence loss).", "",
             "| configuration | bits/coord | n | perplexity | Δ vs fp16 | KL mean | KL p99 | KL answer | retrieval |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for lab in labels:
        x = by.get((model, lab, ctx))
        if x is None or lab == "fp16":
            continue
        delta = _delta_vs_fp16(x, base)
        lines.append(f"| {lab} | {x['role_bits_per_coord']:.2f} | {x['sequences']} | {x['ppl']:.4f} | "
                     f"{'n/a' if delta is None else _pct(delta)} | {x['kl_mean']:.2e} | {x['kl_p99']:.2e} | "
                     f"{x['kl_answer_mean']:.2e} | {x['hits']}/{x['sequences']} |")
    lines.append("")
    return lines


def write(json_paths: list[pathlib.Path], markdown: pathlib.Path, results: list[dict] | None = None,
          excluded: dict[str, str] | None = None, speed_paths: list[pathlib.Path] | None = None) -> None:
    if results is None:
        for p in json_paths:
            if not p.is_file():
                raise FileNotFoundError(f"--json: {p} does not exist")
        results = [json.loads(p.read_text()) for p in json_paths]
    if not results:
        raise ValueError("--json: give at least one result file")
    excluded = excluded or {}
    speed = speed_src.load(speed_paths) if speed_paths else None
    text = render(exclude(results, excluded), [shown(p) for p in json_paths] or ["(in memory)"], speed)
    figure, why = retrieval_plot.plot(merge(exclude(results, excluded))[0], markdown.with_suffix(".png"))
    section = (f"\n## KL by stored bits\n\n![KL by stored bits]({figure.name})\n\n{retrieval_plot.caption()}\n"
               if figure else f"\n## KL by stored bits\n\nNo figure: {why}.\n")
    text = text.replace("\n## Recommendation by bit budget", section + "\n## Recommendation by bit budget", 1)
    if excluded:     # after the runs table: what was left out, and why
        note = "".join(f"\n**Left out: model variant `{m}`** — {why}\n" for m, why in excluded.items())
        text = text.replace("\n## Model and data\n", note + "\n## Model and data\n", 1)
    markdown.parent.mkdir(parents=True, exist_ok=True)
    markdown.write_text(text)
    print(f"wrote {markdown}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m veloxquant.tools.quality.retrieval_doc", description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=pathlib.Path, nargs="+", default=None)
    ap.add_argument("--committed", action="store_true",
                    help=f"the committed page: --json from RUNS, --speed from speed.COMMITTED, --markdown {PAGE} unless given")
    ap.add_argument("--markdown", type=pathlib.Path, default=None, help="the page to write (needed unless --bench-kv)")
    ap.add_argument("--speed", type=pathlib.Path, nargs="+", default=None, metavar="BENCH_JSON",
                    help="pytest-benchmark JSONs of benchmarks/test_decode_step.py and test_generate.py (e.g. "
                         "benchmarks/baselines/h200.json, then runs with --bench-kv): the recommendation's speed "
                         "columns, an arm matched by its key/value configuration (the first JSON that has it wins)")
    ap.add_argument("--bench-kv", action="store_true",
                    help="write nothing: print the benchmarks' --bench-kv arguments of the recommended configurations")
    ap.add_argument("--exclude", action="append", default=[], metavar="MODEL=REASON",
                    help="leave a model variant (plain, outliers) out of the page, saying why")
    args = ap.parse_args(argv)
    if args.committed:
        args.json = args.json or committed_runs()
        args.speed = args.speed or committed_speed()
        args.markdown = args.markdown or (None if args.bench_kv else ROOT / PAGE)
    if not args.json:
        ap.error("--json is required (or --committed)")
    excluded = {}
    for e in args.exclude:
        model, sep, why = e.partition("=")
        if not sep or not model or not why.strip():
            ap.error(f"--exclude: {e!r} is not MODEL=REASON")
        excluded[model] = why.strip()
    if args.bench_kv:
        return print_recommendation(args.json, tuple(excluded), bench_args=True)
    if args.markdown is None:
        ap.error("--markdown is required (unless --bench-kv)")
    write(args.json, args.markdown, excluded=excluded, speed_paths=args.speed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
