"""Where a generated token's time goes, host or GPU (CUDA): mlx-lm's generate_step time per token beside the host's
time to build and encode one token's forward and the GPU's own time for it.

generate_step builds token n + 1's forward while the GPU runs token n's (async_eval), so its time per token is about
the larger of the host's part and the GPU's: where the host's is larger, a faster kernel cannot show end to end
(docs/decode-step-analysis.md). Per arm, on a random llama (tools/bench/arms.py model; its caches filled with `context`
random tokens, as the decode-step benchmark fills them):

- `wall`: generate_step of `tokens` tokens, median per token over rounds;
- `build` and `encode`: one forward (the model on one token, its caches appending) built on the host, then
  mx.async_eval's return (MLX encodes and submits the launches), each step waited for before the next;
- `gpu`: the same forward queued behind a hold (tools/bench/gpu_clock.py: its input token copied by a gate kernel
  that reads the hold's output), stamped on its logits: stamp - hold, less the gate-and-stamp overhead.

    python3 -m veloxquant.tools.dev.generate_split --context 32768 \\
        --arms 'fp16 KVCache' 'turboquant_rvq 2+2' 'turboquant_rvq 2+2 [TC_TWO_STAGE=0]'

A timing probe for the GPU machine, not a benchmark: the benchmarks (benchmarks/test_generate.py) say how fast; this
says which side sets the pace.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import mlx.core as mx

from ..bench import gpu_clock

WARM_TOKENS = 40


def token_times(model, caches, tok: mx.array, clock=gpu_clock, reps: int = 9) -> dict:
    """{build_s, encode_s, gpu_s}: medians over `reps` forwards of one token (each appends to `caches`)."""
    build, encode, gpu = [], [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        logits = model(tok[None], cache=caches)
        t1 = time.perf_counter()
        mx.async_eval(logits)
        t2 = time.perf_counter()
        mx.eval(logits)
        build.append(t1 - t0)
        encode.append(t2 - t1)
    overhead = clock.overhead_s([tok])
    for _ in range(reps):
        th = clock.hold()
        (gated,) = clock.gate([tok], th)
        logits = model(gated[None], cache=caches)
        te = clock.stamp(logits)
        mx.eval(th, te, logits)
        gpu.append(clock.span_s(th, te) - overhead)
    return {"build_s": statistics.median(build), "encode_s": statistics.median(encode),
            "gpu_s": statistics.median(gpu)}


def wall_per_token(model, caches, tok: mx.array, tokens: int, rounds: int) -> float:
    """generate_step's seconds per token (median over `rounds`, after one round of warm-up)."""
    from mlx_lm.generate import generate_step
    times = []
    for r in range(rounds + 1):
        t0 = time.perf_counter()
        for _ in generate_step(tok, model, max_tokens=tokens, prompt_cache=caches):
            pass
        if r:
            times.append((time.perf_counter() - t0) / tokens)
    return statistics.median(times)


def measure(arms: list[str], context: int, n_layers: int, tokens: int, rounds: int, shape: str = "llama3-8b",
            clock=gpu_clock, log=print) -> dict:
    """{arm: {wall_s, build_s, encode_s, gpu_s, paced_by}} per token; the model made once, each arm's caches filled
    with `context` random tokens."""
    from ..bench import arms as bd
    model, args = bd.model(n_layers, bd.SHAPES[shape])
    tok = mx.array([1], dtype=mx.int32)
    out = {}
    for arm in arms:
        with bd.knobs(arm):
            caches = bd.make(arm, n_layers)
            bd.prefill(caches, context, lambda *a: None)
            # plans made, kernels compiled, and a KIVI window's whole flush cycle (G = 32 tokens) seen: tuning's
            # whole_windows keeps its launch rows per window length, so fewer forwards time that cache's first misses
            for _ in range(WARM_TOKENS):
                mx.eval(model(tok[None], cache=caches))
            row = token_times(model, caches, tok, clock)
            row["wall_s"] = wall_per_token(model, caches, tok, tokens, rounds)
        host = row["build_s"] + row["encode_s"]
        row["paced_by"] = "host" if host >= row["gpu_s"] else "gpu"
        out[arm] = row
        log(f"{arm:<50} wall {row['wall_s'] * 1e3:7.3f} ms/token   host {host * 1e3:7.3f} (build "
            f"{row['build_s'] * 1e3:.3f}, encode {row['encode_s'] * 1e3:.3f})   gpu {row['gpu_s'] * 1e3:7.3f}   "
            f"paced by the {row['paced_by']}")
        del caches
        mx.clear_cache()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="generate_split", description=__doc__.splitlines()[0])
    p.add_argument("--arms", nargs="+", default=["fp16 KVCache", "turboquant b4", "turboquant_rvq 2+2"])
    p.add_argument("--context", type=int, default=32768)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    mx.set_default_device(mx.gpu)
    ok, why = gpu_clock.available()
    if not ok:
        print(f"generate_split: {why}", file=sys.stderr)
        return 2
    from ..bench import arms as bd
    bd.arm_names(a.arms)            # bad names and knobs fail before the model is made
    res = measure(a.arms, a.context, a.layers, a.tokens, a.rounds)
    if a.json:
        from .._env import run_record
        with open(a.json, "w") as f:
            json.dump({"schema": "veloxquant-generate-split/1",
                       **run_record("python3 -m veloxquant.tools.dev.generate_split", argv, quote=True),
                       "unit": "seconds per generated token", "context": a.context, "layers": a.layers,
                       "tokens": a.tokens, "rounds": a.rounds, "arms": res}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
