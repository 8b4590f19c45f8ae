"""The mlx-lm KV cache over two compressed streams (spec/streaming.md; methods in spec/methods/).

`VeloxKVCache` follows the cache protocol of mlx-lm 0.32 (mlx_lm/models/cache.py, base.py) as the
models and helpers call it:

- `update_and_fetch(keys, values) -> (keys, values)`: append one chunk (B, H, t, d) to each stream and
  return *all* tokens dequantized, cast to the chunk's dtype (RNE), so unchanged models attend over them.
- `offset` (int attribute, read by RoPE), `size()`, `empty()`, `nbytes`, `is_trimmable()`, `trim(n)`.
- `make_mask(N, return_array=False, window_size=None)`: exactly KVCache's (mlx_lm's
  `create_attention_mask` with this cache's offset), so `base.create_attention_mask` gets the same masks.
- `state` (getter/setter) and the classmethod `from_state(state)`: `load_prompt_cache` rebuilds a cache as
  `globals()[class_name].from_state(state)` inside mlx_lm.models.cache (see accelerated/cache/__init__.py
  for why the classes are registered there). mlx-lm 0.32 has no separate meta_state; the `meta_state`
  property here is the JSON metadata string that is also the last element of `state`.

What is stored: the two streams' records only (role "k" and role "v", each with its own method, bits and
window). No dequantized copy is kept between calls; every fetch decodes the records again.

Deliberately absent: a `bits` attribute (mlx_lm.models.base.scaled_dot_product_attention switches to
mx.quantized_matmul for any cache that has one) and `to_quantized` (generate_step would replace the cache).
Do not add either.
"""
from __future__ import annotations

import json

import mlx.core as mx
from mlx_lm.models.cache import _BaseCache, create_attention_mask

import spec
from accelerated.stream import Stream

STATE_FORMAT = 1                       # version of the `state` layout below
_DTYPES = (mx.float16, mx.bfloat16, mx.float32)


def _role_params(role: str, method, bits, bits2, group_size, window, seed, layer, head_offset) -> spec.Params:
    """Params for one role, resolved now so a bad setting fails at construction, named per role."""
    prefix = "key_" if role == "k" else "value_"
    if method is None:
        raise ValueError(f"{prefix}method: a method is required (one of {', '.join(spec.METHODS)})")
    info = spec.method_info(method) if method in spec.METHODS else None
    if info is None:
        raise ValueError(f"{prefix}method: unknown method {method!r}; expected one of {', '.join(spec.METHODS)}")
    p = spec.Params(method, bits=bits,
                    bits2=bits2 if method == "turboquant_rvq" else None,
                    group_size=group_size if "group_sizes" in info else None,
                    window=window, seed=seed, layer=layer, head_offset=head_offset, role=role)
    try:
        return p.resolved()
    except ValueError as e:
        msg = str(e)
        if msg.startswith(("bits", "bits2", "group_size")):
            msg = prefix + msg  # key_bits / value_bits: the caller's own argument names
        raise ValueError(msg) from None


def _to_json(obj):
    """Metadata to JSON; numpy/mx scalars become Python numbers (seeds reach 2**64 - 1, so no mx ints)."""
    def default(o):
        if hasattr(o, "item"):
            return o.item()
        if isinstance(o, (tuple, set)):
            return list(o)
        raise TypeError(f"state metadata is not serializable: {o!r}")
    return json.dumps(obj, default=default, sort_keys=True)


class VeloxKVCache(_BaseCache):
    """KV cache storing compressed key and value records (any two methods of spec/methods/).

    Subclasses fix `method` (the default for both roles). Arguments:
      method, bits: defaults for both roles; key_method/value_method and key_bits/value_bits override.
      bits2 (turboquant_rvq), group_size (kivi): passed to the role(s) whose method takes them.
      window: spec `window` R, the newest tokens kept exactly in the input dtype (method default if None).
      seed, layer, head_offset: spec common parameters; per-head randomness comes from
        (seed, layer, head_offset + local head, role), so a cache over a shard of the KV heads stores the
        same bytes per head as the unsharded one.
    """

    method: str | None = None

    def __init__(self, bits: int | None = None, *, method: str | None = None,
                 key_method: str | None = None, value_method: str | None = None,
                 key_bits: int | None = None, value_bits: int | None = None,
                 bits2: int | None = None, group_size: int | None = None, window: int | None = None,
                 seed: int = 0, layer: int = 0, head_offset: int = 0):
        method = method or self.method
        common = dict(bits2=bits2, group_size=group_size, window=window, seed=seed, layer=layer,
                      head_offset=head_offset)
        self.key_params = _role_params("k", key_method or method, bits if key_bits is None else key_bits,
                                       **common)
        self.value_params = _role_params("v", value_method or method,
                                         bits if value_bits is None else value_bits, **common)
        self._k: Stream | None = None
        self._v: Stream | None = None
        self.offset = 0

    # ---- mlx-lm protocol ------------------------------------------------------------------------
    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        self._check_chunk(keys, values)
        # Both chunks are checked and encoded before either stream changes (Stream.prepare), so a
        # rejected value chunk leaves the keys untouched too; streams are created on the first update.
        k = self._k if self._k is not None else Stream(self.key_params)
        v = self._v if self._v is not None else Stream(self.value_params)
        pending_k = _prepare("keys", k, keys)
        pending_v = _prepare("values", v, values)
        k.commit(pending_k)
        v.commit(pending_v)
        self._k, self._v = k, v
        self.offset = self._k.tokens
        return self._k.dequantized().astype(keys.dtype), self._v.dequantized().astype(values.dtype)

    def size(self) -> int:
        return self.offset

    def empty(self) -> bool:
        # As KVCache: empty until the first update (a cache trimmed to 0 tokens is not "empty").
        return self._k is None

    @property
    def nbytes(self) -> int:
        if self._k is None:
            return 0
        return int(self._k.nbytes) + int(self._v.nbytes)

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n: must be a non-negative int, got {n!r}")
        n = min(self.offset, n)
        if n and self._k is not None:
            tk = self._k.trim(n)
            tv = self._v.trim(n)
            assert tk == tv == n, (tk, tv, n)
            self.offset = self._k.tokens
        return n

    def make_mask(self, *args, **kwargs):
        return create_attention_mask(*args, offset=self.offset, **kwargs)

    # ---- save / load ------------------------------------------------------------------------------
    @property
    def meta_state(self) -> str:
        """JSON: state format, class, offset, both roles' params and their streams' metadata."""
        meta = {"format": STATE_FORMAT, "class": type(self).__name__, "offset": self.offset,
                "key_params": self.key_params.to_dict(), "value_params": self.value_params.to_dict()}
        if self._k is not None:
            meta["k"] = self._k.state()[1]
            meta["v"] = self._v.state()[1]
        return _to_json(meta)

    @property
    def state(self):
        """(key record, value record, meta JSON): arrays as stored, so save/load restores the bytes.

        save_prompt_cache flattens this with mlx.utils.tree_flatten (dict fields become "i.0.codes" …)
        and stores strings as code points; an empty cache has None records (stored as "none").
        """
        if self._k is None:
            return None, None, self.meta_state
        return dict(self._k.state()[0]), dict(self._v.state()[0]), self.meta_state

    @state.setter
    def state(self, v):
        if not isinstance(v, (list, tuple)) or len(v) != 3 or not isinstance(v[2], str):
            raise ValueError("state: expected (key record, value record, meta JSON string)")
        k_arrays, v_arrays, meta_json = v
        meta = json.loads(meta_json)
        if meta.get("format") != STATE_FORMAT:
            raise ValueError(f"state: unsupported cache state format {meta.get('format')!r}")
        self.key_params = spec.Params(**meta["key_params"]).resolved()
        self.value_params = spec.Params(**meta["value_params"]).resolved()
        if (k_arrays is None) != (v_arrays is None) or (k_arrays is None) != ("k" not in meta):
            raise ValueError("state: key and value records must both be present or both absent")
        if k_arrays is None:
            self._k = self._v = None
            self.offset = 0
        else:
            self._k = Stream.from_state(dict(k_arrays), meta["k"])
            self._v = Stream.from_state(dict(v_arrays), meta["v"])
            if not self._k.tokens == self._v.tokens == meta["offset"]:
                raise ValueError("state: key/value token counts disagree with the saved offset")
            self.offset = self._k.tokens

    @classmethod
    def from_state(cls, state, meta_state=None):
        """Rebuild without __init__ (mlx-lm's `_BaseCache.from_state`); meta_state is accepted for
        older mlx-lm call sites and, if given, replaces the JSON in state."""
        obj = cls.__new__(cls)
        if meta_state is not None:
            state = (*tuple(state)[:2], meta_state)
        obj.state = state
        return obj

    # ---- helpers ------------------------------------------------------------------------------------
    def _check_chunk(self, keys, values) -> None:
        """Cache-level rules before touching any stream: both arrays, rank 4, same (B, H, t)."""
        for name, a in (("keys", keys), ("values", values)):
            if not isinstance(a, mx.array):
                raise ValueError(f"{name}: must be an mx.array, got {type(a).__name__}")
            if a.ndim != 4 or 0 in a.shape:
                raise ValueError(f"{name}: expected shape (B, H, t, d) with every axis > 0, got {a.shape}")
            if a.dtype not in _DTYPES:
                raise ValueError(f"{name}: dtype {a.dtype} is not supported; expected float16, "
                                 "bfloat16 or float32")
        if keys.shape[:3] != values.shape[:3]:
            raise ValueError(f"values: shape {values.shape} does not match keys {keys.shape} in (B, H, t)")

    def __repr__(self) -> str:
        k, v = self.key_params, self.value_params
        return (f"{type(self).__name__}(offset={self.offset}, keys={k.method}/{k.bits}b, "
                f"values={v.method}/{v.bits}b, window={k.window}/{v.window}, layer={k.layer}, "
                f"head_offset={k.head_offset})")


def _prepare(name: str, stream: Stream, x: mx.array):
    """stream.prepare(x), naming the caller's argument (keys/values) in front of the stream's message."""
    try:
        return stream.prepare(x)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
