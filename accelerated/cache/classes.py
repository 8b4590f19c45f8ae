"""The single-sequence cache classes, by name: what a saved batch names for each of its sequences."""
from __future__ import annotations

from .base import VeloxKVCache
from .kivi import KIVIKVCache
from .rabitq import RaBitQKVCache
from .rotating import VeloxRotatingKVCache
from .turboquant import TurboQuantKVCache
from .turboquant_prod import TurboQuantProdKVCache
from .turboquant_rvq import TurboQuantRVQKVCache

SINGLE_CLASSES = (VeloxKVCache, TurboQuantKVCache, TurboQuantRVQKVCache, TurboQuantProdKVCache, KIVIKVCache,
                  RaBitQKVCache, VeloxRotatingKVCache)


def cache_class(name: str):
    """The cache class a saved batch names (one of SINGLE_CLASSES)."""
    return {cls.__name__: cls for cls in SINGLE_CLASSES}[name]
