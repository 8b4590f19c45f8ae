"""The single-sequence cache classes, by name: what a saved batch names for each of its sequences."""
from __future__ import annotations

from veloxquant.accelerated.cache.base import VeloxKVCache
from veloxquant.accelerated.cache.kivi import KIVIKVCache
from veloxquant.accelerated.cache.rabitq import RaBitQKVCache
from veloxquant.accelerated.cache.rotating import VeloxRotatingKVCache
from veloxquant.accelerated.cache.turboquant import TurboQuantKVCache
from veloxquant.accelerated.cache.turboquant_prod import TurboQuantProdKVCache
from veloxquant.accelerated.cache.turboquant_rvq import TurboQuantRVQKVCache

SINGLE_CLASSES = (VeloxKVCache, TurboQuantKVCache, TurboQuantRVQKVCache, TurboQuantProdKVCache, KIVIKVCache,
                  RaBitQKVCache, VeloxRotatingKVCache)


def cache_class(name: str):
    """The cache class a saved batch names (one of SINGLE_CLASSES)."""
    return {cls.__name__: cls for cls in SINGLE_CLASSES}[name]
