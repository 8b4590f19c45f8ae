"""The decode step of a VeloxKVCache on the GPU kernels with the per-shape work done once (a host-time path).

Building one layer's step on the general path cost several times fp16 KVCache + SDPA's host time while the GPU
evaluation of both was about the same (docs/decode-step-analysis.md has the measurements); in generation the
build is not hidden (MLX encodes on the same thread). The general path re-derives, at every step, what an in-place append and its attention launch are: ~75 Python calls per
layer. `DecodeStep` is made once per `in_place.InPlace` plan (both streams' buffers, shapes and dtypes fixed)
and does per step only what changes: the new token's arrays, the row counts, the chunk record of the deferred
checks, and the attention launch's query, encoded count and token (its per-shape part cached per split
count).

The bytes and the checks are those of the general path: the same launches with the same inputs
(accelerated.kernels.append, accelerated.kernels.attention), the same `_Chunk` records (spec/streaming.md,
'Deferred rejection'), the same state changes (in_place.append_in_place). Anything else (another shape or
dtype, a stream changed by trim/restore/compaction, a mask, a query block the kernels do not take) returns to the
general path; a buffer out of room is grown by the plan on the step (`_grown`, in_place.InPlace.grow, a ragged
plan's cache/ragged_growth.grow: one copy launch, no host sync), except where a sliding-window cache evicted rows (its compaction leaves room); a sliding-window cache's eviction only moves the first valid row (lo: the
append writes at row lo + Q, the attention reads the buffers from row lo: RowStarts, each row's start moved past lo;
KIVI evicts whole groups, so its keys' scale and zero rows start at lo / G; with an exact window too: `_past_evicted`). Where the combine is its own launch (tuning's fuse_combine
off, Metal), the step makes both launches as kernels.attention.attention does.

With tuning's fuse_append (on by default; docs/decode-step-analysis.md, ninth and tenth passes) the step's
append runs inside the attention's partial launch (attention_source.append_block, the same encode body and bytes):
update_and_fetch leaves the chunk pending (the offset and the returned StepKVs already count it), `attend` stores it,
and anything else that reads the cache first (its methods, a StepKV's record or flags, the next update) launches the
append kernel on its own, so every reader sees the state of the general path. The chunk's record then holds the
combine launch's 4-byte summary of the partial launch's token, never the token itself: the host's read of a token
in device memory cost a GPU stall per step (attention_source.COMBINE_SUMMARY).
"""
from __future__ import annotations

import mlx.core as mx

from ..attention import RaggedStepKV, StepKV
from . import append as fused
from . import attention as kattention
from . import backend
from . import methods as km
from .. import tuning
from ..ops.attention import RowStarts


def _resolve(kernel, template, **call):
    """(callable, its keyword arguments but the inputs): our CUDA wrapper's object for that template, else the
    kernel itself with the template among the arguments."""
    if isinstance(kernel, backend.CudaKernel):
        return kernel.specialized(template), call
    return kernel, {**call, "template": template}


def _past_evicted(b: int, keys, values, mask):
    """(the launch's mask, the mask among the held tokens that `supports` judges, whether its starts lie below the
    encoded tokens where the host knows them). A sliding-window cache's evicted rows lie below row lo: the launch
    reads the whole buffers from there (its row starts moved past them, no sync). With a window the kernels take row
    starts only below the encoded tokens (they mask encoded rows only): known on the host where the cache made the
    mask (rotating.py make_mask: a sliding window's own starts), judged per call."""
    lo, held = keys.lo, mask
    if lo:
        if mask is None:        # every row starts at lo (a batch's rows all hold the window: rotating.py)
            rows = km.count(lo) if b == 1 else mx.full((b,), lo, dtype=mx.int32)
            mask, held = RowStarts(rows), RowStarts(rows, host=(0,) * b)
        else:                   # each row's start among the held tokens, moved past the evicted rows
            mask = RowStarts(mask.starts + lo, mask.causal)
    below = None if held is None or held.host is None else max(held.host) <= min(keys.encoded, values.encoded)
    return mask, held, below


def _splits(q: int, t) -> tuple:
    """(tuning t, lo, hi, kattention.split_counts(q)) under t: the counts hold for every q in (lo, hi] (each is a
    ceiling of q over a split size: the scalar loop's changes at 8192), so a step asks for them once per range."""
    tps, ls = t.tokens_per_split, t.long_split
    a, b = counts = kattention.split_counts(q)
    lo, hi = ((a - 1) * tps, min(a * tps, 8192)) if q <= 8192 else (max((a - 1) * ls, 8192), a * ls)
    return t, max(lo, (b - 1) * tps), min(hi, b * tps), counts


def _mark(s) -> tuple:
    """Stream.mark of a decode step's stream (every field holds its rows for Q tokens from the first valid token lo:
    DecodeStep.applies): the rows as lo alone (every method's first field has a row per token), which Stream.restore
    rebuilds: no dict per layer and step."""
    return s._epoch, s._version, s._q, s._rows[s._names[0]].lo, s._window, s._dtype, s._bhd, s._kept


class _Pending:
    """An append a decode step left for its attention launch (tuning's fuse_append): the append launch's
    inputs, the rollback marks before it and its chunk index; `token` once a launch stored it."""

    __slots__ = ("step", "ins", "before", "index", "token")

    def __init__(self, step, ins, before, index):
        self.step, self.ins, self.before, self.index, self.token = step, ins, before, index, None

    def resolve(self) -> mx.array:
        """The chunk's token; launches the append on its own first if no attention launch took it."""
        if self.token is None:
            self.step.flush()
        return self.token


class DecodeStep:
    """One cache's in-place append (one token or chunk of the remembered shape) plus its attention launch."""

    __slots__ = ("cache", "plan", "k", "v", "kernel", "call", "ins", "slot_v", "record", "attn", "clean", "pending",
                 "append_ts", "win", "consts", "mixed", "empty", "fslots", "ragged", "wslot", "fk", "fv", "whole",
                 "cuda", "splits")

    def __init__(self, cache, plan, keys: mx.array, values: mx.array, record):
        # record(index, token, before=): the cache's _Chunk of one append, with the fused launch's messages (the
        # token holds the four checks' hits: kernels/append.py)
        self.cache, self.plan, self.k, self.v, self.record = cache, plan, plan.k, plan.v, record
        self.cuda = backend.backend() == "cuda"     # (where `step` runs at all: the kernels' backend, fixed)
        self.splits = (None, 0, 0, None)            # the attention's split counts and the counts they hold for
        b, h, t, d = keys.shape
        kp, vp = self.k.params, self.v.params
        # a ragged KIVI batch (cache/ragged_step.py's plan): its rows flush at their own phase (input rphase, last)
        self.ragged = rg = getattr(plan, "ragged", False)
        # tuning's whole_windows: each window buffer whole and the launch's rows in one small input (window_rows)
        self.whole = wh = bool(plan.win and not rg and tuning.current().whole_windows)
        grid, group, oshape, template, kc, vc, fk, fv, kernel = fused._static(kp, vp, b, h, t, d, keys.dtype,
                                                                              values.dtype, ragged=rg, whole=wh)
        # each step's constant arrays by the tokens it encodes: t; with KIVI's window two plans, copy-only steps (0)
        # and every G-th step a flush (G), which the host knows from the window's length (in_place.InPlace.flush)
        # (with R = 0 the flush's last token is the chunk's own: in_place.InPlace.own)
        own = t if kp.window == 0 else 0
        self.mixed = plan.mixed
        if self.mixed:      # each role on its own (in_place.InPlace.flushes): (keys', values') tokens encoded
            per = [(0, g) if g else (t,) for g in plan.groups]
            owns = [t if g and p.window == 0 else 0 for g, p in zip(plan.groups, (kp, vp))]
            self.consts = {(a, c): fused._static(kp, vp, b, h, t, d, keys.dtype, values.dtype, (a, c),
                                                 (owns[0] if a and plan.groups[0] else 0,
                                                  owns[1] if c and plan.groups[1] else 0), ragged=rg, whole=wh)[4:6]
                           for a in per[0] for c in per[1]}
        else:
            self.consts = {t: (kc, vc)} if not plan.group else {
                n: fused._static(kp, vp, b, h, t, d, keys.dtype, values.dtype, n, own if n else 0, ragged=rg,
                                 whole=wh)[4:6]
                for n in (0, plan.group)}
        self.kernel, self.call = _resolve(kernel, template, grid=grid, threadgroup=group, output_shapes=oshape,
                                          output_dtypes=[mx.bool_])
        kb = [plan.kbufs[f] for f in fk]
        self.fk, self.fv = fk, fv       # the buffers' order in the inputs (`_grown` re-points them)
        # inputs as kernels/append.append passes them: [base, after, keys, kc, *kbufs, values, vc, *vbufs], and with
        # exact windows (append.WINDOWED) each step's window views [kf, kw, vf, vw] (in_place.InPlace.windows)
        # (MIXED, append.MIXED: the windowed role's pair only, then the values' first row vbase)
        self.win = plan.win
        tail = 2 * sum(plan.wins) + 1 if self.mixed else 4 if plan.win else 0
        if wh:      # (the windowed roles' buffers and wrow, then MIXED's vbase)
            tail = sum(plan.wins) + 1 + int(self.mixed)
        self.ins = [None, None, None, kc, *kb, None, vc, *[plan.vbufs[f] for f in fv], *([None] * tail),
                    *([plan.phases] if rg else [])]
        self.slot_v = 4 + len(kb)
        # the tokens leaving each window in the append's inputs (kf, vf), by role; a role without a window (MIXED):
        # a view of no rows as its window in the attention launch
        first = self.wslot = len(self.ins) - tail - int(rg)
        self.fslots = (first if plan.wins[0] else None,
                       first + 2 * plan.wins[0] if plan.wins[1] else None) if plan.win else (None, None)
        self.empty = (keys[:, :, :0], values[:, :, :0])
        self.attn: dict = {}
        # a token with no hit, as tolist() gives it: the append kernel's, and the combine's summary of the attention
        # launch's token (one group) when the append ran inside it
        self.clean = ([[[False, False]] * (oshape[0][1])] * 2, [[[False, False]]] * 2)
        self.pending: _Pending | None = None
        tm = dict(template)
        # the side dtypes of the append inside the attention launch (with windows, and the chunks' types)
        self.append_ts = (tm["KTS"], tm["VTS"], *((keys.dtype, values.dtype) if self.mixed else
                                                  (tm["KXT"], tm["VXT"]) if plan.win else ()))

    @staticmethod
    def applies(plan) -> bool:
        """Every field of both streams holds one row per encoded token (KIVI keys' scale and zero: per G tokens)
        from the same first token lo (what StepKV's record assumes: 0, or the tokens a sliding-window cache evicted;
        KIVI evicts whole groups, so its group fields start at row lo / G), and
        both streams have the same count (MIXED, in_place.InPlace.mixed: each its own); a ragged pair's plan
        (cache/ragged_step.py) holds its fields from position 0 by construction."""
        if getattr(plan, "ragged", False):
            return True
        lo, q, qv = plan.rows[0].lo, plan.k._q, plan.v._q
        return (q == qv or plan.mixed) and all(r.lo * g == lo and r.n - r.lo == (q if i < plan.nrows else qv) // g
                                               for i, (r, g) in enumerate(zip(plan.rows, plan.per)))

    def __deepcopy__(self, memo):
        return None       # a copied cache has its own buffers: its next append makes its own

    def holds(self, keys, values) -> bool:
        c = self.cache
        if self.pending is not None:    # (stored first: the plan's room counts its rows)
            self.flush()
        plan = self.plan
        return (c._k is self.k and c._v is self.v and c._in_place is plan and type(keys) is mx.array
                and type(values) is mx.array and plan.same(self.k, self.v, keys, values)
                and (plan._fits() or self._grown()))

    def _grown(self) -> bool:
        """Where only the room in the buffers fails: the plan grows them (in_place.InPlace.grow: one copy launch
        after the cache's last token, no host sync), its token becomes the cache's (the next append orders after
        it), and the step takes the new buffers: its append inputs, and its attention launch parts made again
        (their inputs hold the old buffers). A ragged plan grows the same way (cache/ragged_growth.py). A
        sliding-window cache's evicted rows: False (the general path)."""
        return self.grow() and self.plan._fits()

    def grow(self) -> bool:
        """`_grown`'s growth, also at any other time (the kernel warm-up's: cache/warmup.py): False where the plan
        does not grow (nothing changed)."""
        plan, c = self.plan, self.cache
        if self.pending is not None:
            self.flush()
        token = plan.grow(c._token)
        if token is None:
            return False
        c._token = token
        nk, sv = len(self.fk), self.slot_v + 2
        self.ins[4:4 + nk] = [plan.kbufs[f] for f in self.fk]
        self.ins[sv:sv + len(self.fv)] = [plan.vbufs[f] for f in self.fv]
        self.attn = {}
        return True

    def step(self, keys: mx.array, values: mx.array):
        """in_place.append_in_place + VeloxKVCache's bookkeeping for it, for a chunk `holds` accepted. With
        tuning's fuse_append the append is left to the attention launch (`attend`); anything else that
        needs the chunk first (the cache's other methods, another path's read of the records) launches it alone
        (`flush`)."""
        if self.pending is not None:
            self.flush()
        c, k, v, plan = self.cache, self.k, self.v, self.plan
        chunks = c._chunks
        if len(chunks) > 1 and not chunks[-2].checked:      # _settle(keep=1): chunks are checked in order
            prev = chunks[-2]
            if (len(chunks) == 2 or chunks[-3].checked) and prev.flags is not None \
                    and prev.flags.tolist() in self.clean:    # the usual case: one clean token (no Python loop)
                prev.checked = True
            else:
                c._settle(keep=1)
        if not backend.available()[0]:
            return None
        before = (k.mark(), v.mark(), c.offset) if self.ragged else (_mark(k), _mark(v), c.offset)
        ins = list(self.ins)
        lo = plan.rows[0].lo            # rows a sliding-window cache evicted (Stream.evict): skipped, not attended
        ins[0] = km.count(plan.base() if self.ragged else k._q + lo)
        ins[1] = km.order(c._token)
        ins[2] = keys
        ins[self.slot_v] = values
        # (kf, kw, vf, vw): the tokens leaving each window and the window after the step (whole_windows: kw, vw)
        w = plan.windows(True) if self.whole else plan.windows()
        held = plan.held if w else (None, None)      # the windows after the step (not the launch's: KIVI R = 0)
        t = keys.shape[2]
        fs = plan.flushing if w else (t, t)          # tokens this step encodes, per role
        if self.whole:      # (the windows' buffers whole and their rows: csrc/window_bind.h)
            kw_, vw_ = self._whole(ins, plan, v._q + lo, fs)
        elif self.mixed:    # (append.MIXED: the windowed role's views, then the values' first row; ragged: rphase last)
            end = len(ins) - int(self.ragged)
            ins[end - len(w) - 1:end] = [*w, km.count(plan.base(1) if self.ragged else v._q + lo)]
            ins[3], ins[self.slot_v + 1] = self.consts[fs]
            kw_, vw_ = (w[1] if plan.wins[0] else held[0] if self.ragged else None), \
                (w[-1] if plan.wins[1] else held[1] if self.ragged else None)
        else:
            if w:
                ins[self.wslot:self.wslot + 4] = w
            ins[3], ins[self.slot_v + 1] = self.consts[fs[0]]
            kw_, vw_ = (w[1], w[3]) if w else (None, None)
        # (ragged: the attention's nenc is the rows' least boundary after the step, cache/ragged_step.py)
        qk, qv = plan.counts() if self.ragged else (k._q + fs[0], v._q + fs[1])
        c.offset += keys.shape[2]
        c._appends += 1
        if self.cuda and tuning.current().fuse_append:     # (kattention.fuse_append, the backend known at init)
            token = self.pending = _Pending(self, ins, before, c._appends)
        else:
            (token,) = self.kernel(inputs=ins, **self.call)
            self._stored(token, before, c._appends)
        kv = RaggedStepKV if self.ragged else StepKV
        wr = plan.wrows if self.whole else None
        return (kv(k, plan.kbufs, qk, token, self, lo, kw_, held[0], wr),
                kv(v, plan.vbufs, qv, token, self, lo, vw_, held[1], wr))

    def _whole(self, ins: list, plan, vbase: int, fs: tuple) -> tuple:
        """`step`'s append inputs with tuning's whole_windows: the windowed roles' buffers and wrow (rows relative to
        each role's first encoded row: base, MIXED's vbase; in_place.InPlace._whole_rows) in place of their views, and
        the step's plan; returns the windows the step's StepKVs hold (views for the streams' state, no launch input)."""
        bufs, wrow = plan.wrows[:2]
        n = len(bufs)
        ins[self.wslot:self.wslot + n + 1] = [*bufs, wrow]
        if self.mixed:
            ins[self.wslot + n + 1] = km.count(vbase)
        ins[3], ins[self.slot_v + 1] = self.consts[fs if self.mixed else fs[0]]
        w, (kw, vw) = plan.next, plan.wins
        return (w[0] if kw else None), (w[-1] if vw else None)

    def _stored(self, token: mx.array, before: tuple, index: int) -> None:
        """The chunk of `token`'s launch is in the buffers: the plan, the streams and the cache follow."""
        c = self.cache
        self.plan.stored(token)
        c._token = token
        c._chunks.append(self.record(index, token, before=before))

    def flush(self) -> None:
        """The pending append launched on its own (the append kernel), if there is one."""
        p, self.pending = self.pending, None
        if p is not None:
            (p.token,) = self.kernel(inputs=p.ins, **self.call)
            self._stored(p.token, p.before, p.index)

    def attend(self, queries, keys, values, scale: float, mask):
        """The fused attention launch of accelerated.kernels.attention over the records of the step that made
        `keys` and `values` (its encoded count and token, even after later appends), with that step's append
        inside if it is still pending; None where the general path must decide (then nothing was launched)."""
        out = self._fused(queries, keys, values, scale, mask)
        if out is not None:
            return out
        q_enc, tok = keys.encoded, keys.token_or_pending
        starts = type(mask) is RowStarts        # a left-padded batch's rows (accelerated/cache/batch_shared.py)
        if (mask is not None and not starts) or type(queries) is not mx.array \
                or (values.encoded != q_enc and not self.mixed) or values.token_or_pending is not tok:
            return None
        if self.mixed:      # the roles' common encoded prefix (the MIXED partial reads each role's own past it)
            q_enc = min(q_enc, values.encoded)
        lo = keys.lo
        if lo or mask is not None:
            mask, held, below = _past_evicted(queries.shape[0], keys, values, mask)
        else:                   # (the usual decode step: nothing evicted, no mask)
            held = below = None
        starts = starts or bool(lo)
        append = tok is self.pending and tok is not None
        # the append launched alone (also a pending one flushed below because the kernels refused it inside): its
        # token, when over 8 bytes (more than two threadgroups), is summarized by the combine too, so that the record
        # the host reads stays out of device memory (COMBINE_SUMMARY); a fused step's token is a summary already
        t = tok if type(tok) is mx.array else None if append or tok is None else tok.token
        summ = t is not None and t.size > 8
        key = (queries.shape, queries.dtype, scale, self._split_counts(q_enc), append, summ,
               (mask.causal, mask.starts.shape, below) if starts else None)
        a = self.attn.get(key)
        if a is None:
            a = self._attention_launch(queries, keys, values, scale, append, summ, held)
            if keys.plan_bufs() is self.plan.kbufs:     # (not an older step's, from before a growth: its own parts)
                self.attn[key] = a
        if a is False and append:     # the kernels take the call, but not with the append inside: launch it alone
            self.flush()
            return self.attend(queries, keys, values, scale, mask)
        if a is False:
            return None
        kern, call, ins, slots, comb = a
        ins = list(ins)
        iq, inn, ifl, _, _, irs, iwin, _, _, leaving = slots
        ins[iq] = queries
        ins[inn] = km.count(q_enc + lo)
        if starts:
            ins[irs] = mask.starts
        if self.whole:      # the windows' buffers whole and their rows (csrc/window_bind.h)
            ins[iwin[0]], ins[iwin[1]], ins[leaving] = self._whole_attend(keys.wrows, append)
        self._step_inputs(ins, slots, keys, values, tok if append else None)
        if not append:
            ins[ifl] = km.order(keys.flags)
        outs = kern(inputs=ins, **call)
        if comb is None:                  # the combine inside the partial launch (never with the append inside)
            return outs[2]
        ckern, ccall, consts = comb
        if not (append or summ):
            return ckern(inputs=[outs[0], outs[1], consts, queries], **ccall)[0]
        # the record holds the combine's 4-byte summary of the chunk's token: never a host read of the token itself
        # (attention_source.COMBINE_SUMMARY says why)
        out, summary = ckern(inputs=[outs[0], outs[1], consts, queries, outs[2] if append else t], **ccall)
        if append:
            self.pending, tok.token = None, summary
            self._stored(summary, tok.before, tok.index)
        else:
            for r in reversed(self.cache._chunks):   # the record of the step that made `keys` (the latest, mostly)
                if r.flags is t:
                    if not r.checked:
                        r.flags = summary
                    break
        return out

    def _fused(self, queries, keys, values, scale: float, mask):
        """`attend`'s usual call, with fewer questions: the step's pending append inside, no mask, nothing evicted,
        the windows as views; the same launches from the same parts (None: the general path, which makes them)."""
        tok = self.pending
        if tok is None or mask is not None or keys.token_or_pending is not tok or values.token_or_pending is not tok \
                or keys.lo or self.whole or type(queries) is not mx.array:
            return None
        q_enc = keys.encoded
        if self.mixed:
            q_enc = min(q_enc, values.encoded)
        elif values.encoded != q_enc:
            return None
        a = self.attn.get((queries.shape, queries.dtype, scale, self._split_counts(q_enc), True, False, None))
        if not a:
            return None
        kern, call, ins, slots, comb = a
        ins = list(ins)
        ins[slots[0]] = queries
        ins[slots[1]] = km.count(q_enc)
        self._step_inputs(ins, slots, keys, values, tok)
        outs = kern(inputs=ins, **call)
        ckern, ccall, consts = comb
        out, summary = ckern(inputs=[outs[0], outs[1], consts, queries, outs[2]], **ccall)
        self.pending, tok.token = None, summary
        self._stored(summary, tok.before, tok.index)
        return out

    def _split_counts(self, q_enc: int) -> tuple:
        """kattention.split_counts(q_enc), asked again only outside the range of counts it holds for (`_splits`)."""
        sc, t = self.splits, tuning.current()
        if sc[0] is not t or not sc[1] < q_enc <= sc[2]:
            sc = self.splits = _splits(q_enc, t)
        return sc[3]

    def _step_inputs(self, ins: list, slots: tuple, keys, values, tok: _Pending | None) -> None:
        """The attention launch's inputs of the step that made `keys` and `values`: its windows (kw, vw: views; with
        whole_windows `attend` sets them), and with `tok`, its pending append inside, the tokens leaving them (kf, vf)
        and the append's inputs (ordered after the previous store, as the append launch is; the step's plan: KIVI's
        flush or not)."""
        _, _, ifl, ikx, ivx, _, iwin, ikc, ivc, leaving = slots
        views = self.win and not self.whole
        if views:
            ins[iwin[0]] = keys.window if keys.window is not None else self.empty[0]
            ins[iwin[1]] = values.window if values.window is not None else self.empty[1]
        if tok is not None:
            ti, sv = tok.ins, self.slot_v
            if views:
                for i, f in leaving:
                    ins[i] = ti[f]
            ins[ifl], ins[ikx], ins[ivx], ins[ikc], ins[ivc] = ti[1], ti[2], ti[sv], ti[3], ti[sv + 1]

    def _whole_attend(self, wrows: tuple, append: bool) -> tuple:
        """The attention launch's window inputs with tuning's whole_windows, from its step's rows
        (in_place.InPlace._whole_rows): each role's buffer (a role without a window: a view of no rows) and wrow
        relative to nenc: with the append inside, the tokens leaving each window and the launch's window (KIVI with
        R = 0 at a flush: the chunk's row), else the window after the step."""
        bufs, wins = wrows[0], self.plan.wins
        kb = bufs[0] if wins[0] else self.empty[0]
        vb = bufs[-1] if wins[1] else self.empty[1]
        return kb, vb, wrows[2] if append else wrows[3]

    def _attention_launch(self, queries, keys, values, scale: float, append: bool, summ: bool = False, mask=None):
        """The launches' fixed parts for one query shape and split count: the partial, and the combine where it
        is its own launch (kernels.attention.attention's two calls; with `append` or `summ` the combine also
        writes the summary of a token); False: not the kernels' call. `mask`: None or a RowStarts among the held tokens
        (its starts are set per call, moved past a sliding window's evicted rows)."""
        kr, vr = keys.plan_record(), values.plan_record()
        if not kattention.supports(queries, kr, vr, mask, self.mixed) or (append and kattention._fused()):
            return False
        # the append's arrays: its constant arrays (fixed), the new keys and values (any array here: set per step)
        extra = {"kx": queries, "kconst": self.ins[3], "vx": queries, "vconst": self.ins[self.slot_v + 1], "kf": queries,
                 "vf": queries}
        ins, st = kattention._launch(queries, kr, vr, scale, mask, km._dummy(mx.bool_),
                                     self.append_ts if append else None, extra if append else None, self.mixed,
                                     self.whole)
        if append and st.grid[2] != queries.shape[0]:   # more than one query group per KV head: blocks would race
            return False
        names = st.names
        kern, call = _resolve(kattention._kernel("partial", *st.key), st.template, grid=st.grid,
                              threadgroup=(st.threads, 1, 1), output_shapes=st.out_shapes,
                              output_dtypes=st.out_dtypes)
        comb = None
        if not st.key[3]:     # always so with the append inside (_fused() refused it above)
            ckern, ccall = _resolve(kattention._kernel("combine", append=append or summ), st.combine_template,
                                    **kattention.combine_call(st, queries, summary=append or summ))
            comb = (ckern, ccall, st.consts)
        at = {n: i for i, n in enumerate(names)}
        wb = "b" if self.whole else ""
        slots = (at["q"], at["nenc"], at["flags"], at.get("kx"), at.get("vx"), at.get("rstart"),
                 (at.get("kw" + wb), at.get("vw" + wb)), at.get("kconst"), at.get("vconst"),
                 # (the append's inputs of the tokens leaving each window: (launch slot, append slot) per windowed role;
                 # whole_windows: the slot of wrow)
                 at["wrow"] if self.whole else
                 tuple((at[n], f) for n, f in zip(("kf", "vf"), self.fslots) if f is not None and n in at))
        return kern, call, ins, slots, comb
