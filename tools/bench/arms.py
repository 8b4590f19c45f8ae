"""The benchmark arms, one table for every benchmark (the pytest benchmarks in
benchmarks/): the arms' names and cache settings, the random llamas' shapes, and how an arm's caches are made,
prefilled and stepped.

An arm of ours may carry tuning knobs for an A/B in one run: "turboquant b4 [FUSE_COMBINE=0, DEVICE_COUNTS=0]"
runs that arm's steps under accelerated.tuning.override(fuse_combine=False, device_counts=False) (knob names in
either case; they are read when a step's launches are planned).
"""
from __future__ import annotations

import contextlib

from ...accelerated import tuning
from . import gpu_clock
from .harness import B, D, HKV, HQ
from .kv_arms import kv_arm_settings

# mlx-lm's own caches, the baselines every arm of ours is read against
BASELINES = ("fp16 KVCache", "mlx q4 QuantizedKVCache", "mlx q8 QuantizedKVCache")
OURS = {   # arm name -> make_prompt_cache-style settings (about 4 bits per coordinate where the method allows)
    "turboquant b4": dict(method="turboquant", bits=4),
    "turboquant_rvq 2+2": dict(method="turboquant_rvq", bits=2, bits2=2),
    "turboquant_prod b4": dict(method="turboquant_prod", bits=4),
    "kivi b4 (window 128)": dict(method="kivi", bits=4, group_size=32),
    "rabitq": dict(method="rabitq", bits=1),
    "mlx_affine b4": dict(method="mlx_affine", bits=4, group_size=64),
    "turboquant b4 (window 32)": dict(method="turboquant", bits=4, window=32),
    "keys turboquant b3 + values kivi b2": dict(method=None, key_method="turboquant", key_bits=3, value_method="kivi",
                                                value_bits=2),
    # issue 29's matrix: every method at its default bits (formats.toml default_bits) with window 0 and window 32;
    # the arms above cover window 0 of all but kivi (its default window is 128)
    "turboquant_rvq 2+2 (window 32)": dict(method="turboquant_rvq", bits=2, bits2=2, window=32),
    "turboquant_prod b4 (window 32)": dict(method="turboquant_prod", bits=4, window=32),
    "kivi b2 (window 0)": dict(method="kivi", bits=2, group_size=32, window=0),
    "kivi b2 (window 32)": dict(method="kivi", bits=2, group_size=32, window=32),
    "rabitq (window 32)": dict(method="rabitq", bits=1, window=32),
    "mlx_affine b4 (window 32)": dict(method="mlx_affine", bits=4, group_size=64, window=32),
    # the mixed pair with one window for both roles (turboquant keys R = 32 beside KIVI values R = 32: a ragged batch's
    # windowed in-place step, cache/ragged_step.py RaggedMixedWindowsInPlace)
    "keys turboquant b3 + values kivi b2 (window 32)": dict(method=None, key_method="turboquant", key_bits=3,
                                                            value_method="kivi", value_bits=2, window=32),
}
# The arms a quick CPU run measures (a 2-core CI machine); the others run with --device gpu.
QUICK = ("turboquant b4", "kivi b4 (window 128)")

# The random llamas' layer shapes: Llama-3-8B's (the GPU's generate and batch benchmarks), the same with the vocabulary
# cut to 4096 (the embedding and head are not what is measured), and one small enough for a 2-core machine.
LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=HQ, num_key_value_heads=HKV,
                 head_dim=D, vocab_size=128256)
SHAPES = {
    "cpu": dict(hidden_size=1024, intermediate_size=2048, num_attention_heads=8, num_key_value_heads=8, head_dim=128,
                vocab_size=1024),
    "llama3-8b": dict(LLAMA3_8B, vocab_size=4096),
}


def split(name: str) -> tuple[str, dict]:
    """(the arm's base name, {knob: value}) of an arm name; unknown knobs and bad values are an error."""
    if not name.endswith("]") or " [" not in name:
        return name, {}
    base, _, rest = name[:-1].partition(" [")
    raw = {}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        k, _, v = item.partition("=")
        raw[k.strip()] = v
    try:
        return base, tuning.parse(raw)
    except (TypeError, ValueError) as e:
        raise ValueError(f"arm {name!r}: {e}") from None


@contextlib.contextmanager
def knobs(name: str):
    """An arm's knobs in effect for the duration of a block (accelerated.tuning.override)."""
    with tuning.override(**split(name)[1]):
        yield


def settings(name: str) -> dict:
    """make_prompt_cache's settings of one of our arms (knobs, if any, stripped from the name): OURS, or an arm of
    an explicit key/value configuration (kv_arms.kv_arm, the benchmarks' --bench-kv); KeyError for any other."""
    base = split(name)[0]
    if base in OURS:
        return dict(OURS[base])
    kv = kv_arm_settings(base)
    if kv is None:
        raise KeyError(name)
    return kv


def arm_names(selected) -> list[str]:
    """Every arm (baselines first) where `selected` is None, else `selected` checked: known names or an explicit
    key/value configuration's name (kv_arms: "keys turboquant b3 + values turboquant b2"), knobs only on ours."""
    names = [*BASELINES, *OURS]
    if selected is None:
        return names
    for n in selected:
        base, kn = split(n)
        ours = base in OURS or kv_arm_settings(base) is not None
        if not (ours or base in names) or (kn and not ours):
            raise ValueError(f"unknown arm {n!r}: arms are {names} or a --bench-kv configuration's name "
                             "('keys METHOD bB + values METHOD bB'), knobs only on ours")
    return list(selected)


def make(name: str, layers: int):
    """`layers` empty caches of arm `name` (ours in one CacheGroup, as make_prompt_cache groups them)."""
    name = split(name)[0]
    import mlx_lm.models.cache as lm

    from ...accelerated import cache as vc
    if name == "fp16 KVCache":
        return [lm.KVCache() for _ in range(layers)]
    if name.startswith("mlx q"):
        bits = int(name[5])
        return [lm.QuantizedKVCache(group_size=64, bits=bits) for _ in range(layers)]
    kw = settings(name)
    method = kw.pop("method")
    caches = [vc.VeloxKVCache(method=method, layer=i, seed=1, **kw) for i in range(layers)]
    vc.CacheGroup(caches)
    return caches


def prefill(caches, t: int, log, seed: int = 0) -> None:
    """Each cache filled with `t` random float16 tokens (B, HKV, t, D), in chunks of 4096, then checked."""
    import mlx.core as mx
    chunk = 4096
    done = 0
    while done < t:
        n = min(chunk, t - done)
        for i, c in enumerate(caches):
            k = mx.random.normal((B, HKV, n, D), key=mx.random.key(seed + done + i)).astype(mx.float16)
            v = mx.random.normal((B, HKV, n, D), key=mx.random.key(seed + done + i + 7919)).astype(mx.float16)
            c.update_and_fetch(k, v)
        mx.eval([c.state for c in caches])
        done += n
    for c in caches:
        if hasattr(c, "check"):
            c.check()


def step(caches, q, k, v, gated: bool = True, gate=None):
    """One decode step through every layer: append a token, attend, feed the output on as the next query. Each
    layer's new key and value wait for the previous layer's output (gpu_clock.gate: one copy kernel per layer,
    the same in every arm), as a model's projections do; without it the GPU runs every layer's append at once,
    ahead of the attention chain. `gated` False: no gate (tools/dev's stand-in kernels, on which it cannot run);
    `gate`: another gate function of gpu_clock.gate's signature (tools/dev/gpu_timeline.py's chained stamps)."""
    from mlx_lm.models import base
    x = q
    # a batch's mask, made once per step as a model makes it (before the layers' updates): the left padding
    mask = caches[0].make_mask(1) if q.shape[0] > 1 else None
    for i, c in enumerate(caches):
        if i and gated:
            k, v = (gate or gpu_clock.gate)([k, v], x)
        kk, vv = c.update_and_fetch(k, v)
        x = base.scaled_dot_product_attention(x, kk, vv, cache=c, scale=D ** -0.5, mask=mask)
    return x


def step_inputs(n: int = 10, batch: int = B) -> list[tuple]:
    """`n` evaluated (query, key, value) inputs of one decode step, float16 (batch, HQ | HKV | HKV, 1, D), random
    (keys 3i + j): the rotating pool tools/dev's probes step with."""
    import mlx.core as mx
    pool = [tuple(mx.random.normal((batch, h, 1, D), key=mx.random.key(3 * i + j)).astype(mx.float16)
                  for j, h in enumerate((HQ, HKV, HKV))) for i in range(n)]
    mx.eval(pool)
    return pool


def nbytes(caches) -> int:
    return int(sum(c.nbytes for c in caches))


def model(n_layers: int, shape: dict | None = None):
    """A random float16 llama of `n_layers` layers, shaped like Llama-3-8B unless `shape` says otherwise."""
    import mlx.core as mx
    from mlx_lm.models import llama
    mx.random.seed(0)
    args = llama.ModelArgs(model_type="llama", num_hidden_layers=n_layers, rms_norm_eps=1e-5, rope_theta=500000.0,
                           tie_word_embeddings=False, **(shape or LLAMA3_8B))
    m = llama.Model(args)
    m.set_dtype(mx.float16)
    mx.eval(m.parameters())
    return m, args


class Tokens:
    """The tokenizer batch_generate asks for: no stop tokens (every sequence generates its max_tokens)."""
    eos_token_ids: list = []

    def decode(self, tokens):
        return ""


def batch_run(net, prompts: list[list[int]], max_tokens: int, caches=None):
    """mlx_lm.batch_generate of `prompts` (token lists) with prompt caches `caches` (one list per prompt; None:
    mlx-lm's own fp16 BatchKVCache), counting which attention ran. Returns (mlx-lm's BatchResponse, {path: calls}):
    "attend" for every call of ours, "decode step" or "general" for BatchVeloxKVCache's per-sequence attention (the
    decode step's kernels or another path); SharedBatchVeloxKVCache's one call per layer for the batch goes through
    the hooked dispatch (integration.attend) and counts the same way."""
    import functools

    from mlx_lm.generate import batch_generate

    from ...accelerated.cache import batch as vc_batch
    from ...accelerated.cache import integration as vc_hook
    real = {m: m.attend for m in (vc_batch, vc_hook)}
    seen: dict = {}

    def spy(*a, _real=real[vc_batch], **kw):
        path = "decode step" if len(a) > 1 and a[1].step is not None else "general"
        for k in ("attend", path):
            seen[k] = seen.get(k, 0) + 1
        return _real(*a, **kw)
    vc_batch.attend = spy
    vc_hook.attend = functools.partial(spy, _real=real[vc_hook])
    try:
        return batch_generate(net, Tokens(), prompts, max_tokens=max_tokens, prompt_caches=caches), seen
    finally:
        for m, f in real.items():
            m.attend = f
