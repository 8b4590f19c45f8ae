"""`make_prompt_cache`: one compressed cache per attention layer of an mlx-lm model (spec/README.md
'Common parameters': the layer index of each cache is its position in the list)."""
from __future__ import annotations

from mlx_lm.models.cache import KVCache, RotatingKVCache

from ... import spec

from . import integration
from .base import DEFAULT_EXACT_TRIM, CacheGroup, VeloxKVCache
from .kivi import KIVIKVCache
from .rabitq import RaBitQKVCache
from .rotating import VeloxRotatingKVCache
from .turboquant import TurboQuantKVCache
from .turboquant_prod import TurboQuantProdKVCache
from .turboquant_rvq import TurboQuantRVQKVCache

CLASS_BY_METHOD = {
    "turboquant": TurboQuantKVCache,
    "turboquant_rvq": TurboQuantRVQKVCache,
    "turboquant_prod": TurboQuantProdKVCache,
    "kivi": KIVIKVCache,
    "rabitq": RaBitQKVCache,
}


def make_prompt_cache(model, method: str = "turboquant", bits: int | None = None, *,
                      key_method: str | None = None, value_method: str | None = None,
                      key_bits: int | None = None, value_bits: int | None = None,
                      bits2: int | None = None, group_size: int | None = None, window: int | None = None,
                      fp16_layers: tuple[int, int] = (0, 0), seed: int = 0, head_offset: int | None = None,
                      group=None, attention: str = "auto", checks: str = "deferred",
                      exact_trim: int = DEFAULT_EXACT_TRIM, compress_sliding: bool = True) -> list:
    """Caches for `model.layers`: compressed ones, except mlx-lm's plain KVCache for the first
    `fp16_layers[0]` and last `fp16_layers[1]` layers (kept in the model dtype).

    If the model has `make_cache()` (e.g. sliding-window or SSM layers), the layers for which it returns a
    plain KVCache get a compressed cache, and (with `compress_sliding`, the default) those for which it
    returns mlx-lm's RotatingKVCache(max_size, keep=0) get a VeloxRotatingKVCache of the same max_size
    (accelerated/cache/rotating.py); other caches (keep > 0, SSM arrays) keep their own semantics. With
    kivi, sliding layers are compressed only if all of them are (gemma3_text builds every sliding layer's
    mask from the first one, and a kivi sliding cache may hold up to G - 1 tokens more than mlx-lm's).
    Layers get the class of their key method when keys and values share one, else VeloxKVCache.

    Models sharded over KV heads (mlx-lm's `model.shard(group)` splits k_proj/v_proj "all-to-sharded", so
    rank r holds global KV heads [r * n, (r + 1) * n) with n = `layer.self_attn.n_kv_heads` after the
    shard): pass the same `mx.distributed.Group` as `group` and each compressed layer gets
    head_offset = group.rank() * layer.self_attn.n_kv_heads, so every rank stores, per head, the bytes of
    the unsharded cache. Call it after `model.shard(group)`. `head_offset` (default 0) sets one offset
    for all layers by hand; given together with `group` it must equal the derived offset of every layer.

    attention: "packed" (attention over the packed records, accelerated.attention), "dequantize" (every
    fetch returns the decoded cache) or "auto": packed for each layer whose attention goes through
    mlx-lm's base.scaled_dot_product_attention (llama, qwen2/3, mistral, gemma, gemma3 ...), dequantize
    for layers that compute attention themselves (e.g. gemma2's soft-capped logits).
    exact_trim: E of spec/streaming.md "Exact trims" (VeloxKVCache; default 0: no exact copies, so a compressed
    cache never holds more than float16 would). For speculative decoding pass the number of draft tokens
    (mlx-lm's num_draft_tokens; `veloxquant generate --draft-model` does): each trim of the rejected drafts
    then leaves every layer's record what appending only the accepted tokens stores, at a cost of up to E
    tokens per stream in the model dtype where the window R > 0 or with kivi (`nbytes_parts`, `nbytes_for`).
    checks: "deferred" or "eager" (VeloxKVCache); the returned caches form one CacheGroup, so a deferred
    fault rolls every layer back together.
    bits2 goes to the role(s) using turboquant_rvq, group_size to the role(s) using kivi or mlx_affine; either
    given when no role takes it is an error (it would be silently ignored). fp16_layers that leave no layer
    compressed is an error too.
    Errors name the argument the caller passed (`bits` or `key_bits`, `method` or `value_method`).
    """
    if attention not in ("auto", "packed", "dequantize"):
        raise ValueError(f"attention: expected 'auto', 'packed' or 'dequantize', got {attention!r}")
    if (not isinstance(fp16_layers, (tuple, list)) or len(fp16_layers) != 2
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in fp16_layers)):
        raise ValueError(f"fp16_layers: expected (first_n, last_n) of non-negative ints, got {fp16_layers!r}")
    n_layers = len(model.layers)
    _check_arguments(method, bits, key_method, value_method, key_bits, value_bits, bits2, group_size)
    if fp16_layers[0] + fp16_layers[1] >= n_layers > 0:
        raise ValueError(f"fp16_layers: {tuple(fp16_layers)!r} keeps all {n_layers} layers of the model in fp16, "
                         f"so nothing would be compressed; use mlx-lm's make_prompt_cache for that")
    base = model.make_cache() if hasattr(model, "make_cache") else [KVCache() for _ in range(n_layers)]
    km, vm = key_method or method, value_method or method
    cls = CLASS_BY_METHOD.get(km, VeloxKVCache) if km == vm else VeloxKVCache
    first_n, last_n = fp16_layers
    rank = _group_rank(group)
    boundary = [layer < first_n or layer >= len(base) - last_n for layer in range(len(base))]
    sliding = [type(c) is RotatingKVCache and c.keep == 0 and compress_sliding for c in base]
    if "kivi" in (km, vm) and any(s and b for s, b in zip(sliding, boundary)):
        sliding = [False] * len(base)
    caches = []
    for layer, c in enumerate(base):
        if not (type(c) is KVCache or sliding[layer]) or boundary[layer]:
            caches.append(c)
            continue
        offset = head_offset if rank is None else _shard_head_offset(model, layer, rank, head_offset)
        mode = attention
        if mode == "auto":
            attn = getattr(model.layers[layer], "self_attn", None)
            mode = "packed" if attn is not None and integration.uses_hooked_sdpa(attn) else "dequantize"
        kw = dict(method=km, key_method=km, value_method=vm, key_bits=key_bits, value_bits=value_bits,
                  bits2=bits2, group_size=group_size, window=window, seed=seed, layer=layer,
                  head_offset=0 if offset is None else offset, attention=mode, checks=checks,
                  exact_trim=exact_trim)
        if sliding[layer]:
            caches.append(VeloxRotatingKVCache(c.max_size, 0, bits, **kw))
        else:
            caches.append(cls(bits, **kw))
    CacheGroup(caches)
    return caches


def _check_arguments(method, bits, key_method, value_method, key_bits, value_bits, bits2, group_size) -> None:
    """Each role's method and bits checked under the name of the argument the caller gave (VeloxKVCache
    would name key_method / key_bits for a plain `method` / `bits`)."""
    for name, m in (("method", method), ("key_method", key_method), ("value_method", value_method)):
        if m is not None and m not in spec.METHODS:
            raise ValueError(f"{name}: unknown method {m!r}; expected one of {', '.join(spec.METHODS)}")
    km, vm = key_method or method, value_method or method
    for role_bits, role_name, m in ((key_bits, "key_bits", km), (value_bits, "value_bits", vm)):
        if m is None:
            continue
        b, name = (role_bits, role_name) if role_bits is not None else (bits, "bits")
        try:
            spec.Params(m, bits=b).resolved()
        except ValueError as e:
            if str(e).startswith("bits"):
                raise ValueError(f"{name}: {str(e).split(':', 1)[1].strip()} (method {m})") from None
            raise
    used = {km, vm}
    if bits2 is not None and "turboquant_rvq" not in used:
        raise ValueError(f"bits2: only turboquant_rvq takes a second-stage width; this cache uses "
                         f"{' and '.join(sorted(used))}")
    takes_groups = {m for m in used if m is not None and "group_sizes" in spec.method_info(m)}
    if group_size is not None and not takes_groups:
        raise ValueError(f"group_size: not taken by {' and '.join(sorted(used))} (only "
                         f"{', '.join(m for m in spec.METHODS if 'group_sizes' in spec.method_info(m))} take one)")


def _group_rank(group) -> int | None:
    """This process's rank in `group` (None without a group); anything with rank()/size() is accepted."""
    if group is None:
        return None
    try:
        rank, size = group.rank(), group.size()
    except (AttributeError, TypeError):
        raise ValueError(f"group: expected an mx.distributed.Group (rank() and size()), got "
                         f"{type(group).__name__}") from None
    if (isinstance(rank, bool) or isinstance(size, bool) or not isinstance(rank, int)
            or not isinstance(size, int) or not 0 <= rank < size):
        raise ValueError(f"group: rank() {rank!r} is not in [0, size() = {size!r})")
    return rank


def _shard_head_offset(model, layer: int, rank: int, head_offset: int | None) -> int:
    """Global index of this rank's first KV head in `layer` (the "all-to-sharded" split of k_proj)."""
    n_local = getattr(getattr(model.layers[layer], "self_attn", None), "n_kv_heads", None)
    if isinstance(n_local, bool) or not isinstance(n_local, int) or n_local <= 0:
        raise ValueError(f"group: layer {layer} has no positive int self_attn.n_kv_heads to derive its "
                         f"head offset from (got {n_local!r}); pass head_offset instead of group")
    derived = rank * n_local
    if head_offset is not None and head_offset != derived:
        raise ValueError(f"head_offset: {head_offset!r} disagrees with group rank {rank} x layer {layer}'s "
                         f"{n_local} local KV heads = {derived}; give one of head_offset and group")
    return derived
