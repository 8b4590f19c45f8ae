"""`TurboQuantKVCache`: mlx-lm KV cache, MSE TurboQuant (norm kept apart) (spec/methods/turboquant.md).

Both roles use `turboquant` unless key_method/value_method override one of them; everything else is in
accelerated/cache/base.py.
"""
from .base import VeloxKVCache


class TurboQuantKVCache(VeloxKVCache):
    method = "turboquant"
