"""mlx-lm compatible KV caches storing VeloxQuant records (spec/streaming.md, spec/methods/).

Importing this package makes the one call that connects them to mlx-lm, `integration.install()`: it registers
the class names where `mlx_lm.models.cache.load_prompt_cache` looks them up (so import this package before
loading a file holding these caches), gives the caches mlx-lm's batching entry point `merge`, and hooks mlx-lm's
attention dispatch (accelerated/cache/integration.py says how and why).

Rooms: base.py (the single-sequence cache; kivi.py, rabitq.py, turboquant*.py name its per-method classes;
rotating.py the sliding-window one; classes.py lists them by name), batch.py and batch_shared.py (the batch caches,
over left_padded.py; restack.py moves a B-row cache's records), masks.py (a batch's remembered masks),
prompt_cache.py (the factory, make_prompt_cache), integration.py (mlx-lm), size.py, serve.py, warmup.py.
"""
from __future__ import annotations

from . import integration
from .base import CacheGroup, VeloxKVCache
from .batch import BatchVeloxKVCache
from .batch_shared import SharedBatchVeloxKVCache
from .integration import CACHE_CLASSES
from .kivi import KIVIKVCache
from .prompt_cache import CLASS_BY_METHOD, make_prompt_cache
from .rabitq import RaBitQKVCache
from .rotating import VeloxRotatingKVCache
from .turboquant import TurboQuantKVCache
from .turboquant_prod import TurboQuantProdKVCache
from .turboquant_rvq import TurboQuantRVQKVCache
from .warmup import warm_kernels

integration.install()

__all__ = ["CacheGroup", "VeloxKVCache", "BatchVeloxKVCache", "SharedBatchVeloxKVCache", "TurboQuantKVCache", "TurboQuantRVQKVCache", "TurboQuantProdKVCache",
           "KIVIKVCache", "RaBitQKVCache", "VeloxRotatingKVCache", "CLASS_BY_METHOD", "CACHE_CLASSES", "make_prompt_cache", "warm_kernels"]
