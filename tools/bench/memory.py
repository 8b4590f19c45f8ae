"""`veloxquant memory`: peak memory of a long prefill and of decode, our caches against mlx-lm's fp16 KVCache
(a measurement, not a test).

A random Llama-shaped model (mlx_lm.models.llama, float16, few layers; Llama-3-8B's attention and MLP sizes
by default, a small vocabulary so that the prefill's logits do not hide the cache) runs what
mlx_lm.generate.generate_step runs: the prompt in chunks of --prefill-step tokens, `mx.eval` of every cache's
state and `mx.clear_cache()` after each, then --decode-tokens greedy steps. Per arm and context, with
`mx.reset_peak_memory` / `mx.get_peak_memory` / `mx.get_active_memory`:

- prefill peak: the highest active memory during the prefill, minus the active memory before it (the weights
  and anything else resident), so it is the cache plus the prefill's transients;
- cache: the cache's bytes after the prefill (`nbytes`; mlx-lm's KVCache counts its 256-token steps);
- prefill transient: prefill peak minus cache;
- decode peak: the highest active memory during the decode steps, minus the same baseline.

    veloxquant memory --device gpu --contexts 8192 32768 --json docs/bench/h200-memory.json \
        --markdown-section docs/bench/h200-memory.md
"""
from __future__ import annotations

import gc
import json
import pathlib
import sys
import time

from .._env import run_record

SHAPES = {   # llama.ModelArgs; "llama3-8b": Llama-3-8B's layer (vocabulary cut to 4096), "small": for tests
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                      head_dim=128, vocab_size=4096, rope_theta=500000.0),
    "small": dict(hidden_size=256, intermediate_size=512, num_attention_heads=8, num_key_value_heads=2,
                  head_dim=64, vocab_size=512),
    # CPU runs: MLX's CPU attention materializes the (heads, chunk, context) scores, so as many KV heads as
    # query heads keeps the cache visible next to them
    "cpu": dict(hidden_size=1024, intermediate_size=2048, num_attention_heads=8, num_key_value_heads=8,
                head_dim=128, vocab_size=1024),
}
ARMS = {      # name -> accelerated.cache.make_prompt_cache settings (None: mlx-lm's fp16 KVCache)
    "fp16 KVCache": None,
    "turboquant b4": dict(method="turboquant", bits=4),
    "kivi b4": dict(method="kivi", bits=4, group_size=32),
    "turboquant_prod b4": dict(method="turboquant_prod", bits=4),
}
MB = 1 << 20


def add_arguments(p) -> None:
    p.add_argument("--device", choices=["cpu", "gpu"], default=None)
    p.add_argument("--contexts", nargs="+", type=int, default=[8192, 32768])
    p.add_argument("--shape", choices=list(SHAPES), default="llama3-8b")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--arms", nargs="+", default=["fp16 KVCache", "turboquant b4", "kivi b4"],
                   help=f"of: {', '.join(ARMS)}")
    p.add_argument("--prefill-step", type=int, default=2048, help="as mlx-lm's prefill_step_size")
    p.add_argument("--decode-tokens", type=int, default=8)
    p.add_argument("--json", type=pathlib.Path, default=None)
    p.add_argument("--markdown-section", type=pathlib.Path, default=None,
                   help="write the markdown section (for docs/benchmarks.md) to this file")
    p.add_argument("--from-json", type=pathlib.Path, default=None, help="render a saved run (with --markdown-section)")


def build_model(shape: str, layers: int):
    import mlx.core as mx
    from mlx_lm.models import llama
    mx.random.seed(0)
    args = llama.ModelArgs(model_type="llama", num_hidden_layers=layers, rms_norm_eps=1e-5,
                           tie_word_embeddings=False, **SHAPES[shape])
    model = llama.Model(args)
    model.set_dtype(mx.float16)
    mx.eval(model.parameters())
    return model


def make_caches(model, arm: str):
    from mlx_lm.models import cache as lm

    from ...accelerated import cache as vc
    settings = ARMS[arm]
    if settings is None:
        return lm.make_prompt_cache(model)
    return vc.make_prompt_cache(model, seed=1, **settings)


def measure(model, arm: str, context: int, prefill_step: int, decode_tokens: int, log) -> dict:
    """One arm at one context: generate_step's prefill, then greedy decode steps (see the module)."""
    import mlx.core as mx
    prompt = mx.random.randint(0, model.args.vocab_size, (context,), key=mx.random.key(context))
    caches = make_caches(model, arm)
    gc.collect()
    mx.clear_cache()
    mx.synchronize()
    base = mx.get_active_memory()
    mx.reset_peak_memory()
    t0 = time.perf_counter()
    y = prompt
    while y.shape[0] > 1:
        n = min(prefill_step, y.shape[0] - 1)
        model(y[:n][None], cache=caches)
        mx.eval([c.state for c in caches])
        mx.clear_cache()
        y = y[n:]
        log(f"    {arm}: prefill {context - y.shape[0]}/{context} tokens, {time.perf_counter() - t0:.1f} s, "
            f"peak so far {(mx.get_peak_memory() - base) / MB:.1f} MB")
    logits = model(y[None], cache=caches)
    tok = mx.argmax(logits[:, -1], axis=-1)
    mx.eval(tok)
    prefill_s = time.perf_counter() - t0
    prefill_peak = mx.get_peak_memory() - base
    cache_bytes = sum(c.nbytes for c in caches)
    tokens = caches[0].offset
    resident = mx.get_active_memory() - base
    mx.clear_cache()
    mx.reset_peak_memory()
    t1 = time.perf_counter()
    for _ in range(decode_tokens):
        logits = model(tok[None], cache=caches)
        tok = mx.argmax(logits[:, -1], axis=-1)
        mx.eval(tok)
    decode_s = time.perf_counter() - t1
    decode_peak = mx.get_peak_memory() - base
    heads, head_dim = model.args.num_key_value_heads, model.args.head_dim
    fp16_exact = 2 * len(caches) * heads * head_dim * 2 * tokens    # the prefill's tokens, float16, no steps
    row = {"arm": arm, "context": context, "layers": len(caches), "cache_bytes": int(cache_bytes),
           "fp16_tokens_bytes": int(fp16_exact), "resident_after_prefill": int(resident),
           "prefill_peak": int(prefill_peak), "prefill_transient": int(prefill_peak - cache_bytes),
           "decode_peak": int(decode_peak), "prefill_s": round(prefill_s, 2),
           "decode_tokens_per_s": round(decode_tokens / decode_s, 2)}
    log(f"  context {context:6d} {arm:<20} cache {cache_bytes / MB:8.1f} MB  prefill peak {prefill_peak / MB:8.1f} MB"
        f" (transient {(prefill_peak - cache_bytes) / MB:7.1f} MB)  decode peak {decode_peak / MB:8.1f} MB  "
        f"prefill {prefill_s:.1f} s")
    del caches, logits, tok
    gc.collect()
    mx.clear_cache()
    return row


def render(res: dict, source: str | None = None) -> list[str]:
    dev = res["device"]
    v = res["versions"]
    lines = [f"## Peak memory: prefill and decode ({dev.get('type')}, {res['date'][:10]})", "",
             f"- Device: {dev.get('name', dev.get('type'))}; versions: mlx {v.get('mlx')}, mlx-lm {v.get('mlx-lm')}, "
             f"spec {v.get('spec')}, git {v.get('git')}",
             f"- Command: `{res['command']}`" + (f"; raw data: `{source}`" if source else ""),
             f"- Model: random llama, {res['layers']} layers, shape `{res['shape']}` "
             f"({json.dumps(res['shape_args'])}), float16; prefill in chunks of {res['prefill_step']} tokens "
             f"with `mx.eval(state)` and `mx.clear_cache()` between (as mlx-lm's generate_step), then "
             f"{res['decode_tokens']} greedy decode steps",
             "- Memory is active memory above what was resident before the prefill (the weights): `mx.get_peak_memory` "
             "after `mx.reset_peak_memory`. Transient = prefill peak - cache. fp16 tokens = the same tokens in "
             "float16 without mlx-lm's 256-token steps.", "",
             "| context | cache | cache MB | vs fp16 tokens | prefill peak MB | vs fp16 arm | prefill transient MB "
             "| decode peak MB | vs fp16 arm | prefill s | decode tok/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for t in sorted({r["context"] for r in res["rows"]}):
        rows = [r for r in res["rows"] if r["context"] == t]
        base = next((r for r in rows if r["arm"] == "fp16 KVCache"), None)
        for r in rows:
            rel = (lambda k: f"{r[k] / base[k]:.2f}") if base else (lambda k: "-")
            lines.append(f"| {t} | {r['arm']} | {r['cache_bytes'] / MB:.1f} | {r['cache_bytes'] / r['fp16_tokens_bytes']:.3f} "
                         f"| {r['prefill_peak'] / MB:.1f} | {rel('prefill_peak')} | {r['prefill_transient'] / MB:.1f} "
                         f"| {r['decode_peak'] / MB:.1f} | {rel('decode_peak')} | {r['prefill_s']} "
                         f"| {r['decode_tokens_per_s']} |")
    return lines + [""]


def run(args) -> int:
    if args.from_json:
        if not args.markdown_section:
            print("memory: --from-json needs --markdown-section", file=sys.stderr)
            return 2
        args.markdown_section.write_text("\n".join(render(json.loads(args.from_json.read_text()),
                                                          str(args.from_json))) + "\n")
        print(f"wrote {args.markdown_section}")
        return 0
    unknown = [a for a in args.arms if a not in ARMS]
    if unknown:
        print(f"memory: unknown arm(s) {unknown}; expected some of {list(ARMS)}", file=sys.stderr)
        return 2
    import mlx.core as mx

    from .harness import use_device
    if not use_device(args.device, "memory"):
        return 2
    log = lambda *a: print(*a, flush=True)   # noqa: E731
    res = {**run_record("veloxquant memory", sys.argv[2:], quote=True), "shape": args.shape,
           "shape_args": SHAPES[args.shape], "layers": args.layers, "prefill_step": args.prefill_step,
           "decode_tokens": args.decode_tokens, "rows": []}
    res["device"]["type"] = "gpu" if mx.default_device().type == mx.DeviceType.gpu else "cpu"
    model = build_model(args.shape, args.layers)
    log(f"memory: {args.layers}-layer {args.shape} model, weights {mx.get_active_memory() / MB:.0f} MB active")
    t0 = time.perf_counter()
    for t in args.contexts:
        for arm in args.arms:
            res["rows"].append(measure(model, arm, t, args.prefill_step, args.decode_tokens, log))
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=1) + "\n")
        log(f"wrote {args.json}")
    lines = render(res, str(args.json) if args.json else None)
    if args.markdown_section:
        args.markdown_section.parent.mkdir(parents=True, exist_ok=True)
        args.markdown_section.write_text("\n".join(lines) + "\n")
        log(f"wrote {args.markdown_section}")
    else:
        print("\n".join(lines))
    return 0
