"""The caches `veloxquant quality --model trained` runs (tools/quality/trained_eval.py): our caches for one role
or both, mlx-lm's quantized cache in its dequantizing form, the float16 boundary wrapper, and the
bits-per-coordinate count of a configuration.
"""
from __future__ import annotations

KIVI_GROUP, AFFINE_GROUP = 32, 32  # one group_size for both (the caches take one); 32 is allowed for both


# ---- caches ---------------------------------------------------------------------------------------
class OneRoleCache:
    """Keys (or values) through a VeloxQuant cache, the other role exact through mlx-lm's KVCache.

    Built from the public API only: both caches see every chunk, and update_and_fetch returns the
    quantized role from the VeloxQuant cache and the exact role from the KVCache. (The VeloxQuant cache
    also encodes the unused role; only its output is discarded.)"""

    def __init__(self, quantized, role: str):
        from mlx_lm.models.cache import KVCache

        self.q, self.exact, self.role = quantized, KVCache(), role

    @property
    def offset(self):
        return self.exact.offset

    def update_and_fetch(self, keys, values):
        qk, qv = self.q.update_and_fetch(keys, values)
        ek, ev = self.exact.update_and_fetch(keys, values)
        return (qk, ev) if self.role == "k" else (ek, qv)

    def make_mask(self, *args, **kwargs):
        return self.exact.make_mask(*args, **kwargs)

    @property
    def state(self):  # generate_step evaluates every cache's state while prefilling
        return self.q.state, self.exact.state

    def empty(self):
        return self.exact.empty()


class _Wrapper:
    """A cache around another one (`inner`): everything but update_and_fetch is the inner cache's."""

    def __init__(self, inner):
        self.inner = inner

    @property
    def offset(self):
        return self.inner.offset

    def make_mask(self, *args, **kwargs):
        return self.inner.make_mask(*args, **kwargs)

    @property
    def state(self):  # generate_step evaluates every cache's state while prefilling
        return self.inner.state

    def empty(self):
        return self.inner.empty()


class DequantizedQuantizedKVCache(_Wrapper):
    """mlx-lm's QuantizedKVCache storage, handed to attention dequantized (mx.dequantize, model dtype).

    QuantizedKVCache itself has a `bits` attribute, so mlx-lm attends with mx.quantized_matmul, which
    on MLX's CPU backend is about 10x slower than the float path here; the stored values are the same
    and the two differ only in rounding inside the attention (--mlx-q-native measures the real path)."""

    def __init__(self, bits: int, group_size: int = 64):
        from mlx_lm.models.cache import QuantizedKVCache

        super().__init__(QuantizedKVCache(group_size=group_size, bits=bits))

    def update_and_fetch(self, keys, values):
        import mlx.core as mx

        qk, qv = self.inner.update_and_fetch(keys, values)
        g, b = self.inner.group_size, self.inner.bits
        return (mx.dequantize(*qk, group_size=g, bits=b).astype(keys.dtype),
                mx.dequantize(*qv, group_size=g, bits=b).astype(values.dtype))


class Float16KV(_Wrapper):
    """Any cache behind a float16 boundary: keys and values are cast to float16 on the way in (what a
    float16 model hands its cache) and the fetched ones back to the model's dtype.

    The sweep runs the model in float32 (float16 weights, exact in float32) because MLX's CPU backend
    multiplies float16 matrices ~30x slower than float32 ones; the caches still see and store float16."""

    def update_and_fetch(self, keys, values):
        import mlx.core as mx

        k, v = self.inner.update_and_fetch(keys.astype(mx.float16), values.astype(mx.float16))
        return k.astype(keys.dtype), v.astype(values.dtype)


def make_caches(model, cfg: dict, seed: int, mlx_q_native: bool = False) -> list:
    """The configuration's caches, each behind Float16KV when the model computes in float32 (mlx-lm's
    native QuantizedKVCache path excepted: the model must see its `bits`, so it gets the model dtype)."""
    import mlx.core as mx

    native = model.layers[0].self_attn.q_proj.weight.dtype == mx.float16 or (
        mlx_q_native and cfg["method"].startswith("mlx_q"))
    # behind Float16KV our caches return decoded keys/values (the wrapper casts arrays): the sweep measures
    # quality, identical within the tolerance tier to attention over the packed records
    caches = _make_caches(model, cfg, seed, mlx_q_native, attention="auto" if native else "dequantize")
    if native:
        return caches
    return [Float16KV(c) for c in caches]


def _make_caches(model, cfg: dict, seed: int, mlx_q_native: bool = False, attention: str = "auto") -> list:
    from mlx_lm.models.cache import KVCache, QuantizedKVCache

    from ...accelerated.cache import make_prompt_cache

    n = len(model.layers)
    if cfg["method"] == "fp16":
        return [KVCache() for _ in range(n)]
    if cfg["method"].startswith("mlx_q"):
        if mlx_q_native:
            return [QuantizedKVCache(group_size=64, bits=cfg["bits"]) for _ in range(n)]
        return [DequantizedQuantizedKVCache(cfg["bits"], 64) for _ in range(n)]
    kw = dict(method=cfg["method"], bits=cfg["bits"], window=cfg["window"], fp16_layers=tuple(cfg["fp16_layers"]),
              seed=seed)
    if cfg["bits2"] is not None:
        kw["bits2"] = cfg["bits2"]
    if cfg["method"] in ("kivi", "mlx_affine"):
        kw["group_size"] = KIVI_GROUP if cfg["method"] == "kivi" else AFFINE_GROUP
    if cfg["roles"] == "kv":
        return make_prompt_cache(model, attention=attention, **kw)
    # one role quantized: the wrapper mixes arrays of both caches, so ours returns decoded keys/values
    caches = make_prompt_cache(model, attention="dequantize", **kw)
    return [c if type(c) is KVCache else OneRoleCache(c, cfg["roles"]) for c in caches]


def cache_bits(caches, kv_width: int, tokens: int) -> tuple[float, float]:
    """(bits per coordinate over the whole cache, over the quantized coordinates only), measured.

    Whole cache: every layer's keys and values, fp16 layers and exact roles at 16 bits. Quantized only:
    VeloxQuant caches' `nbytes` (both of their streams; for one-role configs the discarded stream is of
    the same method and size) and QuantizedKVCache's arrays up to its offset."""
    from mlx_lm.models.cache import KVCache, QuantizedKVCache

    coords_layer = 2 * kv_width * tokens  # keys + values of one layer
    total_bits = q_bits = q_coords = 0.0
    for c in caches:
        c = c.inner if isinstance(c, Float16KV) else c
        if type(c) is KVCache:
            total_bits += 16 * coords_layer
            continue
        if isinstance(c, (QuantizedKVCache, DequantizedQuantizedKVCache)):
            c = getattr(c, "inner", c)
            keys, values = c.state[0], c.state[1]
            nb = sum(a[..., : c.offset, :].nbytes for a in (*keys, *values))
            q_bits += 8 * nb
            q_coords += coords_layer
            total_bits += 8 * nb
            continue
        inner = c.q if isinstance(c, OneRoleCache) else c
        q_bits += 8 * inner.nbytes
        q_coords += coords_layer
        total_bits += 8 * inner.nbytes / (2 if isinstance(c, OneRoleCache) else 1)
        if isinstance(c, OneRoleCache):
            total_bits += 16 * coords_layer / 2
    return total_bits / (coords_layer * len(caches)), (q_bits / q_coords if q_coords else 16.0)


# ---- evaluation data --------------------------------------------------------------------------------
