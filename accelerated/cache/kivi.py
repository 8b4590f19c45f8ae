"""`KIVIKVCache`: mlx-lm KV cache, KIVI group quantization (spec/methods/kivi.md).

Keys are grouped per channel over group_size tokens, values per token over group_size channels.

Both roles use `kivi` unless key_method/value_method override one of them; everything else is in
accelerated/cache/base.py.
"""
from .base import VeloxKVCache


class KIVIKVCache(VeloxKVCache):
    method = "kivi"
