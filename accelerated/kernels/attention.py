"""Fused decode attention over packed records (spec/attention.md): the `partial` and `combine` kernels of
accelerated/kernels/attention_source.py, launched on views of the caches' buffers (no copy, no decode); the
combine is a second launch (on CUDA it can run inside the partial launch: tuning's fuse_combine, off by default).
On CUDA GPUs with mma.m16n8k16 (sm_80+), turboquant 4-bit keys and values take the partial's tensor-core loop, and
by tuning's tc_* knobs other codes, turboquant_rvq, turboquant_prod, KIVI, mlx_affine and turboquant keys beside KIVI
values (attention_tc.py; `_tensor_cores` says when, by attention_tc.takes).

`supports(queries, k, v, mask)` says whether the kernels take a call (a GPU backend, query blocks of at most
accelerated.ops.attention.MAX_PACKED_QUERIES rows, mask None or "causal", a power-of-two head dim, records with one
encoded prefix, or with `mixed=True` prefixes that differ: the MIXED partial; a ragged record: ragged_support.py's
`takes`); `attention(...)` runs them; `launch_plan(...)` describes the launches (inputs, templates, grids), shared
with the CPU emulation test.
"""
from __future__ import annotations

import dataclasses
import functools
import typing

import mlx.core as mx

from ... import spec
from .. import layouts, tuning
from . import append as kappend
from . import attention_source as src
from . import attention_tc, backend, loader, ragged_support
from . import methods as km
from .ragged_support import pow2
from ..ops import codebooks, prng
from ..ops.attention import MAX_PACKED_QUERIES, PackedRecord, RaggedRecord, RowStarts, Views

LOG2E = 1.4426950408889634


def _kernel_inputs(lay: layouts.Layout) -> tuple:
    """A record's fields as the kernel's (c1, c2, s0, s1, gs, gz) inputs: the affine methods' side fields are
    the per-group gs / gz, the others' the per-token s0 / s1."""
    c1, c2, s1, s2 = lay.kernel_fields()
    return (c1, c2, None, None, s1, s2) if lay.affine else (c1, c2, s1, s2, None, None)


_FIELDS = {m: _kernel_inputs(layouts.layout(m)) for m in spec.METHODS}   # record fields by kernel input


def supports(queries: mx.array, k: PackedRecord, v: PackedRecord, mask, mixed: bool = False) -> bool:
    if not backend.available()[0]:
        return False
    b, hq, l, d = queries.shape
    kb, kh = k.window.shape[:2]
    starts = isinstance(mask, RowStarts)
    if isinstance(k, RaggedRecord) or isinstance(v, RaggedRecord):      # (cache/ragged.py: rows of their own phase)
        return ragged_support.takes(queries, k, v, mask, mixed, mixed_windows(k.params, v.params))
    return (l <= MAX_PACKED_QUERIES and (mask is None or (isinstance(mask, str) and mask == "causal") or starts)
            and (not starts or tuple(mask.starts.shape) == (b,))
            # row starts mask encoded tokens only: with a window, only where they are known not to reach it
            and (not starts or k.window.shape[2] == v.window.shape[2] == 0
                 or (mask.host is not None and max(mask.host) <= min(k.encoded, v.encoded)))
            and pow2(d) and 16 <= d <= 1024 and min(k.encoded, v.encoded) > 0
            and (k.encoded == v.encoded or (mixed and mixed_windows(k.params, v.params) > 0))
            and (kb, kh) == v.window.shape[:2] and hq % kh == 0 and b == kb)


@functools.lru_cache(maxsize=None)
def _dummy(rank: int, dtype=mx.float32) -> mx.array:
    a = mx.zeros((1,) * rank, dtype=dtype)
    mx.eval(a)
    return a


@functools.lru_cache(maxsize=None)
def _sign_table() -> mx.array:
    """The table of 1-bit sign codes (rabitq's codes, turboquant_prod's QJL bits): 0 -> +1, 1 -> -1."""
    a = mx.array([1.0, -1.0], dtype=mx.float32)
    mx.eval(a)
    return a


def _tables(p: spec.Params, d: int) -> tuple[mx.array, mx.array]:
    """The tables of a record's two code streams (codes1/codes2 in the kernel's terms; formats.toml `tables`):
    gaussian at the stream's bits, residual(bits, bits2), the sign table; dummies for affine codes and no stream."""
    lay = layouts.of(p)
    bits = lay.code_bits(p)
    out = []
    for kind, b in zip(lay.tables, bits):
        if kind == "gaussian":
            out.append(codebooks.gaussian(b, d)[0])
        elif kind == "residual":
            out.append(codebooks.residual(p.bits, p.bits2, d)[0])
        elif kind == "sign":
            out.append(_sign_table())
        else:
            out.append(_dummy(1))
    return tuple(out + [_dummy(1)] * (2 - len(out)))


@functools.lru_cache(maxsize=1024)
def _signs(p: spec.Params, h: int, d: int) -> tuple[mx.array, mx.array]:
    """(sigma, tau) of the heads, flat (H * d,) float32; dummies for methods without them."""
    lay = layouts.of(p)
    if not lay.rotation:
        return _dummy(1), _dummy(1)
    sig = prng.head_signs(p, h, d).reshape(h * d)
    tau = prng.head_signs(p, h, d, prng.PURPOSE_QJL).reshape(h * d) if lay.sketch else _dummy(1)
    mx.eval(sig, tau)
    return sig, tau


def _record_inputs(r: PackedRecord, role: str) -> dict[str, mx.array]:
    """The fields of a record under the kernel's names ({role}c1, c2, s0, s1, gs, gz): the buffers themselves
    where the record has them (the kernel reads rows < nenc only), else views."""
    f = r.fields.buffers if isinstance(r.fields, Views) else r.fields
    return {kn: f[name] for kn, name in _field_names(r.params.method, role)}


@functools.lru_cache(maxsize=None)
def _field_names(method: str, role: str) -> tuple:
    return tuple((f"{role}{n}", name) for n, name in zip(("c1", "c2", "s0", "s1", "gs", "gz"), _FIELDS[method])
                 if name is not None)


@functools.lru_cache(maxsize=256)
def _constants(kp: spec.Params, vp: spec.Params, hkv: int, d: int, scale: float) -> mx.array:
    """f_c (attention_source.C_*): scale * log2(e), s_d, A_d, the four code tables, then sigma and tau of
    the keys and of the values (hkv * d each; zeros where a method has none)."""
    import numpy as np
    c = np.zeros(src.C_SIGNS + 4 * hkv * d, np.float32)
    c[src.C_SCALE] = float(scale) * LOG2E
    c[src.C_K], c[src.C_K + 1] = float(spec.scale(d)), float(spec.qjl_scale(d))
    for off, tab in zip((src.C_KTAB1, src.C_KTAB2, src.C_VTAB1, src.C_VTAB2), (*_tables(kp, d), *_tables(vp, d))):
        t = np.array(tab, np.float32).reshape(-1)
        c[off: off + t.size] = t
    for i, a in enumerate((*_signs(kp, hkv, d), *_signs(vp, hkv, d))):
        a = np.array(a, np.float32).reshape(-1)
        if a.size == hkv * d:
            c[src.C_SIGNS + i * hkv * d: src.C_SIGNS + (i + 1) * hkv * d] = a
    out = mx.array(c)
    mx.eval(out)
    return out


def _tokens_per_lane(kp: spec.Params, vp: spec.Params) -> int:
    """Tokens each lane works on at once: 4 independent load/reduce chains hide latency; the group-scaled
    methods (kivi, mlx_affine) need more registers per token, so 2 keeps them from spilling."""
    return 2 if layouts.of(kp).affine or layouts.of(vp).affine else 4


@dataclasses.dataclass(frozen=True)
class Plan:
    """The two launches of one attention call."""
    partial_inputs: list
    partial_template: list
    partial_grid: tuple
    partial_outputs: list          # [(shape, dtype)]
    combine_template: list
    combine_grid: tuple
    combine_threads: int
    out_shape: tuple
    splits: int
    qb: int
    partial_names: list = dataclasses.field(default_factory=list)   # attention_source.inputs of the launch
    key: tuple = (0, 0, False, False, False, 0, False, False)   # (MK, MV, HASWIN, FUSED, TC, TC_MIN_BLOCKS, APPEND,
                                                                # STARTS): the kernel
    fused: bool = False                                             # the combine runs inside the partial launch


class _Static(typing.NamedTuple):
    """The per-shape part of a call (see _static)."""
    consts: mx.array          # f_c
    names: list               # attention_source.inputs of the partial launch
    template: list
    grid: tuple
    outs: list                # [(shape, dtype)] of the partial launch
    combine_template: list
    combine_grid: tuple
    splits: int
    qb: int
    key: tuple                # (MK, MV, HASWIN, FUSED, TC, TC_MIN_BLOCKS, APPEND, STARTS): the partial kernel
    out_shapes: list
    out_dtypes: list
    counts: mx.array | None   # the fused launch's per-group counters
    combine_threads: int      # threads of a combine threadgroup
    threads: int              # threads of a partial threadgroup


@functools.lru_cache(maxsize=1024)
def _static(kp: spec.Params, vp: spec.Params, b: int, hq: int, l: int, d: int, hkv: int, q_enc_splits: int,
            has_win: bool, causal: bool, qdtype, scale: float, fused: bool, q_fine: int = 1,
            tune: tuning.Tuning | None = None, append_ts: tuple | None = None, starts: bool = False,
            ragged: bool = False) -> _Static:
    """Everything of a plan but the per-step arrays, cached per shape (a decode step builds none of it) and per
    tuning `tune` (default: tuning.current(); an arm that changes a knob gets its own plans). `append_ts`: the keys'
    and values' side dtypes (with a window, and the chunks' dtypes) of a launch with the decode step's append inside
    (APPEND): one split more (S - 1, the appended tokens), its inputs and the append's token as a third output.
    `starts`: each batch row's first attended token (input `rstart`: a left-padded batch); `ragged`: KIVI rows of
    their own group phase (input `rphase`, template RW: cache/ragged.py), the scalar loop, or with tuning's
    tc_ragged the KIVI tensor-core loop (its chunks and key groups from each row's phase), or for turboquant keys
    beside KIVI values (a MIXED partial) with tc_mixed too TC_MIX's loop (the ragged scalar partial's ranges)."""
    append = append_ts is not None
    tune = tune or tuning.current()
    tc_blocks, nt = tune.tc_min_blocks, tune.partial_threads
    cthreads = max(d, tune.combine_threads)
    nq = (hq // hkv) * l
    p_lanes = min(32, d // 8)
    nc = d // (8 * p_lanes)
    parts = 2 if layouts.of(kp).sketch or layouts.of(vp).sketch else 1
    qb = 1 << (max(nq, 1) - 1).bit_length()               # next power of two >= nq
    mixed = int(has_win) in src.MIXED_WINDOWS       # (split S - 1 reads one role's window beside the other's records)
    rp = kp if mixed and kp.method == "kivi" else vp if mixed else kp     # (the role of the rows' phases)
    if ragged and append and mixed and rp.method == "kivi" and rp.window == 0:
        ragged = src.OWN      # (the mixed pair's KIVI role with R = 0: texts of their own, attention_source.OWN)
    # ragged rows on tensor cores (tc_ragged): KIVI's loop, or TC_MIX's for the mixed pair's MIXED partial (HASWIN 3 / 4,
    # the append inside or not, OWN's too); KIVI keys beside per-token values (VQ_RKEYS; TC_MIXK's pair): the scalar loop
    rag_tc = not ragged or (tune.tc_ragged and (kp.method == vp.method == "kivi"
                                                or (mixed and attention_tc.mixed_pair(kp, vp))))
    tc = tune.tensor_cores and rag_tc and _tensor_cores(kp, vp, d, has_win, tune.tc_codes, tune.tc_kivi, tune.tc_affine,
                                                        tune.tc_3bit, tune.tc_two_stage, tune.tc_prod3, tune.tc_mixed,
                                                        tune.tc_mixkv)
    # registers: qb * nc query + accumulator values; the tensor-core loop: 4 rows, hi and lo parts in N = 8
    qb = max(1, min(qb, 4 if tc else 32 // (nc * parts)))
    nqg = -(-nq // qb)
    if tc:      # q_fine: splits of tokens_per_split tokens, fewer where one wave of threadgroups is full
        fill = tune.tc_waves * tc_blocks * _sm_count() // max(1, hkv * b * nqg)
        splits = max(1, min(q_fine, fill - 1 - int(append or mixed)))
    else:
        splits = max(1, min(q_enc_splits, tune.max_threadgroups // max(1, hkv * b * nqg)))
    kb1, kb2 = km._code_bits(kp)
    vb1, vb2 = km._code_bits(vp)
    tc = _loop(kp, vp, (kb1, vb1)) if tc else tc
    mk, mv = layouts.of(kp).kernel_id, layouts.of(vp).kernel_id
    if (not layouts.of(kp).affine and max(kb1, kb2) > 5) or (not layouts.of(vp).affine and max(vb1, vb2) > 5):
        raise ValueError("the partial kernel's code tables hold at most 32 entries (one per lane)")
    tmpl = [("MK", mk), ("MV", mv), ("KB1", kb1), ("KB2", kb2),
            ("VB1", vb1), ("VB2", vb2), ("D", d), ("QB", qb), ("NT", nt), ("P", p_lanes),
            ("KG", kp.group_size or 1), ("VG", vp.group_size or 1), ("CAUSAL", int(causal)),
            ("HASWIN", int(has_win)), ("U", _tokens_per_lane(kp, vp)), ("PF", tune.prefetch), ("FUSED", int(fused)),
            ("APPEND", int(append)), ("OT", qdtype)] + ([("RW", rp.window)] if ragged else [])
    if append:      # the encode body's side dtypes and code constants (compiled in: the staging for 3/5/6/7-bit
                    # packing, 16 KB of threadgroup memory, is dead code for the others)
        # with a window, also the chunk's element types (the append copies it into the window: kernels/append.py
        # WINDOWED; append_ts = (KTS, VTS, KXT, VXT))
        tmpl += [("KTS", append_ts[0]), ("VTS", append_ts[1]), *zip(("KXT", "VXT"), append_ts[2:] if has_win else ())] + [
            (f"{r}C{n}", c) for r, p in (("K", kp), ("V", vp)) for n, c in zip(("B1", "B2", "GS"), km.code_constants(p))]
    if tc:      # the tensor-core loop has no U, and its own prefetch depth
        pf = _tc_prefetch(kp, vp, tune.tc_prefetch)
        tmpl = [(n, v) for n, v in tmpl if n not in ("U", "PF")] + [("PF", pf)]
        if kp.method == "kivi":     # KIVI keys' loops (KIVI's, TC_MIXK's): chunks a warp takes in a row (tc_kpairs)
            tmpl.append(("KP", 2 if tune.tc_kpairs and kp.group_size >= 32 and pf % 2 == 0 else 1))
    vparts = 2 if layouts.of(vp).sketch else 1
    if fused and append:
        raise ValueError("the append runs inside an unfused partial launch")
    splits += int(append or mixed)     # split S - 1 = splits - 1: the appended tokens (MIXED: and the roles' gap)
    if splits + 1 > src.MAX_SPLITS:
        raise ValueError(f"{splits} splits: the combine takes at most {src.MAX_SPLITS - 1}")
    outs = [((b, hkv, nq, splits + 1, vparts, d), mx.float32), ((b, hkv, nq, splits + 1, 2), mx.float32)]
    if fused:
        outs.append(((b, hq, l, d), qdtype))
    if append:
        outs.append(((2, b * hkv, 2), mx.bool_))
    grid = (nt * (splits + 1), hkv, b * nqg)
    key = (mk, mv, has_win, fused, tc, tc_blocks if tc else 0, append, starts) + ((ragged,) if ragged else ())
    return _Static(_constants(kp, vp, hkv, d, scale), src.inputs("partial", mk, mv, has_win, fused, append, starts,
                                                                 ragged),
                   tmpl, grid, outs, [("MV", mv), ("D", d), ("CNT", cthreads), ("OT", qdtype)], (cthreads * nq, hkv, b),
                   splits, qb, key, [s for s, _ in outs],
                   [t for _, t in outs], _counts(grid[1] * grid[2]) if fused else None, cthreads, nt)


def split_counts(q_enc: int) -> tuple[int, int]:
    """(splits of the scalar loop's split size, splits of tuning's tokens_per_split) for q_enc encoded tokens: what
    a launch's per-shape part depends on besides the shapes."""
    t = tuning.current()
    return -(-q_enc // (t.tokens_per_split if q_enc <= 8192 else t.long_split)), -(-q_enc // t.tokens_per_split)


def mixed_windows(kp: spec.Params, vp: spec.Params) -> int:
    """The HASWIN code of a MIXED partial for these roles (attention_source.MIXED_WINDOWS), 0 where their encoded
    counts never differ (kernels/append.py mixed)."""
    if not kappend.mixed(kp, vp):
        return 0
    kw, vw = kappend.role_window(kp), kappend.role_window(vp)
    return 4 if kw and vw else 2 if kw else 3


def _launch(queries: mx.array, k: PackedRecord, v: PackedRecord, scale: float, mask, flags, append_ts=None,
            extra: dict | None = None, mixed: bool = False, whole: bool = False) -> tuple:
    """(the partial launch's inputs, _static's part) of one call; `append_ts` and `extra` (the arrays kx, kconst,
    vx, vconst): the decode step's append inside (accelerated/kernels/decode_step.py); `mixed`: the MIXED partial
    (attention_source.MIXED_WINDOWS) for roles whose encoded counts may differ (nenc: the common prefix); `whole`:
    the windows as whole buffers (the decode step sets kwb, vwb and wrow per step: here the views stand in)."""
    b, hq, l, d = queries.shape
    q_enc = min(k.encoded, v.encoded) if mixed else k.encoded
    kw, vw = k.window, v.window
    q_enc_splits, q_fine = split_counts(q_enc)
    starts = isinstance(mask, RowStarts)
    causal = mask.causal if starts else (isinstance(mask, str) and mask == "causal")
    haswin = mixed_windows(k.params, v.params) if mixed else kw.shape[2] > 0
    ragged = isinstance(k, RaggedRecord)
    st = _static(k.params, v.params, b, hq, l, d, kw.shape[1], q_enc_splits, haswin, causal,
                 queries.dtype, float(scale), _fused() and append_ts is None and not ragged, q_fine, tuning.current(),
                 append_ts, starts, ragged)
    if whole:
        st = _whole(st)
    if flags is None:          # order after the in-place store of the newest rows (kernels.commit / append)
        flags = k.token
        if v.token is not None and v.token is not k.token:
            v.sync()
    flags = km.order(flags)
    arrays = {"q": queries, "f_c": st.consts, "nenc": km.count(q_enc), "flags": flags, "kw": kw, "vw": vw,
              "kwb": kw, "vwb": vw, "wrow": km.count(0),
              "cnt": st.counts, "rstart": mask.starts if starts else None,
              # (MIXED: the KIVI role's phases, the values' unless the keys are KIVI)
              "rphase": (v if mixed and k.params.method != "kivi" else k).phases if ragged else None,
              **_record_inputs(k, "k"),
              **_record_inputs(v, "v"), **(extra or {})}
    return [arrays[n] for n in st.names], st


def _whole(st: _Static) -> _Static:
    """A plan's static part with the windows passed whole (tuning's whole_windows: a decode step's launch): the
    inputs kwb, vwb and wrow (attention_source.inputs), the key's tail (ragged, True) naming its kernel."""
    mk, mv, haswin, fused, _, _, append, starts, *ragged = st.key
    ragged = ragged[0] if ragged else False
    return st._replace(names=src.inputs("partial", mk, mv, haswin, fused, append, starts, ragged, True),
                       key=st.key[:8] + (ragged, True))


def launch_plan(queries: mx.array, k: PackedRecord, v: PackedRecord, scale: float, mask=None,
                flags: mx.array | None = None, append_ts=None, extra: dict | None = None, mixed: bool = False) -> Plan:
    ins, st = _launch(queries, k, v, scale, mask, flags, append_ts, extra, mixed)
    return Plan(ins, st.template, st.grid, st.outs, st.combine_template, st.combine_grid, st.combine_threads,
                tuple(queries.shape), st.splits, st.qb, st.names, st.key, st.key[3])


def attention(queries: mx.array, k: PackedRecord, v: PackedRecord, scale: float, mask=None,
              flags: mx.array | None = None, mixed: bool = False) -> mx.array:
    """softmax(scale q K^T [+ causal]) V over two packed records, on the GPU; (B, Hq, L, d) in the
    queries' dtype; `mixed`: the MIXED partial (records whose encoded counts may differ: _launch)."""
    ins, st = _launch(queries, k, v, scale, mask, flags, mixed=mixed)
    call = dict(template=st.template, grid=st.grid, threadgroup=(st.threads, 1, 1), output_shapes=st.out_shapes,
                output_dtypes=st.out_dtypes)
    outs = _kernel("partial", *st.key)(inputs=ins, **call)
    if st.key[3]:
        return outs[2]
    o_acc, o_ml = outs
    (out,) = _kernel("combine")(inputs=[o_acc, o_ml, st.consts, queries], template=st.combine_template,
                                **combine_call(st, queries))
    return out


def combine_call(st: _Static, queries: mx.array, summary: bool = False) -> dict:
    """The combine launch's keyword arguments but its inputs ([o_acc, o_ml, st.consts, queries], and a chunk's token
    with `summary`) and template (st.combine_template); `summary`: the kernel of _kernel("combine", append=True),
    whose second output is the token's summary (attention_source.COMBINE_SUMMARY: append.py's token of one group)."""
    return dict(grid=st.combine_grid, threadgroup=(st.combine_threads, 1, 1),
                output_shapes=[tuple(queries.shape)] + ([(2, 1, 2)] if summary else []),
                output_dtypes=[queries.dtype] + ([mx.bool_] if summary else []))


def fuse_append() -> bool:
    """A decode step's append inside the partial launch (tuning's fuse_append): CUDA only. Measured and run there;
    Metal keeps the append kernel's own launch until the APPEND partial has run on an Apple GPU."""
    return tuning.current().fuse_append and backend.backend() == "cuda"


def _fused() -> bool:
    """The combine inside the partial launch: CUDA (and the CPU emulation of its body). Metal keeps its own
    combine launch: the last-block count relies on device-wide visibility between threadgroups of one
    launch, which we could not test on an Apple GPU."""
    return tuning.current().fuse_combine and backend.backend() != "metal"


@functools.lru_cache(maxsize=64)
def _counts(n: int) -> mx.array:
    """The fused partial's per-group counters (zero between launches: the last block of a group sets its
    count back). One array per size; launches that share it run in stream order (MLX's one stream per
    device stream), so no two of them count at once."""
    a = mx.zeros((n,), dtype=mx.int32)
    mx.eval(a)
    return a


def _stream_bits(p: spec.Params) -> int:
    """Code bits per coordinate the tensor-core loop loads for a role: both streams of turboquant_rvq and prod."""
    b1, b2 = km._code_bits(p)
    return b1 + (b2 if p.method in ("turboquant_rvq", "turboquant_prod") else 0)


def _tc_prefetch(kp: spec.Params, vp: spec.Params, depth: int) -> int:
    """The tensor-core loop's prefetch depth (template PF): tuning's tc_prefetch, lowered where a second code
    stream (turboquant_rvq, prod's signs) would make the prefetched register sets larger than turboquant b4's at
    that depth (8 code bits per coordinate over keys and values). Each chunk held ahead keeps its words in
    registers, beside the accumulators and mma operands, within the 255 a thread has under the launch bounds: b4's
    depth is the one measured (ptxas fits rvq 4+4 at depth 2 too, without spills; which depth is faster is for the
    H200 to say). prod values: 0 (each chunk loaded at its start): their second accumulator takes D / 4 more
    registers a thread, and at depth 1 nvcc spilled some pairs (sm_80 / sm_90)."""
    if vp.method == "turboquant_prod":
        return 0
    if kp.method == "turboquant_prod" and 3 in (km._code_bits(kp)[0], km._code_bits(vp)[0]):
        return min(depth, 1)        # (tc_prod3: a 3-bit role's raw words beside the signs' spilled at two, nvcc sm_90)
    bits = _stream_bits(kp) + _stream_bits(vp)
    if bits <= 8:           # every one-stream pair (turboquant b4's 8 at most)
        return depth
    return max(1, depth * 8 // bits)


def _loop(kp: spec.Params, vp: spec.Params, bits: tuple) -> int | bool:
    """Which tensor-core loop a pair that takes one runs: TC_MIX (turboquant keys, KIVI values), TC_MIXK (KIVI keys,
    turboquant values), TC_TENS (a role of 3-bit codes, `bits` the roles' first streams'), or True (the others)."""
    if attention_tc.mixed_pair(kp, vp):
        return src.TC_MIX
    return src.TC_MIXK if attention_tc.mixkv_pair(kp, vp) else src.TC_TENS if 3 in bits else True


def _tensor_cores(kp: spec.Params, vp: spec.Params, d: int, has_win: bool, codes: bool = False,
                  kivi: bool = False, affine: bool = False, three: bool = False, two: bool = False,
                  prod3: bool = False, mixed: bool = False, mixkv: bool = False) -> bool:
    """Whether the partial kernel takes the tensor-core loop: a pair of roles its loops hold (attention_tc.takes, by
    the tc_* knobs given) on a CUDA GPU with mma.m16n8k16 (sm_80 and later)."""
    return attention_tc.takes(kp, vp, d, has_win, int(has_win) in src.MIXED_WINDOWS, codes, kivi, affine, three, two,
                              prod3, mixed, mixkv) and _mma_available()


@functools.lru_cache(maxsize=None)
def _mma_available() -> bool:
    if backend.backend() != "cuda":
        return False
    try:
        arch = str(mx.device_info().get("architecture", ""))
    except (AttributeError, RuntimeError, ValueError):     # an mlx without device_info: keep the scalar loop
        return False
    return arch.startswith("sm_") and arch[3:].isdigit() and int(arch[3:]) >= 80


@functools.lru_cache(maxsize=None)
def _sm_count() -> int:
    """Multiprocessors of the CUDA GPU (PTX %nsmid), read once per process with one tiny launch and a sync
    when the first tensor-core plan is made; 132 (an H100 / H200) if the probe fails."""
    try:
        k = backend.cuda_kernel(name="vq_nsmid", input_names=["x"], output_names=["n"],
                                source=loader.text("nsmid.cuh"))
        (n,) = k(inputs=[_dummy(1)], output_shapes=[(1,)], output_dtypes=[mx.int32], grid=(1, 1, 1),
                 threadgroup=(1, 1, 1))
        return max(1, int(n.item()))
    except (RuntimeError, ValueError):
        return 132


def _kernel(kind: str, mk: int = 0, mv: int = 0, haswin: bool = False, fused: bool = False, tc: bool = False,
            tc_blocks: int = 0, append: bool = False, starts: bool = False, ragged: bool = False, whole: bool = False):
    """The compiled kernel `kind`; the partial for a method pair, window presence, fused combine, tensor-core loop,
    (that loop) the threadgroups per multiprocessor its registers are bounded for (launch bounds), the decode
    step's append inside (APPEND) and row starts (a left-padded batch). The tuning knobs that change its text
    (cold_loops; partial_threads and tc_min_blocks in the launch bounds; tc_window_prefetch where a tensor-core partial
    has a window; tc_mixed_splits and tc_mixed_cost where it is a MIXED one of TC_MIX or TC_MIXK, not ragged) are part
    of the compiled kernel's key; `whole`: the windows as whole buffers (tuning's whole_windows, a decode step's
    launch)."""
    t = tuning.current()
    return _compiled(kind, mk, mv, haswin, fused, tc, tc_blocks, append, starts, t.cold_loops,
                     t.partial_threads if tc else 0, (tc_blocks or t.tc_min_blocks) if tc else 0, ragged,
                     bool(tc and haswin and t.tc_window_prefetch), whole, src.mixed_knobs(tc, haswin, ragged))


@functools.lru_cache(maxsize=None)
def _compiled(kind: str, mk: int, mv: int, haswin: bool, fused: bool, tc: bool, tc_blocks: int, append: bool,
              starts: bool, cold_loops: bool, nt: int, min_blocks: int, ragged: bool = False, wpf: bool = False,
              whole: bool = False, mix: tuple[int, int] = (1, 0)):
    be = backend.backend()
    if be is None:
        raise RuntimeError(backend.available()[1])
    header, source = src.assemble(kind, be, mk, mv, haswin, fused, tc, append, starts, ragged, whole)
    ins = src.inputs(kind, mk, mv, haswin, fused, append, starts, ragged, whole)
    outs = ((src.FUSED_OUTPUTS if fused else src.APPEND_OUTPUTS if append else src.PARTIAL_OUTPUTS)
            if kind == "partial" else src.COMBINE_APPEND_OUTPUTS if append else src.COMBINE_OUTPUTS)
    tag = f"_{mk}{mv}{int(haswin)}{int(fused)}{f't{tc_blocks}' if tc else ''}{'c3' if tc == src.TC_TENS else 'mx' if tc == src.TC_MIX else 'mk' if tc == src.TC_MIXK else ''}{'a' if append else ''}{'r' if starts else ''}{'o' if ragged == src.OWN else ''}{'g' if ragged else ''}{'b' if whole else ''}"
    name = f"vq_attention_{kind}" + (tag if kind == "partial" else "_a" if append else "")
    if be == "cuda":
        # a name of its own for a text the defaults do not make (the defaults' names stay as they were)
        d = tuning.DEFAULT
        name += ("_cold" if cold_loops else "") + (f"_n{nt}" if tc and nt != d.partial_threads else "") + \
            (f"_b{min_blocks}" if tc and not tc_blocks and min_blocks != d.tc_min_blocks else "") + \
            ("_wpf" if wpf else "") + src.mixed_tag(mix, tc, haswin, ragged)
        if cold_loops:
            header = '#define VQ_COLD _Pragma("unroll 1")\n' + header
        if wpf:         # (tuning's tc_window_prefetch: csrc/tc_window.h)
            header = "#define VQ_WPF 1\n" + header
        header = src.mixed_defines(*mix) + header    # (tuning's tc_mixed_splits: csrc/partial_setup_mixed.h)
        if tc:
            header += _bounds(nt, min_blocks)
        return backend.cuda_kernel(name=name, input_names=ins, output_names=outs, source=source, header=header,
                                   ensure_row_contiguous=False)
    return mx.fast.metal_kernel(name=name, input_names=ins, output_names=outs, source=source, header=header,
                                ensure_row_contiguous=False)


def _bounds(nt: int, min_blocks: int) -> str:
    """Header lines giving the kernel MLX writes next (`__global__ void name(...)`, which takes no attributes)
    CUDA's __launch_bounds__: ptxas then keeps registers to what min_blocks blocks of nt threads per
    multiprocessor allow. The header is the last text before that signature."""
    return "#undef __global__\n" + f"#define __global__ __location__(global) __launch_bounds__({nt}, {min_blocks})\n"
