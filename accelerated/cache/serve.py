"""Our caches inside mlx-lm's own entry points (`mlx_lm.generate`, `mlx_lm.server`, `batch_generate`, chat).

mlx-lm builds every cache it creates itself with `make_prompt_cache(model, max_kv_size)`, a name each of its
modules imports from mlx_lm.models.cache (generate.py: generate_step and BatchGenerator.insert; server.py: the
batchability probe and the sequential path; chat.py; cache_prompt.py). `install(**settings)` rebinds that name
in those modules to a function returning `accelerated.cache.make_prompt_cache(model, **settings)`, so those
entry points run with our caches and no change to their code: the server's batched path merges them
(accelerated/cache/batch.py), its LRUPromptCache deep-copies and trims them, and generate prints its usual
progress and tokens-per-second lines. `uninstall()` restores mlx-lm's function; `use(**settings)` is the
context-manager form.

A `max_kv_size` (mlx-lm's rotating cache for the whole model) is left to mlx-lm's own function: it asks for a
sliding window over every layer, which these caches do not implement.
"""
from __future__ import annotations

import contextlib
import importlib

import mlx_lm.models.cache as _mlx_cache

from .base import VeloxKVCache
from .prompt_cache import make_prompt_cache

# the modules of mlx-lm that bind make_prompt_cache by name
MODULES = ("mlx_lm.models.cache", "mlx_lm.generate", "mlx_lm.server", "mlx_lm.chat", "mlx_lm.cache_prompt")
ORIGINAL = getattr(_mlx_cache.make_prompt_cache, "__wrapped__", _mlx_cache.make_prompt_cache)
_CACHE_ARGS = ("method", "bits", "key_method", "value_method", "key_bits", "value_bits", "bits2", "group_size",
               "window", "seed", "checks", "exact_trim")
installed: dict | None = None      # the settings in force, None when not installed


def _check(settings: dict) -> dict:
    """Fail now, naming the argument, rather than at the first request."""
    unknown = set(settings) - set(_CACHE_ARGS) - {"fp16_layers", "attention"}
    if unknown:
        raise ValueError(f"settings: unknown argument(s) {sorted(unknown)}")
    VeloxKVCache(**{k: v for k, v in settings.items() if k in _CACHE_ARGS and v is not None})
    fp16 = settings.get("fp16_layers", (0, 0))
    if (not isinstance(fp16, (tuple, list)) or len(fp16) != 2
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in fp16)):
        raise ValueError(f"fp16_layers: expected (first_n, last_n) of non-negative ints, got {fp16!r}")
    return dict(settings)


def install(keep: list | None = None, **settings) -> None:
    """Make mlx-lm's entry points build our caches with `settings` (accelerated.cache.make_prompt_cache's
    keyword arguments, e.g. method="turboquant", bits=4, window=32, fp16_layers=(1, 1)). With `keep` (a
    list), every cache list made is appended to it (the command line reports their size at the end)."""
    global installed
    settings = _check(settings)

    def velox_make_prompt_cache(model, max_kv_size=None):
        if max_kv_size is not None:
            return ORIGINAL(model, max_kv_size)
        caches = make_prompt_cache(model, **settings)
        if keep is not None:
            keep.append(caches)
        return caches

    velox_make_prompt_cache.__wrapped__ = ORIGINAL
    for name in MODULES:
        mod = importlib.import_module(name)
        mod.make_prompt_cache = velox_make_prompt_cache
    installed = settings


def uninstall() -> None:
    global installed
    for name in MODULES:
        mod = importlib.import_module(name)
        mod.make_prompt_cache = ORIGINAL
    installed = None


@contextlib.contextmanager
def use(**settings):
    previous = installed
    install(**settings)
    try:
        yield
    finally:
        if previous is None:
            uninstall()
        else:
            install(**previous)
