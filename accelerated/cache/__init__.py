"""mlx-lm compatible KV caches storing VeloxQuant records (spec/streaming.md, spec/methods/).

Import this package before `mlx_lm.models.cache.load_prompt_cache` reads a file holding these caches:
load_prompt_cache rebuilds each cache as `globals()[class_name].from_state(state)`, i.e. it looks the saved
class name up in the namespace of the module mlx_lm.models.cache itself (CacheList's state setter does the
same). Classes defined elsewhere are invisible there, so importing this package registers each class in
that module under its own name. A name already bound there to a different class is an error (we never
shadow an mlx-lm class).
"""
from __future__ import annotations

import mlx_lm.models.cache as _mlx_lm_cache

from veloxquant.accelerated.cache import hook
from veloxquant.accelerated.cache.base import CacheGroup, VeloxKVCache
from veloxquant.accelerated.cache.batch import BatchVeloxKVCache
from veloxquant.accelerated.cache.batch_shared import SharedBatchVeloxKVCache
from veloxquant.accelerated.cache.kivi import KIVIKVCache
from veloxquant.accelerated.cache.prompt_cache import CLASS_BY_METHOD, make_prompt_cache
from veloxquant.accelerated.cache.rabitq import RaBitQKVCache
from veloxquant.accelerated.cache.rotating import VeloxRotatingKVCache
from veloxquant.accelerated.cache.turboquant import TurboQuantKVCache
from veloxquant.accelerated.cache.turboquant_prod import TurboQuantProdKVCache
from veloxquant.accelerated.cache.turboquant_rvq import TurboQuantRVQKVCache
from veloxquant.accelerated.cache.warmup import warm_kernels

_register(CACHE_CLASSES)
hook.install()

__all__ = ["CacheGroup", "VeloxKVCache", "BatchVeloxKVCache", "SharedBatchVeloxKVCache", "TurboQuantKVCache", "TurboQuantRVQKVCache", "TurboQuantProdKVCache",
           "KIVIKVCache", "RaBitQKVCache", "VeloxRotatingKVCache", "CLASS_BY_METHOD", "CACHE_CLASSES", "make_prompt_cache", "warm_kernels"]
