"""The single-sequence cache classes, by name: what a saved batch names for each of its sequences."""
from __future__ import annotations

def cache_class(name: str):
    """The cache class a saved batch names (accelerated.cache.CACHE_CLASSES)."""
    import veloxquant.accelerated.cache as vq
    return {cls.__name__: cls for cls in vq.CACHE_CLASSES}[name]
