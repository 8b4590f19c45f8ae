"""`KIVIKVCache`: mlx-lm KV cache, KIVI group quantization (keys per channel, values per token; group_size) (spec/methods/kivi.md).

Both roles use `kivi` unless key_method/value_method override one of them; everything else is in
accelerated/cache/base.py.
"""
from accelerated.cache.base import VeloxKVCache


class KIVIKVCache(VeloxKVCache):
    method = "kivi"
