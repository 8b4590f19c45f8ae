"""`make_prompt_cache`: one compressed cache per attention layer of an mlx-lm model (spec/README.md
'Common parameters': the layer index of each cache is its position in the list)."""
from __future__ import annotations

from mlx_lm.models.cache import KVCache

from accelerated.cache.base import VeloxKVCache
from accelerated.cache.kivi import KIVIKVCache
from accelerated.cache.rabitq import RaBitQKVCache
from accelerated.cache.turboquant import TurboQuantKVCache
from accelerated.cache.turboquant_prod import TurboQuantProdKVCache
from accelerated.cache.turboquant_rvq import TurboQuantRVQKVCache

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
                      fp16_layers: tuple[int, int] = (0, 0), seed: int = 0, head_offset: int = 0) -> list:
    """Caches for `model.layers`: compressed ones, except mlx-lm's plain KVCache for the first
    `fp16_layers[0]` and last `fp16_layers[1]` layers (kept in the model dtype).

    If the model has `make_cache()` (e.g. sliding-window or SSM layers), only the layers for which it
    returns a plain KVCache are replaced; rotating/array caches keep their own semantics.
    Layers get the class of their key method when keys and values share one, else VeloxKVCache.
    """
    if (not isinstance(fp16_layers, (tuple, list)) or len(fp16_layers) != 2
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in fp16_layers)):
        raise ValueError(f"fp16_layers: expected (first_n, last_n) of non-negative ints, got {fp16_layers!r}")
    n_layers = len(model.layers)
    base = model.make_cache() if hasattr(model, "make_cache") else [KVCache() for _ in range(n_layers)]
    km, vm = key_method or method, value_method or method
    cls = CLASS_BY_METHOD.get(km, VeloxKVCache) if km == vm else VeloxKVCache
    first_n, last_n = fp16_layers
    caches = []
    for layer, c in enumerate(base):
        if type(c) is not KVCache or layer < first_n or layer >= len(base) - last_n:
            caches.append(c)
            continue
        caches.append(cls(bits, method=km, key_method=km, value_method=vm, key_bits=key_bits,
                          value_bits=value_bits, bits2=bits2, group_size=group_size, window=window,
                          seed=seed, layer=layer, head_offset=head_offset))
    return caches
