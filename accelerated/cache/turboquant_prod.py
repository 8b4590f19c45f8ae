"""`TurboQuantProdKVCache`: mlx-lm KV cache, MSE stage at bits-1 plus a 1-bit QJL sketch (spec/methods/turboquant_prod.md).

Both roles use `turboquant_prod` unless key_method/value_method override one of them; everything else is in
accelerated/cache/base.py.
"""
from .base import VeloxKVCache


class TurboQuantProdKVCache(VeloxKVCache):
    method = "turboquant_prod"
