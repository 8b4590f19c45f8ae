"""Attention over the caches' packed records (spec/attention.md): the fused kernels where they run, the MLX
ops path elsewhere, and the decoded fallback for long query blocks (prefill).

`PackedKV` is what an mlx-lm cache in packed mode returns from `update_and_fetch`: a view of one stream's
record (no decoded copy) plus the lazy fault flags of the chunk just appended, which the attention output
depends on, so that evaluating the output also evaluates the checks (spec/streaming.md, 'Deferred
rejection').
"""
from __future__ import annotations

import dataclasses

import mlx.core as mx

from . import layouts
from .kernels import attention as kernel_attention
from .ops import attention as ops_attention
from .ops.attention import MAX_PACKED_QUERIES, PackedRecord, RaggedRecord, RowStarts, Views


@dataclasses.dataclass(frozen=True)
class PackedKV:
    """Keys or values as an mlx-lm cache in packed mode hands them to attention."""
    record: PackedRecord
    flags: mx.array | None = None     # fault flags of the latest chunk (a dependency of the output)
    step: object = None               # the cache's DecodeStep that made it (accelerated/kernels/decode_step.py)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return self.record.shape

    @property
    def dtype(self):
        return self.record.dtype

    @property
    def ndim(self) -> int:
        return 4

    def dequantized(self, eager: bool = False) -> mx.array:
        """Every token decoded and cast to the input dtype (what a dequantizing cache would return); `eager`:
        block by block with a host sync each (PackedRecord.dequantized), for prefill."""
        return self.record.dequantized(self.dtype, eager)


class StepKV(PackedKV):
    """A PackedKV of one in-place decode step (accelerated/kernels/decode_step.py): its record is made on first
    use from what the step captured (the fused attention launch does not read it; the other paths do). `token`:
    the step's append token, or its pending append (decode_step._Pending) when the attention launch is to store the
    chunk; reading `flags` or `record` first launches such an append on its own. `window`: the step's exact window
    (a view of the stream's window buffer: in_place.InPlace.windows), None: the stream's own (R = 0); `held`: the
    window the step's record holds where it is not the launch's (KIVI with R = 0 at a flush: empty); `wrows`: with
    tuning's whole_windows, the windows' buffers and rows (in_place.InPlace._whole_rows), what the launch reads."""

    def __init__(self, stream, bufs: dict, encoded: int, token, step, lo: int = 0, window: mx.array | None = None,
                 held: mx.array | None = None, wrows: tuple | None = None):
        # (stores into the instance dict, not a frozen dataclass's setattr per field: a decode step makes two per
        # layer)
        d = self.__dict__
        d["token_or_pending"] = token
        d["step"] = step
        d["encoded"] = encoded                      # the step's state: what its attention launch reads
        d["lo"] = lo                                # its first valid row (a sliding-window cache's evictions)
        d["window"] = window
        d["held"] = window if held is None else held     # the window the record holds
        d["wrows"] = wrows
        d["_lazy"] = (stream, bufs, encoded)

    @property
    def flags(self) -> mx.array:
        t = self.token_or_pending
        return t if type(t) is mx.array else t.resolve()

    def plan_bufs(self) -> dict:
        """The buffers of the step's plan (a dict the plan replaces when it grows them: in_place.InPlace.grow)."""
        return (self.__dict__.get("_lazy") or self.__dict__["_plan"])[1]

    def plan_record(self, token: mx.array | None = None, rows: bool = False) -> PackedRecord:
        """The step's record with `token` (not kept: the fused launch's plan, which sets its token itself, over the
        whole buffers and rows lo .. lo + encoded - 1); `rows`: its fields from row lo (what other paths read)."""
        s, bufs, q = self.__dict__.get("_lazy") or self.__dict__["_plan"]
        lo = self.lo
        if rows and lo:     # (KIVI keys' scale and zero: a row per G tokens, lo a multiple of G)
            bufs = {n: b[:, :, s._field_rows(n, lo):] for n, b in bufs.items()}
        # the launch's window (with KIVI's R = 0 at a flush the chunk's row it writes), or the record's (`rows`)
        w = s._window if self.window is None else self.held if rows else self.window
        # rows per field: q, or for KIVI keys' scale and zero q / G (Stream._field_rows)
        return PackedRecord(s.params, Views(bufs, {n: s._field_rows(n, q) for n in bufs}), w, q,
                            s._method.decode_tokens, token)

    @property
    def record(self) -> PackedRecord:
        lazy = self.__dict__.get("_lazy")
        if lazy is not None:
            # the step's state: rows lo..lo+q-1 of every field (per-token records), no window
            object.__setattr__(self, "_record", self.plan_record(self.flags, rows=True))
            object.__setattr__(self, "_plan", lazy)
            del self.__dict__["_lazy"]
        return self.__dict__["_record"]


class RaggedStepKV(StepKV):
    """A StepKV of a ragged KIVI batch's in-place step (cache/ragged_step.py): its record is the ragged stream's
    (RaggedRecord: the whole buffers, `encoded` the rows' least boundary after the step, the window after it, each
    row's phase); other paths read every row's own tokens decoded (`decoded`: the stream's state once stored)."""

    def plan_record(self, token: mx.array | None = None, rows: bool = False) -> PackedRecord:
        s, bufs, q = self.__dict__.get("_lazy") or self.__dict__["_plan"]
        w = self.held if rows else self.window
        return RaggedRecord(s.params, dict(bufs), w, q, s._method.decode_tokens, token, s.phase_array(),
                            s.dequantized)


def _with_flags(out: mx.array, *views: PackedKV) -> mx.array:
    # a chunk stored in place (kernels/commit.py) has its flags as the rows' token: the kernels already
    # take it as an input, any other path waited for it
    deps = [v.flags for v in views if v.flags is not None and v.flags is not v.record.token]
    return mx.depends(out, deps) if deps else out


def path(queries: mx.array, keys: PackedKV, values: PackedKV, mask=None) -> str:
    """Which implementation `attend` uses: "kernels", "ops" or "decoded"."""
    if queries.shape[2] > MAX_PACKED_QUERIES or (mask is not None and not isinstance(mask, (str, RowStarts))
                                                   and queries.shape[2] > 1 and mask.size > 2 ** 24):
        return "decoded"
    k, v = keys.record, values.record
    if k.encoded != v.encoded:       # what `aligned` makes of them, shapes only (supports reads no field)
        n = common_prefix(k, v)
        k, v = dataclasses.replace(k, encoded=n), dataclasses.replace(v, encoded=n)
    if kernel_attention.supports(queries, k, v, mask):
        return "kernels"
    return "ops"


def common_prefix(k: PackedRecord, v: PackedRecord) -> int:
    """The encoded tokens both records can be read from: the shorter encoded prefix, cut to whole groups of KIVI
    keys where that role has more (their scale and zero rows cover G tokens each)."""
    n = min(k.encoded, v.encoded)
    for r in (k, v):
        p = r.params
        if r.encoded > n and layouts.of(p).groups_tokens(p.role):
            n -= n % p.group_size
    return n


def aligned(k: PackedRecord, v: PackedRecord) -> tuple[PackedRecord, PackedRecord]:
    """Both records with the same encoded prefix, as the kernels read them (one split per token range for both
    roles): where the keys and the values flush at different points (different methods or windows in one layer:
    keys turboquant with R = 0, values KIVI with R = 128 and groups of G), the tokens one role has encoded beyond
    `common_prefix` are decoded (float32, what every path attends over) in front of its exact window. At most the
    other role's window plus a group per step: never the whole cache (the ops path, which decoded it all per step,
    was what such a layer fell back to)."""
    if k.encoded == v.encoded:
        return k, v
    n = common_prefix(k, v)
    return _decoded_front(k, n), _decoded_front(v, n)


def _decoded_front(r: PackedRecord, n: int) -> PackedRecord:
    """`r` with encoded tokens n..Q-1 moved, decoded, into the front of its window (float32)."""
    if r.encoded == n:
        return r
    b, h, _, d = r.window.shape
    block = r.block(n, r.encoded)
    if r.token is not None:      # rows stored in place by a pending launch: read after it, with no host wait
        block = dict(zip(block, mx.depends(list(block.values()), [r.token])))
    front = r.decode_tokens(block, r.params, d).astype(mx.float32)
    window = mx.concatenate([front, r.window.astype(mx.float32)], axis=2) if r.window.shape[2] else front
    # the fields as they are: the kernels read rows < encoded only
    return dataclasses.replace(r, window=window, encoded=n)


def _decoded_rows(queries, k, v, scale: float, rows: RowStarts) -> mx.array:
    """A left-padded batch's prefill over decoded keys and values without the (B, 1, L, T) mask array where the
    row starts are known on the host: an array mask sends SDPA to MLX's unfused path, which materializes the
    (B, Hq, L, T) scores (on the H200, a batch of 4 x 32k prompts peaked at 44 GB through it and prefilled at
    ~30k tokens/s, against 7 GB and ~80k with a cache per sequence). No padding (mlx-lm's right-padded prompts
    start every row at 0): one causal SDPA; padding below the queries: one SDPA per row over its own tokens; else
    (padding reaching into the queries: their rows have nothing to attend) the array mask."""
    l, t = queries.shape[2], k.shape[2]
    causal = "causal" if rows.causal else None
    h = rows.host
    if h is not None and not any(h):
        return mx.fast.scaled_dot_product_attention(queries, k, v, scale=scale, mask=causal)
    if h is not None and max(h) <= t - l:
        return mx.concatenate([mx.fast.scaled_dot_product_attention(queries[b:b + 1], k[b:b + 1, :, s:],
                                                                    v[b:b + 1, :, s:], scale=scale, mask=causal)
                               for b, s in enumerate(h)])
    return mx.fast.scaled_dot_product_attention(queries, k, v, scale=scale, mask=rows.array(l, t))


def _ragged(queries, k: RaggedRecord, v: RaggedRecord, scale: float, mask) -> mx.array:
    """Ragged KIVI rows (accelerated/cache/ragged.py): the kernels' ragged partial where they take the call (per-token
    keys beside KIVI values: its MIXED form), else the ops path over every row's tokens decoded (a record with nothing
    encoded)."""
    mixed = kernel_attention.mixed_windows(k.params, v.params) > 0     # (per-token keys beside KIVI values)
    if queries.shape[2] <= MAX_PACKED_QUERIES and kernel_attention.supports(queries, k, v, mask, mixed):
        return kernel_attention.attention(queries, k, v, scale, mask, mixed=mixed)
    k, v = (PackedKV(PackedRecord(r.params, {}, r.decoded(), 0, r.decode_tokens)) for r in (k, v))
    return attend(queries, k, v, scale, mask)


def attend(queries: mx.array, keys: PackedKV, values: PackedKV, scale: float, mask=None,
           sinks=None) -> mx.array:
    """softmax(scale * q K^T + mask) V over packed keys/values; mlx-lm's SDPA contract (queries
    (B, Hq, L, d), GQA with Hq a multiple of the KV heads, mask None / "causal" / array, or ops.attention.RowStarts:
    a left-padded batch's row starts)."""
    if sinks is not None:
        raise ValueError("sinks: attention sinks are not supported over packed records")
    st = keys.step
    if st is not None and st is values.step and queries.shape[2] <= MAX_PACKED_QUERIES:
        out = st.attend(queries, keys, values, scale, mask)   # the fused kernels' launch, its fixed part made once
        if out is not None:
            return out
    if isinstance(keys.record, RaggedRecord):       # (accelerated/cache/ragged.py)
        return _with_flags(_ragged(queries, keys.record, values.record, scale, mask), keys, values)
    which = path(queries, keys, values, mask)
    if which == "decoded":
        k, v = keys.dequantized(eager=True), values.dequantized(eager=True)   # peak memory: one block
        if isinstance(mask, RowStarts):
            out = _decoded_rows(queries, k, v, scale, mask)
        else:
            out = mx.fast.scaled_dot_product_attention(queries, k, v, scale=scale, mask=mask)
    elif which == "kernels":
        k, v = keys.record, values.record
        if kernel_attention.mixed_windows(k.params, v.params) and kernel_attention.supports(queries, k, v, mask, True):
            # roles whose encoded counts differ: each read from its own records and window (the MIXED partial, as
            # the decode step's), nothing decoded
            out = kernel_attention.attention(queries, k, v, scale, mask, mixed=True)
        else:
            out = kernel_attention.attention(queries, *aligned(k, v), scale, mask)
    else:
        out = ops_attention.attention(queries, keys.record, values.record, scale, mask)
    return _with_flags(out, keys, values)
