"""mlx-lm compatible KV caches storing VeloxQuant records (spec/streaming.md, spec/methods/).

Importing this package makes the one call that connects them to mlx-lm, `integration.install()`: it registers
the class names where `mlx_lm.models.cache.load_prompt_cache` looks them up (so import this package before
loading a file holding these caches), gives the caches mlx-lm's batching entry point `merge`, and hooks mlx-lm's
attention dispatch (accelerated/cache/integration.py says how and why).

Rooms: base.py (the single-sequence cache; kivi.py, rabitq.py, turboquant*.py name its per-method classes;
rotating.py the sliding-window one; classes.py lists them by name), batch.py and batch_shared.py (the batch caches,
over left_padded.py), masks.py (a batch's remembered masks), prompt_cache.py (the factory, make_prompt_cache),
integration.py (mlx-lm), size.py, serve.py, warmup.py.
"""
from __future__ import annotations

from veloxquant.accelerated.cache import integration
from veloxquant.accelerated.cache.base import CacheGroup, VeloxKVCache
from veloxquant.accelerated.cache.batch import BatchVeloxKVCache
from veloxquant.accelerated.cache.batch_shared import SharedBatchVeloxKVCache
from veloxquant.accelerated.cache.integration import CACHE_CLASSES
from veloxquant.accelerated.cache.kivi import KIVIKVCache
from veloxquant.accelerated.cache.prompt_cache import CLASS_BY_METHOD, make_prompt_cache
from veloxquant.accelerated.cache.rabitq import RaBitQKVCache
from veloxquant.accelerated.cache.rotating import VeloxRotatingKVCache
from veloxquant.accelerated.cache.turboquant import TurboQuantKVCache
from veloxquant.accelerated.cache.turboquant_prod import TurboQuantProdKVCache
from veloxquant.accelerated.cache.turboquant_rvq import TurboQuantRVQKVCache
from veloxquant.accelerated.cache.warmup import warm_kernels

integration.install()

__all__ = ["CacheGroup", "VeloxKVCache", "BatchVeloxKVCache", "SharedBatchVeloxKVCache", "TurboQuantKVCache", "TurboQuantRVQKVCache", "TurboQuantProdKVCache",
           "KIVIKVCache", "RaBitQKVCache", "VeloxRotatingKVCache", "CLASS_BY_METHOD", "CACHE_CLASSES", "make_prompt_cache", "warm_kernels"]
