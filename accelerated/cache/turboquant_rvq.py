"""`TurboQuantRVQKVCache`: mlx-lm KV cache, two-stage residual TurboQuant (bits2 for stage 2) (spec/methods/turboquant_rvq.md).

Both roles use `turboquant_rvq` unless key_method/value_method override one of them; everything else is in
accelerated/cache/base.py.
"""
from .base import VeloxKVCache


class TurboQuantRVQKVCache(VeloxKVCache):
    method = "turboquant_rvq"
