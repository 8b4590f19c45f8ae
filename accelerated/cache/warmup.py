"""Kernel warm-up for one cache configuration: every kernel variant it can launch, compiled before a request.

A variant is one text plus its compiled-in constants (method pair, bits, head dim, dtypes, query rows per
threadgroup, causal mask, window, row starts, the append inside the launch, ...); split counts, contexts and
batch sizes are launch arguments, not constants. `warm` runs the configuration through the paths mlx-lm runs
(generate_step with prompts whose chunks cover every query-row class, each followed by a second turn on the
same cache, the longest by a turn of full chunks onto its encoded rows and every class again; speculative
decoding's verify chunks,
a continuous batch growing 1 -> 8 sequences and shrinking again) on a small model of the same attention
geometry, inside kernel_cache.CACHE.recording(): nothing is launched, the variants are collected; then the
missing ones are compiled, several at once, into the per-user store. A manifest per configuration lets a later
process see in one file read that it is warm (`is_warm`).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import time

import mlx.core as mx

from .. import layouts, stream
from .prompt_cache import make_prompt_cache
from ..kernels import attention as katt
from ..kernels import backend, kernel_cache

PROMPTS = (1, 2, 3, 5, 9, 17, 33, 65, 2051)      # chunk lengths of every query-row class, a full prefill chunk
DRAFTS = (1, 2, 3, 4, 5, 7, 8)                    # speculative verify chunks of 2..9 tokens
MAX_BATCH = 8


@dataclasses.dataclass(frozen=True)
class Geometry:
    """The attention shape a cache configuration is compiled for."""
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str = "float16"

    @classmethod
    def of(cls, config: dict, dtype: str | None = None) -> "Geometry":
        heads = config["num_attention_heads"]
        return cls(config["num_hidden_layers"], heads, config.get("num_key_value_heads", heads),
                   config.get("head_dim") or config["hidden_size"] // heads,
                   dtype or str(config.get("torch_dtype", "float16")).replace("torch.", ""))


def small_model(geom: Geometry, config: dict | None = None):
    """A random model of `config`'s family (llama if none) with the same layers and attention geometry and
    tiny everything else: its caches are the real model's, its forward costs next to nothing."""
    from mlx_lm.utils import _get_classes
    cfg = dict(config or {"model_type": "llama", "rms_norm_eps": 1e-5, "rope_theta": 500000.0})
    cfg.update(num_hidden_layers=geom.layers, num_attention_heads=geom.heads, num_key_value_heads=geom.kv_heads,
               head_dim=geom.head_dim, hidden_size=64, intermediate_size=64, vocab_size=256,
               tie_word_embeddings=True)
    cfg.pop("quantization", None)
    cfg.pop("quantization_config", None)
    model_cls, args_cls = _get_classes(cfg)
    model = model_cls(args_cls.from_dict(cfg))
    model.set_dtype(getattr(mx, geom.dtype))
    mx.eval(model.parameters())
    return model


def exercise(model, cache_kwargs: dict, batch: bool = True, speculative: bool = True) -> None:
    """Runs the configuration through mlx-lm's generation paths (see the module docstring)."""
    from mlx_lm.generate import BatchGenerator, generate_step, speculative_generate_step

    def prompt(n, seed=0):
        return mx.array([(7 * i + seed) % 200 + 1 for i in range(n)], dtype=mx.uint32)

    for n in PROMPTS:
        cache = make_prompt_cache(model, **cache_kwargs)
        # a second turn on the same cache too (chat, the server's prompt reuse): a prefill into a non-empty cache
        # (and, after the shortest first turn, a long one: its buffers grow with rows in them, so the in-place
        # commit copies the old rows too, one write more per field)
        turns = [n, n % 7 + 2 if n > 1 else PROMPTS[-1]]
        if n == PROMPTS[-1]:
            # a third turn of full prefill chunks onto a full chunk's encoded rows: with an exact window (R > 0,
            # the general path's store) only these grow a buffer holding encoded rows, and only these decode a
            # whole block of encoded tokens for a prefill's attention (PackedRecord.dequantized), whose rows reach
            # methods.SPECIALIZE_ROWS where the first chunk's R fewer tokens did not; long enough that the
            # buffers of per-group fields (kivi's keys) grow with rows in them too, in the same store
            turns.append(max(2 * n, _group_growth(cache)))
            # and every query-row class again onto encoded rows: after short first turns a window of R tokens
            # (kivi's default 128) may hold every token, so those chunks attended no encoded rows
            turns += [t for t in PROMPTS[:-1] if t > 1]
        for i, t in enumerate(turns):
            for _ in generate_step(prompt(t, i), model, prompt_cache=cache, max_tokens=2):
                pass
            if i == 0:
                _grow(cache)
    if speculative:
        for k in DRAFTS:
            cache = make_prompt_cache(model, **cache_kwargs) + make_prompt_cache(model, **cache_kwargs)
            for _ in speculative_generate_step(prompt(20), model, model, num_draft_tokens=k, prompt_cache=cache,
                                               max_tokens=k + 2):
                pass
    if batch:
        gen = BatchGenerator(model, max_tokens=4)
        try:
            # one sequence more per step (ragged prompts: left padding), each stopping two steps after the one
            # before it, so the batch grows 1 -> MAX_BATCH and then shrinks one sequence at a time (the filter's
            # gathers are MLX's own JIT kernels, compiled here too)
            # (every other prompt long enough that its prefill chunk takes the encode kernels' variant with the
            # code constants compiled in, tuning's specialize_rows)
            for i in range(MAX_BATCH):
                n = 3 + 5 * i if i % 2 == 0 else 600 + 37 * i
                gen.insert([[int(t) for t in prompt(n, i).tolist()]], max_tokens=[MAX_BATCH + 2 + i],
                           caches=[make_prompt_cache(model, **cache_kwargs)])
                gen.next_generated()
            while gen.next_generated():
                pass
        finally:
            gen.close()


def _grow(caches) -> None:
    """Each layer's decode step grows its buffers once (DecodeStep.grow: the copy launch a generation makes every
    ~256 tokens, one write list per configuration), so that launch is among the variants compiled."""
    for c in caches:
        step = getattr(c, "_fast", None)
        if step is not None:
            step.grow()


def _group_growth(caches) -> int:
    """Tokens of a turn that make a buffer of per-group fields (a method grouping tokens, kivi's keys) grow while
    it holds rows, on a cache that already holds a long turn's: its rows grow by one per G tokens, its buffer in
    steps of _Rows.step rows."""
    gs = [p.group_size for c in caches for p in (getattr(c, "key_params", None), getattr(c, "value_params", None))
          if p is not None and p.group_size and layouts.of(p).groups_tokens(p.role)]
    return stream._Rows.step * max(gs) + PROMPTS[-1] if gs else 0


def _mlx_gathers() -> None:
    """MLX's own gather kernels for the record dtypes, which a shrinking batch's filter uses (MLX compiles them
    once per machine into its PTX cache; otherwise the first shrinking batch waits for them)."""
    idx = mx.array([[1], [0]], dtype=mx.int32)
    out = []
    for dt in (mx.float32, mx.uint32, mx.float16, mx.bfloat16, mx.bool_, mx.int32):
        x = mx.zeros((2, 3), dtype=dt)
        out += [x[idx[:, 0]], mx.take(x, idx[:, 0], axis=0), mx.take_along_axis(x, idx, axis=0)]
    mx.eval(out)


@functools.lru_cache(maxsize=1)
def source_version() -> str:
    """A digest of the kernel sources and their launch code: a manifest is for one version of them."""
    h = hashlib.sha256(mx.__version__.encode())
    root = os.path.dirname(kernel_cache.__file__)
    for dirpath, _, names in sorted(os.walk(root)):
        for n in sorted(names):
            if n.endswith((".py", ".cuh", ".h", ".metal")):
                with open(os.path.join(dirpath, n), "rb") as f:
                    h.update(n.encode() + f.read())
    return h.hexdigest()[:16]


def _explicit(cache_kwargs: dict) -> dict:
    """The arguments that differ from make_prompt_cache's defaults (one key for one configuration, however
    it is spelled)."""
    import inspect
    defaults = {n: p.default for n, p in inspect.signature(make_prompt_cache).parameters.items()}
    return {k: tuple(v) if isinstance(v, list) else v for k, v in cache_kwargs.items()
            if v is not None and not (k in defaults and defaults[k] == (tuple(v) if isinstance(v, list) else v))}


def config_key(geom: Geometry, cache_kwargs: dict, config: dict | None = None, batch: bool = True,
               speculative: bool = True) -> str:
    cache_kwargs = _explicit(cache_kwargs)
    fam = (config or {}).get("model_type", "llama")
    text = json.dumps([source_version(), fam, dataclasses.asdict(geom), sorted(cache_kwargs.items()), batch,
                       speculative],
                      default=str, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def manifest_path(key: str) -> str:
    return os.path.join(kernel_cache.store_dir(), "manifests", key + ".json")


def is_warm(geom: Geometry, cache_kwargs: dict, config: dict | None = None, batch: bool = True,
            speculative: bool = True) -> int | None:
    """The number of variants if a manifest of this configuration covering these paths exists (its variants were
    compiled), else None."""
    for b, s in {(batch, speculative), (True, True)}:
        try:
            with open(manifest_path(config_key(geom, cache_kwargs, config, b, s))) as f:
                return len(json.load(f)["modules"])
        except (OSError, ValueError, KeyError):
            continue
    return None


@dataclasses.dataclass
class Report:
    variants: int
    compiled: int
    seconds: float
    store: str
    store_entries: int
    store_bytes: int
    failed: dict


def warm_kernels(model, batch: bool = True, speculative: bool = True, progress=None, **cache_kwargs) -> Report:
    """The one call for Python users: make sure every kernel variant `make_prompt_cache(model, **cache_kwargs)`
    can launch is compiled on this machine (CUDA; elsewhere nothing to do). `model`: an mlx-lm model (its
    `args`) or its config dict. Fast once warm (a manifest read)."""
    # (an mlx nn.Module is a dict itself: look for its args first)
    config = model if not hasattr(model, "args") else {k: v for k, v in vars(model.args).items()
                                                       if isinstance(v, (int, float, str, bool, type(None)))}
    geom = Geometry.of(config)
    n = is_warm(geom, cache_kwargs, config, batch, speculative)
    if backend.backend() != "cuda" or n is not None:
        return Report(n or 0, 0, 0.0, kernel_cache.store_dir(), *kernel_cache.usage(), {})
    return warm(geom, cache_kwargs, config, progress=progress, batch=batch, speculative=speculative)


def warm(geom: Geometry, cache_kwargs: dict, config: dict | None = None, progress=None, workers: int | None = None,
         batch: bool = True, speculative: bool = True) -> Report:
    """Collects and compiles every variant of the configuration; progress(done, total) while compiling."""
    t0 = time.perf_counter()
    cache = kernel_cache.CACHE
    if katt.backend.backend() == "cuda":
        katt._sm_count()           # the one real launch: the plans depend on it, and it must not read zeros
    model = small_model(geom, config)
    with cache.recording() as rec:
        exercise(model, cache_kwargs, batch=batch, speculative=speculative)
    if batch and katt.backend.backend() == "cuda":
        _mlx_gathers()
    before = cache.compiled
    cache.ensure_all(rec.values(), workers=workers, progress=progress)
    failed = {m: why for m, why in cache.failed.items() if m in rec}
    if not failed:
        key = config_key(geom, cache_kwargs, config, batch, speculative)
        kernel_cache._write(manifest_path(key), json.dumps({"modules": sorted(rec), "config": cache_kwargs,
                                                            "geometry": dataclasses.asdict(geom)},
                                                           default=str).encode())
    n, size = kernel_cache.usage()
    return Report(len(rec), cache.compiled - before, time.perf_counter() - t0, kernel_cache.store_dir(), n, size,
                  failed)
