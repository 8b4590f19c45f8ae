"""The mlx-lm KV cache over two compressed streams (spec/streaming.md; methods in spec/methods/).

`VeloxKVCache` follows the cache protocol of mlx-lm 0.32 (mlx_lm/models/cache.py, base.py) as the
models and helpers call it:

- `update_and_fetch(keys, values) -> (keys, values)`: append one chunk (B, H, t, d) to each stream. In
  packed mode (`attention="packed"`, what make_prompt_cache picks for models whose attention goes through
  mlx_lm.models.base.scaled_dot_product_attention) it returns two `accelerated.attention.PackedKV` views
  of the records, and mlx-lm's attention dispatch (hooked in accelerated/cache/integration.py) attends over the
  packed records without decoding them. In dequantize mode it returns *all* tokens decoded, cast to the
  chunk's dtype (RNE), for models that compute attention themselves.
- `offset` (int attribute, read by RoPE), `size()`, `empty()`, `nbytes`, `is_trimmable()`, `trim(n)`; beside
  them `nbytes_parts` and `nbytes_for(tokens)` (what the bytes hold, what a length costs).
- `make_mask(N, return_array=False, window_size=None)`: exactly KVCache's (mlx_lm's
  `create_attention_mask` with this cache's offset), so `base.create_attention_mask` gets the same masks.
- `merge(caches)` (BatchGenerator's batching entry point) is given to the class by
  accelerated/cache/integration.py's `install()`: the batch caches it builds are made over this one.
- `state` (getter/setter) and the classmethod `from_state(state)`: `load_prompt_cache` rebuilds a cache as
  `globals()[class_name].from_state(state)` inside mlx_lm.models.cache (see accelerated/cache/integration.py
  for why the classes are registered there). mlx-lm 0.32 has no separate meta_state; the `meta_state`
  property here is the JSON metadata string that is also the last element of `state`.

What is stored: the two streams' records only (role "k" and role "v", each with its own method, bits and
window). No dequantized copy is kept between calls.

`bits` / `group_size` exist only in packed mode: mlx_lm.models.base.scaled_dot_product_attention sends any
cache that has `bits` to `quantized_scaled_dot_product_attention`, which the hook routes to
accelerated.attention for PackedKV arguments (and to mlx-lm's own function otherwise). `to_quantized` is
deliberately absent (generate_step would replace the cache).

Checks (spec/streaming.md, 'Deferred rejection'): with `checks="deferred"` (the default) the data-dependent
checks of a chunk (NaN/Inf, norm overflow, KIVI float16 overflow) are evaluated one append later, at a point
where generation has synchronized anyway, so the decode step has no host sync; a failing chunk raises its
ValueError then, and the cache (and every cache of the same make_prompt_cache list) is rolled back to its
state before that chunk. `check()` (also run by `trim`, `state` and save) settles all pending chunks now.
`checks="eager"` checks each chunk before it is stored (one host sync per append).
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import json

import mlx.core as mx
from mlx_lm.models.cache import _BaseCache, create_attention_mask

from ... import spec
from ..attention import PackedKV
from ..kernels import backend as kernel_backend
from ..kernels.commit import commit as store_rows
from ..kernels.decode_step import DecodeStep
from ..kernels.faults import flags as fault_flags
from ..ops import numerics
from ..kernels.append import applies as fused_applies, messages as fused_messages
from ..kernels.methods import NONFINITE, RULES
from ..in_place import append_in_place
from ..stream import Stream
from . import size as cache_size
from .roles import role_params

STATE_FORMAT = 1                       # version of the `state` layout below
_DTYPES = (mx.float16, mx.bfloat16, mx.float32)
ATTENTION_MODES = ("packed", "dequantize")
CHECK_MODES = ("deferred", "eager")
# streaming.md "Exact trims": the caches' default E, the spec's. Exact copies cost E tokens per stream in the
# input dtype where R > 0 (and for kivi), which makes a short windowed cache larger than float16; a speculative
# decoder asks for them (exact_trim = its number of draft tokens; `veloxquant generate --draft-model` does).
DEFAULT_EXACT_TRIM = 0
# Appends whose snapshots are kept: a fault is found one append after its chunk (in its own layer) or two
# (when a later layer of the same forward finds it), so three snapshots cover every rollback target.
_KEPT_CHUNKS = 3


@dataclasses.dataclass(slots=True)
class _Chunk:
    """One append: its lazy fault flags (None: no data-dependent check), their messages, and the state
    before it (key mark, value mark, offset). Slotted: a decode step makes one per layer."""
    index: int
    flags: mx.array | None
    messages: list
    before: tuple
    checked: bool = False
    reader: object = None       # flags -> one hit list per message (None: flags.tolist())


class CacheGroup:
    """The caches of one prompt cache (make_prompt_cache): a fault found in any layer rolls every layer back
    to its state before the faulty chunk, so the layers stay consistent. Foreign caches (mlx-lm's own,
    e.g. fp16 boundary layers) are trimmed back to the same offset."""

    def __init__(self, caches):
        self.caches = list(caches)
        for c in self.caches:
            if isinstance(c, VeloxKVCache):
                c._group = self

    def rollback(self, index: int, offset: int) -> None:
        for c in self.caches:
            if isinstance(c, VeloxKVCache):
                c._rollback_to(index)
            elif hasattr(c, "trim") and getattr(c, "offset", 0) > offset and c.is_trimmable():
                c.trim(c.offset - offset)


@functools.lru_cache(maxsize=256)
def _one_launch(kp: spec.Params, vp: spec.Params) -> bool:
    """Whether both roles' parameters let an append take kernels/append.py's one launch (each role's window moved
    on its own, in_place.InPlace; different methods or windows in one layer too: kernels/append.py MIXED): for the
    others the in-place attempt and its rollback marks are skipped at every step, since they would find it does not
    apply."""
    return fused_applies(kp) and fused_applies(vp)


@functools.lru_cache(maxsize=None)
def _fused_check_messages(key_method: str, value_method: str) -> tuple:
    """The messages of kernels/append.py's four checks, in its token's order (made once per method pair)."""
    return (f"keys: {NONFINITE}", f"keys: {RULES[key_method]}", f"values: {NONFINITE}",
            f"values: {RULES[value_method]}")


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
      exact_trim: spec `exact_trim` E (default 0): a trim of up to E tokens after appends leaves the record
        the one-shot encode of the surviving tokens (speculative decoding: E = the number of draft tokens;
        spec/streaming.md 'What a trim restores'); costs up to E tokens per stream in the input dtype where
        R > 0 (kivi: E rounded up to whole groups), nothing for per-token methods with R = 0.
        `nbytes_parts` and `nbytes_for` state these costs.
      seed, layer, head_offset: spec common parameters; per-head randomness comes from
        (seed, layer, head_offset + local head, role), so a cache over a shard of the KV heads stores the
        same bytes per head as the unsharded one.
    """

    method: str | None = None

    def __init__(self, bits: int | None = None, *, method: str | None = None,
                 key_method: str | None = None, value_method: str | None = None,
                 key_bits: int | None = None, value_bits: int | None = None,
                 bits2: int | None = None, group_size: int | None = None, window: int | None = None,
                 seed: int = 0, layer: int = 0, head_offset: int = 0, attention: str = "packed",
                 checks: str = "deferred", exact_trim: int = DEFAULT_EXACT_TRIM):
        if attention not in ATTENTION_MODES:
            raise ValueError(f"attention: expected one of {ATTENTION_MODES}, got {attention!r}")
        if checks not in CHECK_MODES:
            raise ValueError(f"checks: expected one of {CHECK_MODES}, got {checks!r}")
        method = method or self.method
        common = dict(bits2=bits2, group_size=group_size, window=window, seed=seed, layer=layer,
                      head_offset=head_offset, exact_trim=exact_trim)
        self.key_params = role_params("k", key_method or method, bits if key_bits is None else key_bits,
                                      **common)
        self.value_params = role_params("v", value_method or method,
                                        bits if value_bits is None else value_bits, **common)
        self.attention = attention
        self.checks = checks
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._k: Stream | None = None
        self._v: Stream | None = None
        self.offset = 0
        self._chunks: collections.deque = collections.deque(maxlen=_KEPT_CHUNKS)
        self._appends = 0
        self._token: mx.array | None = None     # the last in-place store's token (kernels/commit.py)
        self._in_place = None                   # the decode step's remembered checks (in_place.InPlace)
        self._fast = None                       # ... and its launches (decode_step.DecodeStep)
        self._group: CacheGroup | None = None

    # ---- mlx-lm protocol ------------------------------------------------------------------------
    def update_and_fetch(self, keys: mx.array, values: mx.array):
        fast = self._fast
        if fast is not None and fast.holds(keys, values):      # the decode step, per-shape work done once
            out = fast.step(keys, values)
            if out is not None:
                return out
        self._flush_step()
        # Chunks before the previous one were evaluated with the previous step's output: checking
        # them costs no wait (mlx-lm's generate_step evaluates step n-1 while it builds step n).
        self._settle(keep=1)
        plan = self._in_place
        # a chunk like the last one, onto streams as the last in-place append left them, passed these checks
        if plan is None or type(keys) is not mx.array or type(values) is not mx.array \
                or not plan.holds(self._k, self._v, keys, values):
            self._check_chunk(keys, values)
        # Both chunks are checked and encoded before either stream changes (Stream.prepare), so a
        # rejected value chunk leaves the keys untouched too; streams are created on the first update.
        if self._k is not None and self.checks == "deferred" and self.attention == "packed" \
                and _one_launch(self.key_params, self.value_params) and kernel_backend.available()[0]:
            k, v = self._k, self._v
            before = (k.mark(), v.mark(), self.offset)
            token, self._in_place = append_in_place(k, v, keys, values, self._token, plan)
            if token is not None:      # one launch: encode both, store in place, checks (kernels/append.py)
                if self._in_place is not plan:    # a new plan: the next steps take the decode-step path
                    msgs = _fused_check_messages(self.key_params.method, self.value_params.method)
                    record = functools.partial(_Chunk, messages=msgs, reader=fused_messages)
                    self._fast = (DecodeStep(self, self._in_place, keys, values, record)
                                  if DecodeStep.applies(self._in_place) else None)
                self._token = token
                self.offset += keys.shape[2]    # tokens seen (a sliding-window cache holds fewer)
                self._appends += 1
                msgs = _fused_check_messages(self.key_params.method, self.value_params.method)
                self._chunks.append(_Chunk(self._appends, token, msgs, before, reader=fused_messages))
                return PackedKV(k.packed(), token), PackedKV(v.packed(), token)
        k = self._k if self._k is not None else Stream(self.key_params)
        v = self._v if self._v is not None else Stream(self.value_params)
        before = (None if self._k is None else self._k.mark(), None if self._v is None else self._v.mark(),
                  self.offset)
        if self.checks == "eager":
            pending_k, pending_v = _prepare("keys", k, keys), _prepare("values", v, values)
            faults = []
        else:
            with numerics.deferred_checks() as faults:
                pending_k = _prepare("keys", k, keys, faults)
                pending_v = _prepare("values", v, values, faults)
        faults = [f for f in faults if f[1].size]
        if self.checks == "deferred" and self.attention == "packed" and kernel_backend.available()[0]:
            # GPU: both streams' new rows and the checks in one launch, stored in place (kernels/commit.py)
            writes: list = []
            k.commit(pending_k, writes)
            v.commit(pending_v, writes)
            writes = [(dst, src) for dst, src in writes if src.size]
            flags = store_rows(writes, faults, self._token)
            self._token = flags
            k.stored_by(flags)
            v.stored_by(flags)
        else:
            k.commit(pending_k)
            v.commit(pending_v)
            flags = fault_flags(faults) if faults else None     # one launch on a GPU, no sync
        self._k, self._v = k, v
        self.offset += keys.shape[2]      # tokens seen; the streams hold offset - evicted of them (rotating.py)
        self._appends += 1
        self._chunks.append(_Chunk(self._appends, flags if faults else None, [m for _, _, m in faults], before))
        if self.attention == "packed":
            return PackedKV(self._k.packed(), flags), PackedKV(self._v.packed(), flags)
        # decoded block by block into the chunk's dtype (PackedRecord.dequantized): no float32 copy of the
        # whole record; a prefill chunk (t > 1) syncs per block so that only one block's temporaries exist
        eager = keys.shape[2] > 1
        kd = self._k.packed().dequantized(keys.dtype, eager)
        vd = self._v.packed().dequantized(values.dtype, eager)
        if flags is not None:
            kd, vd = mx.depends([kd, vd], [flags])
        return kd, vd

    # Present only in packed mode: mlx-lm's attention dispatch tests hasattr(cache, "bits").
    @property
    def bits(self) -> int:
        if self.attention != "packed":
            raise AttributeError("bits")
        return self.key_params.bits

    @property
    def group_size(self) -> int:
        if self.attention != "packed":
            raise AttributeError("group_size")
        return self.key_params.group_size or 0

    # ---- deferred checks ----------------------------------------------------------------------------
    def check(self) -> None:
        """Evaluate every pending chunk's checks now (a host sync); a failing chunk raises its ValueError
        after rolling the cache (and its CacheGroup) back to the state before that chunk."""
        self._settle(keep=0)

    def _flush_step(self) -> None:
        """Launch on its own an append the decode step left for its attention launch (decode_step.DecodeStep
        .pending: between update_and_fetch and the attention): every read or change of the cache's state after
        this sees the chunk stored."""
        f = self.__dict__.get("_fast")
        if f is not None and f.pending is not None:
            f.flush()

    def __deepcopy__(self, memo):
        self._flush_step()
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__dict__.update({k: copy.deepcopy(v, memo) for k, v in self.__dict__.items()})
        return new

    def _settle(self, keep: int) -> None:
        self._flush_step()
        chunks = [c for c in self._chunks if not c.checked]
        for c in chunks[: max(len(chunks) - keep, 0)]:
            hits = ([] if c.flags is None else c.reader(c.flags) if c.reader is not None
                    else c.flags.tolist())   # evaluated already: no wait
            msg = next((m for m, hit in zip(c.messages, hits) if (any(hit) if isinstance(hit, list) else hit)),
                       None)
            if msg is not None:
                steps = self._appends - c.index
                if self._group is not None:
                    self._group.rollback(c.index, c.before[2])
                else:
                    self._rollback_to(c.index)
                raise ValueError(f"{msg} (chunk {c.index}, found {steps} append(s) later; the cache was "
                                 f"rolled back to offset {self.offset})")
            c.checked = True

    def _rollback_to(self, index: int) -> None:
        """Restore the state before chunk `index` (no-op if this cache never appended it)."""
        self._flush_step()
        for c in self._chunks:
            if c.index == index:
                mk, mv, offset = c.before
                if mk is None:
                    self._k = self._v = None
                else:
                    self._k.restore(mk)
                    self._v.restore(mv)
                self.offset = offset
                while self._chunks and self._chunks[-1].index >= index:
                    self._chunks.pop()
                self._appends = index - 1
                return

    def size(self) -> int:
        return self.offset

    def empty(self) -> bool:
        # As KVCache: empty until the first update (a cache trimmed to 0 tokens is not "empty").
        return self._k is None

    @property
    def nbytes(self) -> int:
        self._flush_step()
        if self._k is None:
            return 0
        return int(self._k.nbytes) + int(self._v.nbytes)

    @property
    def nbytes_parts(self) -> dict:
        """`nbytes` split into "encoded" (records), "window" (exact newest tokens) and "kept" (exact-trim copies),
        both streams together (accelerated/cache/size.py)."""
        self._flush_step()
        return cache_size.add(cache_size.held_parts(self._k), cache_size.held_parts(self._v))

    def nbytes_for(self, tokens: int, *, heads: int | None = None, head_dim: int | None = None, dtype=None,
                   batch: int | None = None) -> dict:
        """nbytes_parts of streams with these params holding `tokens` tokens appended without trims: the cost
        of a length, known before the first update (heads, head_dim; dtype float16, batch 1 by default) or
        from the stored tokens' shape after it."""
        if self._k is not None and self._k._bhd is not None:
            b, h, d = self._k._bhd
            heads, head_dim = heads or h, head_dim or d
            batch = batch or b
            dtype = dtype or self._k.record()["window"].dtype
        if heads is None or head_dim is None:
            raise ValueError("heads/head_dim: required before the first update (no stored tokens give them)")
        kw = dict(heads=heads, head_dim=head_dim, dtype=dtype or mx.float16, batch=batch or 1)
        return cache_size.add(cache_size.stream_parts(self.key_params, tokens, **kw),
                              cache_size.stream_parts(self.value_params, tokens, **kw))

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        """Remove the newest min(n, offset) tokens, returning how many; what the state is then:
        spec/streaming.md 'What a trim restores' and 'Trim'."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n: must be a non-negative int, got {n!r}")
        self._settle(keep=0)
        self._chunks.clear()        # marks taken before a trim cannot be restored
        n = min(self.offset, n)
        if n and self._k is not None:
            tk = self._k.trim(n)
            tv = self._v.trim(n)
            assert tk == tv == n, (tk, tv, n)
            self.offset -= n
        return n

    def make_mask(self, *args, **kwargs):
        return create_attention_mask(*args, offset=self.offset, **kwargs)

    # ---- save / load ------------------------------------------------------------------------------
    @property
    def meta_state(self) -> str:
        """JSON: state format, class, offset, both roles' params and their streams' metadata."""
        self._flush_step()
        meta = {"format": STATE_FORMAT, "class": type(self).__name__, "offset": self.offset,
                "key_params": self.key_params.to_dict(), "value_params": self.value_params.to_dict(),
                "attention": self.attention, "checks": self.checks}
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
        self._settle(keep=0)
        if self._k is None:
            return None, None, self.meta_state
        return dict(self._k.state()[0]), dict(self._v.state()[0]), self.meta_state

    @state.setter
    def state(self, v):
        if not isinstance(v, (list, tuple)) or len(v) != 3 or not isinstance(v[2], str):
            raise ValueError("state: expected (key record, value record, meta JSON string)")
        k_arrays, v_arrays, meta_json = v
        meta = json.loads(meta_json)
        self._flush_step()                      # (none when built by from_state, without __init__)
        if not hasattr(self, "_chunks"):        # from_state: built without __init__
            self._init_runtime()
            self.attention, self.checks = meta.get("attention", "packed"), meta.get("checks", "deferred")
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
            evicted = meta.get("evicted", 0)        # tokens a sliding-window cache dropped (rotating.py)
            if not self._k.tokens == self._v.tokens == meta["offset"] - evicted:
                raise ValueError("state: key/value token counts disagree with the saved offset")
            self.offset = meta["offset"]
        self._chunks.clear()

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


def _prepare(name: str, stream: Stream, x: mx.array, faults: list | None = None):
    """stream.prepare(x), naming the caller's argument (keys/values) in front of the stream's message
    (also in front of the messages of the faults it records in deferred mode)."""
    n0 = 0 if faults is None else len(faults)
    try:
        pending = stream.prepare(x)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    if faults is not None:
        faults[n0:] = [(kind, a, f"{name}: {m}") for kind, a, m in faults[n0:]]
    return pending
