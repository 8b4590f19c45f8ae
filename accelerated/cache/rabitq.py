"""`RaBitQKVCache`: mlx-lm KV cache, RaBitQ 1-bit codes with a correction factor (spec/methods/rabitq.md).

Both roles use `rabitq` unless key_method/value_method override one of them; everything else is in
accelerated/cache/base.py.
"""
from .base import VeloxKVCache


class RaBitQKVCache(VeloxKVCache):
    method = "rabitq"
