"""Softmax attention over packed records, in MLX ops (tolerance tier, spec/attention.md).

No dequantized copy of the cache is made: the encoded prefix is read in blocks of tuning's `attention_block`
tokens (one block's values exist at a time) and merged with an online softmax in float32; the exact window is one more
block. For the rotation family the keys are never rotated back: the query is rotated once (RHT is
orthogonal, so <q, RHT_inverse(y)> = <RHT(q), y>) and the weighted values are summed in the rotated
domain, then rotated back once per query row (spec/attention.md, 'Rotated domain').

`PackedRecord` is what attention reads of one stream; `attention(q, k, v, scale, mask)` is the entry point
(accelerated.attention picks between this path and the fused kernels).
"""
from __future__ import annotations

import collections.abc
import dataclasses
import functools

import mlx.core as mx

from ... import spec
from .. import layouts, ops, tuning
from . import codebooks, numerics, prng, rotation

# Longest query block attended over the packed records directly (decode, speculative decoding's draft
# verification); longer blocks (prefill) decode the records and call mx.fast.scaled_dot_product_attention.
MAX_PACKED_QUERIES = 32


@dataclasses.dataclass(frozen=True, eq=False)
class RowStarts:
    """A mask for a left-padded batch (mlx-lm's BatchKVCache layout): batch row b attends to the tokens at
    positions >= starts[b] (its left padding is below), and with `causal` each query row also only to the
    tokens at or before its own position (the L queries are the last L positions). `starts`: (B,) int32;
    `made`: the array mask this one stands for, if the model made one (cache/masks.row_starts); `host`: the
    same starts as Python ints where the cache knows them (a prefill's attention uses them to slice each row
    instead of an array mask; a decode step never reads them)."""
    starts: mx.array
    causal: bool = False
    made: mx.array | None = None
    host: tuple | None = None

    def array(self, l: int, t: int) -> mx.array:
        """The same mask as a (B, 1, l, t) bool array (mlx-lm's create_causal_mask with left_padding)."""
        if self.made is not None:
            return self.made
        pos = mx.arange(t)
        keep = pos[None, None, None, :] >= self.starts[:, None, None, None]
        if self.causal:
            keep = keep & (pos[None, :] <= (t - l) + mx.arange(l)[:, None])[None, None]
        return keep


class Views(collections.abc.Mapping):
    """A record's fields as views of its streams' buffers, made on first use: a decode step through the
    kernels passes the whole buffers and the encoded count instead (`buffers`, `rows`), so it builds no view
    at all (each costs microseconds of host time per layer and step)."""

    def __init__(self, buffers: dict, rows: dict):
        self.buffers, self.rows = buffers, rows
        self._made: dict = {}

    def __getitem__(self, name):
        v = self._made.get(name)
        if v is None:
            v = self._made[name] = self.buffers[name][:, :, : self.rows[name]]
        return v

    def __iter__(self):
        return iter(self.buffers)

    def __len__(self):
        return len(self.buffers)


@dataclasses.dataclass(frozen=True)
class PackedRecord:
    """One stream's record as attention reads it: `fields` of the Q encoded tokens (window excluded,
    views of the stored buffers), the exact `window` (B, H, T - Q, d) in the input dtype, and the
    `decode_tokens(fields, params, d)` of the path that stored it (exact decode of a block of fields)."""
    params: spec.Params
    fields: dict
    window: mx.array
    encoded: int
    decode_tokens: object = None
    token: mx.array | None = None     # pending in-place store of the newest rows (accelerated.kernels.commit)

    def sync(self) -> None:
        """Wait for rows stored in place before MLX ops read the fields (kernels take the token instead)."""
        if self.token is not None:
            mx.eval(self.token)

    def dequantized(self, dtype=mx.float32, eager: bool = False) -> mx.array:
        """(B, H, T, d) in `dtype`: every token decoded (float32), cast once (RNE), the window cast too.

        A full decoded copy (prefill's attention, dequantize-mode caches), built block by block into the
        result: no float32 copy of the whole record, no concatenation. MLX evaluates the independent block
        decodes before the stores, so lazily every block's float32 temporaries are alive at once; `eager`
        evaluates the result after each block (a host sync per block) so that only one block's are: for a
        prefill, where the peak matters and a sync costs nothing. Measured on the CPU (tools/memory.py's
        finding, 8192 tokens, 8 heads, d = 128): a decoded float16 K of 16 MB peaked at 96 MB lazily, 36 MB
        eagerly; the float32 decode plus concatenation and cast before this peaked higher still."""
        self.sync()
        b, h, r, d = self.window.shape
        if not self.encoded:
            return self.window.astype(dtype)
        step = tuning.current().attention_block
        if layouts.of(self.params).groups_tokens(self.params.role):
            step = max(self.params.group_size, step // self.params.group_size * self.params.group_size)
        out = mx.zeros((b, h, self.encoded + r, d), dtype=dtype)
        for t0 in range(0, self.encoded, step):
            t1 = min(self.encoded, t0 + step)
            out[:, :, t0:t1] = self.decode_tokens(self.block(t0, t1), self.params, d).astype(dtype)
            if eager and t1 < self.encoded:
                mx.eval(out)
        if r:
            out[:, :, self.encoded:] = self.window.astype(dtype)
        return out

    @property
    def shape(self) -> tuple[int, int, int, int]:
        b, h, r, d = self.window.shape
        return b, h, self.encoded + r, d

    @property
    def dtype(self):
        return self.window.dtype

    def block(self, t0: int, t1: int) -> dict:
        """Fields of encoded tokens t0..t1-1 (KIVI keys: t0, t1 multiples of G)."""
        p = self.params
        grouped = layouts.of(p).group_rows(p.role)
        out = {}
        for name, a in self.fields.items():
            if name in grouped:
                out[name] = a[:, :, t0 // p.group_size: t1 // p.group_size]
            else:
                out[name] = a[:, :, t0:t1]
        return out


@dataclasses.dataclass(frozen=True)
class RaggedRecord(PackedRecord):
    """A ragged B-row stream's record (accelerated/cache/ragged.py): `fields` from position 0 (KIVI keys' group rows
    at each row's phase), `window` positions `encoded` .. T - 1 (encoded: the rows' least boundary; each row's own
    encoded tokens end at its boundary, past it in some rows), `phases` each row's group phase ((B,) int32, made
    once per layout) and `decoded()` every row's own tokens (float32 (B, H, T, d): what the ops path attends)."""
    phases: mx.array | None = None
    decoded: object = None


# ---- one role's records in the attention's domain -------------------------------------------------------
# key_queries(q32, p, d) -> the query forms the key scores need (rotated for the rotation family);
# key_scores(qs, f, p, d) -> (B, H, NQ, Tb) scores of a block; value_parts(f, p, d) -> arrays (B, H, Tb, d)
# whose p-weighted sums `finish` maps back to the model's domain.

def _rotated(p: spec.Params) -> bool:
    return layouts.of(p).rotation


def _signs(p: spec.Params, h: int, d: int, purpose: int = prng.PURPOSE_ROTATION) -> mx.array:
    return prng.head_signs(p, h, d, purpose)


@functools.lru_cache(maxsize=None)
def _byte_lut(kind: str, bits: int, d: int, stage1_bits: int = 0) -> mx.array:
    """(256, 8 / bits) float32: the table values of the codes packed in each possible byte (LSB first,
    spec/packing.md), so one gather of the record's bytes yields the looked-up row (bits in 1, 2, 4, 8)."""
    table = _table(kind, bits, d, stage1_bits)
    per = 8 // bits
    byte = mx.arange(256, dtype=mx.uint32)[:, None]
    idx = (byte >> (mx.arange(per, dtype=mx.uint32)[None, :] * bits)) & ((1 << bits) - 1)
    lut = mx.take(table, idx)
    mx.eval(lut)
    return lut


def _table(kind: str, bits: int, d: int, stage1_bits: int = 0) -> mx.array:
    if kind == "sign":
        return mx.array([1.0, -1.0], dtype=mx.float32)            # 1 = negative
    if kind == "gaussian":
        return codebooks.gaussian(bits, d)[0]
    return codebooks.residual(stage1_bits, bits, d)[0]            # turboquant_rvq stage 2 after stage1_bits


def _chunk(bits: int) -> int:
    """Codes per chunk for widths whose codes do not tile bytes (3, 5, 6, 7 bits; packing.md: k = 32 // bits
    codes per word, none straddling words): the most codes c dividing k with c * bits <= 15 bits."""
    k = 32 // bits
    return max(c for c in range(1, k + 1) if k % c == 0 and c * bits <= 15)


@functools.lru_cache(maxsize=None)
def _chunk_lut(kind: str, bits: int, d: int, stage1_bits: int = 0) -> mx.array:
    """(2^(c * bits), c) float32: the table values of the c codes in each possible chunk (LSB first)."""
    c = _chunk(bits)
    chunk = mx.arange(1 << (c * bits), dtype=mx.uint32)[:, None]
    idx = (chunk >> (mx.arange(c, dtype=mx.uint32)[None, :] * bits)) & ((1 << bits) - 1)
    lut = mx.take(_table(kind, bits, d, stage1_bits), idx)
    mx.eval(lut)
    return lut


def _lookup(words: mx.array, kind: str, bits: int, d: int, stage1_bits: int = 0) -> mx.array:
    """Table values of every code of a packed block, float32 (..., d): one gather over the bytes where the
    codes tile bytes, else one gather over chunks of c codes within each word (3 bits: 2 chunks of 5 codes;
    on this 2-core CPU 3.4x faster than unpacking 4k x 8 rows of codes and gathering each: 54.8 -> 15.9 ms)."""
    if bits in (1, 2, 4, 8):
        by = words.view(mx.uint8)                                 # little-endian words: byte order = code order
        vals = mx.take(_byte_lut(kind, bits, d, stage1_bits), by, axis=0)  # (..., bytes, 8 / bits)
        return vals.reshape(*words.shape[:-1], -1)[..., :d]
    c = _chunk(bits)
    n = (32 // bits) // c                                          # chunks per word
    mask = (1 << (c * bits)) - 1
    chunks = mx.stack([(words >> (j * c * bits)) & mask for j in range(n)], axis=-1)     # (..., words, n)
    vals = mx.take(_chunk_lut(kind, bits, d, stage1_bits), chunks, axis=0)              # (..., words, n, c)
    return vals.reshape(*words.shape[:-1], -1)[..., :d]


def _rotated_values(f: dict, p: spec.Params, d: int) -> tuple[list[mx.array], list[mx.array]]:
    """The rotated-domain values y^ of a block as (rows, per-token factors): y^ = sum_i rows_i * factors_i
    before the inverse rotation (methods/*.md, 'Decode'); the factors multiply scores or weights, never the
    (T, d) rows, so a block costs one gather per code stream."""
    n = f["norm"]
    if p.method == "turboquant":
        return [_lookup(f["codes"], "gaussian", p.bits, d)], [n]
    if p.method == "turboquant_rvq":
        return [_lookup(f["codes1"], "gaussian", p.bits, d)
                + _lookup(f["codes2"], "residual", p.bits2, d, p.bits)], [n]
    if p.method == "turboquant_prod":
        g = (f["rnorm"] * numerics.qjl_scale(d)) * n
        return [_lookup(f["codes"], "gaussian", p.bits - 1, d), _lookup(f["qjl"], "sign", 1, d)], [n, g]
    if p.method == "rabitq":
        ip = f["ip"]
        pos = ip > 0
        g = mx.where(pos, (n * numerics.scale(d)) / mx.where(pos, ip, 1.0), 0.0)
        return [_lookup(f["codes"], "sign", 1, d)], [g]
    raise AssertionError(p.method)


def key_queries(q32: mx.array, p: spec.Params, d: int) -> list[mx.array]:
    """q (B, H, NQ, d) scaled; rotation family: [RHT_sigma(q)] (+ [RHT_tau(RHT_sigma(q))] for prod)."""
    if not _rotated(p):
        return [q32]
    h = q32.shape[1]
    q1 = rotation.rht(q32, _signs(p, h, d))
    if layouts.of(p).sketch:
        return [q1, rotation.rht(q1, _signs(p, h, d, prng.PURPOSE_QJL))]
    return [q1]


def key_scores(qs: list[mx.array], f: dict, p: spec.Params, d: int, decode) -> mx.array:
    if not _rotated(p):
        k = decode(f, p, d)                                  # one block of exact decoded keys
        return qs[0] @ k.swapaxes(-1, -2)
    rows, fac = _rotated_values(f, p, d)
    if layouts.of(p).sketch:                                 # n * (<q', C[i]> + gamma A_d <q'', s>)
        return (qs[0] @ rows[0].swapaxes(-1, -2)) * fac[0][:, :, None, :] + \
            (qs[1] @ rows[1].swapaxes(-1, -2)) * fac[1][:, :, None, :]
    return (qs[0] @ rows[0].swapaxes(-1, -2)) * fac[0][:, :, None, :]


def value_parts(f: dict, p: spec.Params, d: int, decode) -> list[tuple[mx.array, mx.array | None]]:
    """[(rows (B, H, Tb, d), per-token factor (B, H, Tb) or None)]: the weights times the factor, then
    times the rows, summed over the block, are the part's contribution."""
    if not _rotated(p):
        return [(decode(f, p, d), None)]
    rows, fac = _rotated_values(f, p, d)
    return list(zip(rows, fac))


def finish(parts: list[mx.array], p: spec.Params, d: int) -> mx.array:
    """Weighted sums of value_parts back in the model's domain: the inverse rotation(s), once per row."""
    if not _rotated(p):
        return parts[0]
    h = parts[0].shape[1]
    y = parts[0]
    if layouts.of(p).sketch:
        y = y + rotation.rht_inverse(parts[1], _signs(p, h, d, prng.PURPOSE_QJL))
    return rotation.rht_inverse(y, _signs(p, h, d))


# ---- online softmax -----------------------------------------------------------------------------------------
class _Online:
    """Running (max, sum, weighted parts) of one domain; scores (B, H, NQ, Tb)."""

    def __init__(self):
        self.m = self.l = None
        self.acc: list[mx.array] | None = None

    def add(self, s: mx.array, parts: list[mx.array]) -> None:
        bm = s.max(axis=-1, keepdims=True)
        m_new = bm if self.m is None else mx.maximum(self.m, bm)
        m_safe = mx.where(m_new == -mx.inf, 0.0, m_new)      # rows with every token masked so far
        e = mx.exp(s - m_safe)
        ls = e.sum(axis=-1, keepdims=True)
        pv = [(e if f is None else e * f[:, :, None, :]) @ v for v, f in parts]
        if self.m is None:
            self.l, self.acc = ls, pv
        else:
            a = mx.exp(self.m - m_safe)
            self.l = self.l * a + ls
            self.acc = [x * a + y for x, y in zip(self.acc, pv)]
        self.m = m_new


def _mask_rows(mask, b: int, hkv: int, rep: int, l: int, t_total: int):
    """mlx-lm's mask (None, "causal", bool or additive array broadcastable to (B, Hq, L, T)) as a function
    of a token range giving an array broadcastable to (B, Hkv, rep*L, t1 - t0), or None."""
    if mask is None:
        return None
    if isinstance(mask, RowStarts):
        st = mask.starts.reshape(b, 1, 1, 1)
        causal = _mask_rows("causal", b, hkv, rep, l, t_total) if mask.causal else None

        def rows(t0, t1):
            keep = mx.arange(t0, t1)[None, None, None, :] >= st
            return keep & causal(t0, t1)[None, None] if causal else keep
        return rows
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"mask: unknown mask {mask!r}")
        qpos = (t_total - l) + (mx.arange(rep * l) % l)

        def causal(t0, t1):
            return mx.arange(t0, t1)[None, :] <= qpos[:, None]
        return causal
    m = mask
    while m.ndim < 4:
        m = m[None]
    m = mx.broadcast_to(m, (m.shape[0], m.shape[1], l, t_total))
    if m.shape[1] == 1:
        m = mx.broadcast_to(m[:, :, None], (m.shape[0], 1, rep, l, t_total)).reshape(m.shape[0], 1, rep * l, t_total)
    else:
        m = m.reshape(m.shape[0], hkv, rep * l, t_total)
    return lambda t0, t1: m[..., t0:t1]


def _apply(s: mx.array, keep) -> mx.array:
    if keep is None:
        return s
    if keep.dtype == mx.bool_:
        return mx.where(keep, s, -mx.inf)
    return s + keep.astype(s.dtype)


def _tail(r: PackedRecord, t0: int, decode) -> mx.array:
    """Tokens t0..T-1 of a record decoded exactly (float32): its encoded ones from t0 on, then the window."""
    win = numerics.upcast(r.window)
    if t0 >= r.encoded:
        return win
    g0 = t0
    if layouts.of(r.params).groups_tokens(r.params.role):
        g0 = t0 // r.params.group_size * r.params.group_size
    dec = decode(r.block(g0, r.encoded), r.params, win.shape[-1])[:, :, t0 - g0:]
    return mx.concatenate([dec, win], axis=2)


def attention(queries: mx.array, k: PackedRecord, v: PackedRecord, scale: float, mask=None,
              decode_k=None, decode_v=None, block: int | None = None) -> mx.array:
    """softmax(scale * q K^T + mask) V over two packed records; queries (B, Hq, L, d), Hq = rep * H.

    decode_k / decode_v: a method module's decode_tokens for the non-rotated methods (exact decode of one
    block; default: accelerated.ops's). `block`: encoded tokens per block (default: tuning's attention_block).
    Returns (B, Hq, L, d) in the queries' dtype."""
    b, hq, l, d = queries.shape
    _, hkv, t, dk = k.shape
    if dk != d or v.shape[3] != d or v.shape[:3] != k.shape[:3] or hq % hkv:
        raise ValueError(f"queries: shape {tuple(queries.shape)} does not fit keys {k.shape} / values {v.shape}")
    rep = hq // hkv
    kp, vp = k.params, v.params
    k.sync()
    v.sync()
    decode_k = decode_k or k.decode_tokens or ops.method_module(kp.method).decode_tokens
    decode_v = decode_v or v.decode_tokens or ops.method_module(vp.method).decode_tokens
    q32 = (queries.astype(mx.float32) * scale).reshape(b, hkv, rep * l, d)
    keep = _mask_rows(mask, b, hkv, rep, l, t)
    step = block or tuning.current().attention_block
    q_enc = min(k.encoded, v.encoded)      # tokens encoded in both records
    if layouts.of(kp).groups_tokens(kp.role):
        step = max(kp.group_size, step // kp.group_size * kp.group_size)
        q_enc = q_enc // kp.group_size * kp.group_size
    enc, win = _Online(), _Online()
    if q_enc:
        qs = key_queries(q32, kp, d)
        for t0 in range(0, q_enc, step):
            t1 = min(q_enc, t0 + step)
            s = key_scores(qs, k.block(t0, t1), kp, d, decode_k)
            s = _apply(s, keep(t0, t1) if keep else None)
            enc.add(s, value_parts(v.block(t0, t1), vp, d, decode_v))
    if t > q_enc:
        # the window, and tokens encoded in one record only (different windows or KIVI groups): exact
        kw, vw = _tail(k, q_enc, decode_k), _tail(v, q_enc, decode_v)
        s = _apply(q32 @ kw.swapaxes(-1, -2), keep(q_enc, t) if keep else None)
        win.add(s, [(vw, None)])
    if enc.m is None:
        out = win.acc[0] / win.l
    else:
        acc = finish(enc.acc, vp, d)
        if win.m is None:
            out = acc / enc.l
        else:
            m = mx.maximum(enc.m, win.m)
            m = mx.where(m == -mx.inf, 0.0, m)
            we, ww = mx.exp(enc.m - m), mx.exp(win.m - m)
            out = (acc * we + win.acc[0] * ww) / (enc.l * we + win.l * ww)
    return out.reshape(b, hkv, rep, l, d).reshape(b, hq, l, d).astype(queries.dtype)
