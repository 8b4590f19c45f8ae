"""How mlx-lm sees these caches; `install()` (run once by importing accelerated.cache) sets all of it up.

1. Class names. `mlx_lm.models.cache.load_prompt_cache` rebuilds each cache as
   `globals()[class_name].from_state(state)`, i.e. it looks the saved class name up in the namespace of the module
   mlx_lm.models.cache itself (CacheList's state setter does the same). Classes defined elsewhere are invisible
   there, so install registers each of CACHE_CLASSES in that module under its own name. A name already bound there
   to a different class is an error (we never shadow an mlx-lm class).
2. Batching. mlx-lm's BatchGenerator calls `caches[0].merge(caches)`; install gives the single-sequence classes
   (VeloxKVCache and its subclasses) `merge`, which builds one of the batch caches (batch.py, batch_shared.py).
   It is attached here rather than defined in base.py because the batch caches are built over the single one.
3. Attention dispatch (spec/attention.md; models unchanged), below.

mlx_lm.models.base.scaled_dot_product_attention calls the module-level
`quantized_scaled_dot_product_attention(queries, keys, values, scale=, mask=, group_size=, bits=)` for any
cache with a `bits` attribute (our caches have one in packed mode), looking the name up in base's globals
at call time. `install()` rebinds that name to `dispatch`, which sends PackedKV arguments to
accelerated.attention.attend and everything else to mlx-lm's own function, unchanged. Models whose
attention goes through base.scaled_dot_product_attention (llama, qwen2, qwen3, mistral, gemma, gemma3, ...)
thus attend over the packed records with no change to their code.
"""
from __future__ import annotations

import mlx.core as mx
import mlx_lm.models.base as _base
import mlx_lm.models.cache as _lm_cache

from ..attention import PackedKV, StepKV, attend
from ..ops.attention import MAX_PACKED_QUERIES
from . import batch_shared
from .base import VeloxKVCache
from .batch import BatchPackedKV, BatchVeloxKVCache, attend_batch
from .batch_shared import SharedBatchVeloxKVCache
from .classes import SINGLE_CLASSES
from .masks import remember_batch_kv_mask, row_starts

_ORIGINAL = getattr(_base.quantized_scaled_dot_product_attention, "__wrapped__",
                    _base.quantized_scaled_dot_product_attention)


def dispatch(queries, q_keys, q_values, scale, mask, group_size: int = 64, bits: int = 8):
    st = q_keys.step if type(q_keys) is StepKV else None
    # (a decode step's own launch, attend's first path without its checks: one call less per layer)
    if st is not None and mask is None and st is q_values.step and queries.shape[2] <= MAX_PACKED_QUERIES:
        out = st.attend(queries, q_keys, q_values, scale, None)
        if out is not None:
            return out
    if isinstance(q_keys, PackedKV):
        if type(mask) is mx.array:          # a left-padded batch's mask (batch_shared.make_mask): its row starts
            mask = row_starts(mask)
        return attend(queries, q_keys, q_values, scale, mask)
    if isinstance(q_keys, BatchPackedKV):        # batched caches (accelerated/cache/batch.py)
        return attend_batch(queries, q_keys, q_values, scale, mask)
    return _ORIGINAL(queries, q_keys, q_values, scale=scale, mask=mask, group_size=group_size, bits=bits)


dispatch.__wrapped__ = _ORIGINAL


_BATCH_MASK = getattr(_lm_cache.BatchKVCache.make_mask, "__wrapped__", _lm_cache.BatchKVCache.make_mask)


def _batch_kv_make_mask(self, N: int, return_array: bool = False, **kwargs):
    """mlx-lm's BatchKVCache.make_mask, its mask also remembered as the RowStarts it stands for (an fp16 first layer
    of a batch makes the mask every layer gets: masks.remember_batch_kv_mask)."""
    mask = _BATCH_MASK(self, N, return_array=return_array, **kwargs)
    remember_batch_kv_mask(self, mask, N, kwargs.get("window_size"))
    return mask


_batch_kv_make_mask.__wrapped__ = _BATCH_MASK


def install() -> None:
    """Registers the class names, gives the single-sequence caches `merge` and hooks the attention dispatch (see
    the module). Idempotent; mlx-lm's behaviour for its own caches is unchanged (BatchKVCache.make_mask returns
    the same mask; we only note which row starts it stands for)."""
    _register(CACHE_CLASSES)
    VeloxKVCache.merge = classmethod(merge)
    _base.quantized_scaled_dot_product_attention = dispatch
    _lm_cache.BatchKVCache.make_mask = _batch_kv_make_mask


def uses_hooked_sdpa(attn_module) -> bool:
    """True if an attention layer's class computes attention with mlx-lm's base.scaled_dot_product_attention
    (the name its module imported is that function) and has no attention sinks."""
    import sys
    mod = sys.modules.get(type(attn_module).__module__)
    return (getattr(mod, "scaled_dot_product_attention", None) is _base.scaled_dot_product_attention
            and getattr(attn_module, "sinks", None) is None)


def merge(cls, caches):
    """mlx-lm's batching entry point (BatchGenerator): one SharedBatchVeloxKVCache (one B-row cache, one
    launch per layer: accelerated/cache/batch_shared.py) where the methods allow it, else a BatchVeloxKVCache
    (a cache per sequence: accelerated/cache/batch.py); records moved as they are."""
    caches = list(caches)
    if batch_shared.eligible(caches):
        return batch_shared.SharedBatchVeloxKVCache.merge(caches)
    return BatchVeloxKVCache.merge(caches)


CACHE_CLASSES = (*SINGLE_CLASSES, BatchVeloxKVCache, SharedBatchVeloxKVCache)


def _register(classes) -> None:
    for cls in classes:
        bound = getattr(_lm_cache, cls.__name__, None)
        # Same module and name: this package imported again (e.g. importlib.reload); rebind.
        if bound is not None and bound is not cls and bound.__module__ != cls.__module__:
            raise ImportError(f"mlx_lm.models.cache already defines {cls.__name__} ({bound.__module__})")
        setattr(_lm_cache, cls.__name__, cls)
