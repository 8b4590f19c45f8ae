"""Check functions: each runs an implementation and raises `assertions.Mismatch` (an AssertionError) when
it does not conform. Tests call them; test_mutants calls them on broken implementations and asserts
that they fail. Nothing here quantizes: expectations come from the reference or the golden files.
"""
from __future__ import annotations

import numpy as np

from veloxquant import spec
from veloxquant.spec import Params

from . import golden_format as golden

from .adapters.base import Implementation, Unsupported
from .assertions import Mismatch, assert_exact, assert_record_exact, call_desc


def _outcome(fn, *args):
    try:
        return fn(*args), None
    except Unsupported:
        raise
    except Exception as e:  # noqa: BLE001 - the kind of exception is part of what is checked
        return None, e


def _argname(err: Exception) -> str:
    """The argument a spec ValueError names: the text before the first ':' (e.g. 'x', 'bits')."""
    return str(err).split(":", 1)[0].strip()


def check_raises(fn, args, argname: str, what: str) -> None:
    """fn(*args) raises ValueError whose message names `argname`."""
    res, err = _outcome(fn, *args)
    if err is None:
        raise Mismatch(f"{what}: accepted; expected ValueError naming {argname!r}")
    if not isinstance(err, ValueError):
        raise Mismatch(f"{what}: raised {type(err).__name__}: {err}; expected ValueError naming {argname!r}")
    if not golden._names(err, argname):     # number-model.md 'Error messages': "<argument>: ..."
        raise Mismatch(f"{what}: ValueError {str(err)!r} does not name the argument {argname!r} (the message "
                       f"must start with '{argname}:')")


def _same_outcome(what, r_imp, e_imp, r_ref, e_ref):
    """Both raise ValueError naming the same argument, or neither raises. Returns True if results follow."""
    if e_ref is not None:
        if not isinstance(e_ref, ValueError):
            raise e_ref  # the reference itself is broken: not a verdict on the implementation
        if e_imp is None:
            raise Mismatch(f"{what}: accepted, but the reference rejects it: {e_ref}")
        arg = _argname(e_ref)
        if not isinstance(e_imp, ValueError) or arg not in str(e_imp):
            raise Mismatch(f"{what}: raised {type(e_imp).__name__}: {e_imp}; the reference raises "
                           f"ValueError naming {arg!r}: {e_ref}")
        return False
    if e_imp is not None:
        raise Mismatch(f"{what}: raised {type(e_imp).__name__}: {e_imp}; the reference accepts it") from e_imp
    return True


def check_encode(impl: Implementation, ref: Implementation, x, params: Params, dtype: str):
    """impl.encode is bit-exact with the reference (or both reject with the same argument).
    Returns the reference record (None if rejected)."""
    what = call_desc(f"{impl.name}.encode", params, dtype, np.shape(x))
    r_ref, e_ref = _outcome(ref.encode, x, params, dtype)
    r_imp, e_imp = _outcome(impl.encode, x, params, dtype)
    if _same_outcome(what, r_imp, e_imp, r_ref, e_ref):
        assert_record_exact(r_imp, r_ref, what)
        return r_ref
    return None


def check_decode(impl: Implementation, ref: Implementation, record, params: Params, dtype: str):
    """impl.decode of a (reference) record is bit-exact with the reference's decode."""
    shape = next(iter(record.values())).shape if record else None
    what = call_desc(f"{impl.name}.decode", params, dtype, shape=None, record_shapes={
        k: tuple(v.shape) for k, v in record.items()}) if shape is not None else f"{impl.name}.decode"
    expected = ref.decode(record, params, dtype)
    actual = impl.decode({k: v.copy() for k, v in record.items()}, params, dtype)
    assert_exact(np.asarray(actual), np.asarray(expected, dtype=np.float32), what)


def check_encode_decode(impl, ref, x, params, dtype) -> None:
    rec = check_encode(impl, ref, x, params, dtype)
    if rec is not None:
        check_decode(impl, ref, rec, params, dtype)


# --- golden ---------------------------------------------------------------------------------------------
def check_golden(impl: Implementation, case) -> None:
    """One golden case (conformance/golden_format.py GoldenCase): kind "error" must raise the named ValueError; kind
    "encode" must store the expected record; kind "stream" replays its ops (("append", n) takes the next n
    tokens of x; ("trim", n); ("reject", n): that append must fail naming x, state unchanged; ("save_load", 0):
    continue with impl.load_stream(stream.save())) and must return the expected trim counts and store the
    expected record;
    decoding the expected record must give the expected values. All exact."""
    p = case.params
    base = dict(golden=case.id)
    if case.kind == "error":
        what = call_desc(f"{impl.name}.encode", p, case.dtype, np.shape(case.x), **base)
        check_raises(impl.encode, (case.x, p, case.dtype), case.error.argument, what)
        return
    if case.kind == "decode_error":   # spec 1.2: a faulty record (missing or mistyped field)
        what = call_desc(f"{impl.name}.decode", p, case.dtype, **base, record_fields={
            k: f"{v.dtype}{list(v.shape)}" for k, v in case.record.items()})
        check_raises(impl.decode, ({k: np.array(v, copy=True) for k, v in case.record.items()}, p, case.dtype),
                     case.error.argument, what)
        return
    if case.kind == "stream":
        what = call_desc(f"{impl.name}.Stream", p, case.dtype, ops=list(case.ops), **base)
        try:
            s, trims = golden.replay(impl.new_stream(p, case.dtype), case.x, case.ops,
                                     lambda st: impl.load_stream(st.save()))
        except golden.ReplayMismatch as e:
            raise Mismatch(f"{what}: {e}") from None
        if case.trimmed is not None and list(map(int, trims)) != [int(v) for v in np.ravel(case.trimmed)]:
            raise Mismatch(f"{what}: trim returned {trims}, expected {list(np.ravel(case.trimmed))}")
        assert_record_exact(s.record(), case.record, what)
    else:
        what = call_desc(f"{impl.name}.encode", p, case.dtype, np.shape(case.x), **base)
        assert_record_exact(impl.encode(np.array(case.x, copy=True), p, case.dtype), case.record, what)
    if case.decoded is not None:
        dwhat = call_desc(f"{impl.name}.decode", p, case.dtype, **base)
        got = impl.decode({k: np.array(v, copy=True) for k, v in case.record.items()}, p, case.dtype)
        assert_exact(np.asarray(got), np.asarray(case.decoded), dwhat)


def _argname_of(s: str) -> str:
    return s.split(":", 1)[0].strip()


# --- codebooks ------------------------------------------------------------------------------------------
def fp16_finite_values() -> np.ndarray:
    """Every finite float16 bit pattern (63,488 of 65,536: +-0 and subnormals included), as binary32."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    v = bits.view(np.float16)
    return v[np.isfinite(v)].astype(np.float32)


def tie_values(boundaries: np.ndarray) -> np.ndarray:
    """Each scaled boundary and its two binary32 neighbours: the exact ties of codebooks.md."""
    b = np.asarray(boundaries, dtype=np.float32)
    return np.concatenate([b, np.nextafter(b, np.float32(np.inf)), np.nextafter(b, np.float32(-np.inf)),
                           np.array([0.0, -0.0, 2.0 ** -149, -(2.0 ** -149)], dtype=np.float32)])


def codebook_table(codebook: tuple) -> spec.Codebook:
    kind, *bits = codebook
    return spec.gaussian(*bits) if kind == "gaussian" else spec.residual(*bits)


def check_codebook(impl: Implementation, ref: Implementation, codebook: tuple, d: int, u=None) -> int:
    """quantize over `u` (default: all finite fp16 values plus the ties), dequantize over every index and
    over quantize's output, all bit-exact with the reference. Returns the number of values checked."""
    if u is None:
        scaled_b = codebook_table(codebook).boundaries * spec.scale(d)
        u = np.concatenate([fp16_finite_values(), tie_values(scaled_b.astype(np.float32))])
    name = "/".join(str(c) for c in codebook)
    qi = impl.quantize(u.copy(), codebook, d)
    qr = ref.quantize(u.copy(), codebook, d)
    assert_exact(np.asarray(qi, dtype=np.uint32), np.asarray(qr, dtype=np.uint32),
                 f"{impl.name}.quantize(u=<{u.size} values>, codebook={name}, d={d})")
    k = codebook_table(codebook).centroids.size
    idx = np.arange(k, dtype=np.uint32)
    assert_exact(impl.dequantize(idx.copy(), codebook, d), ref.dequantize(idx.copy(), codebook, d),
                 f"{impl.name}.dequantize(idx=0..{k - 1}, codebook={name}, d={d})")
    qr = np.asarray(qr, dtype=np.uint32)
    assert_exact(impl.dequantize(qr.copy(), codebook, d), ref.dequantize(qr.copy(), codebook, d),
                 f"{impl.name}.dequantize(quantize(u), codebook={name}, d={d})")
    return int(u.size)


# --- streams --------------------------------------------------------------------------------------------
def _snapshot(stream):
    return stream.tokens, stream.record()


def check_stream_matches_oneshot(impl: Implementation, ref: Implementation, x, params: Params, dtype: str,
                                 chunks: list[int]) -> None:
    """Appending x in `chunks` stores exactly the bytes of the reference's one-shot encode (streaming.md)."""
    assert sum(chunks) == x.shape[2]
    s = impl.new_stream(params, dtype)
    t = 0
    for c in chunks:
        s.append(x[:, :, t:t + c].copy())
        t += c
    what = call_desc(f"{impl.name}.Stream.append", params, dtype, x.shape, chunks=chunks)
    if s.tokens != x.shape[2]:
        raise Mismatch(f"{what}: tokens {s.tokens} != {x.shape[2]}")
    assert_record_exact(s.record(), ref.encode(x, params, dtype), what + " vs reference one-shot encode")


def check_exact_trims(impl: Implementation, ref: Implementation, prefill, cycles, params: Params,
                      dtype: str) -> None:
    """streaming.md "Exact trims": from a one-shot state, each cycle appends a chunk and trims n <= E of its
    tokens (speculative decoding: append the draft, trim the rejected part); after every cycle the stored
    bytes equal the reference's one-shot encode of the surviving tokens. `cycles`: [(chunk, n), ...]."""
    s = impl.new_stream(params, dtype)
    s.append(prefill.copy())
    xs = prefill
    for i, (chunk, n) in enumerate(cycles):
        assert n <= min(params.exact_trim, chunk.shape[2])
        s.append(chunk.copy())
        got = s.trim(n)
        xs = np.concatenate([xs, chunk], axis=2)[:, :, :xs.shape[2] + chunk.shape[2] - n]
        what = call_desc(f"{impl.name}.Stream", params, dtype, prefill=prefill.shape[2],
                         cycles=" ".join(f"+{c.shape[2]}-{k}" for c, k in cycles[:i + 1]))
        if got != n or s.tokens != xs.shape[2]:
            raise Mismatch(f"{what}: trim returned {got}, tokens {s.tokens}; expected {n}, {xs.shape[2]}")
        assert_record_exact(s.record(), ref.encode(xs, params, dtype),
                            what + " vs reference one-shot encode of the surviving tokens")


def replay(impl: Implementation, params: Params, dtype: str, ops: list) -> list:
    """Run ops on a fresh stream; returns per op (tokens, record, trim result). Ops: ("append", x),
    ("trim", n), ("save_load",)."""
    s = impl.new_stream(params, dtype)
    out = []
    for op in ops:
        r = None
        if op[0] == "append":
            s.append(op[1].copy())
        elif op[0] == "trim":
            r = s.trim(op[1])
        elif op[0] == "save_load":
            s = impl.load_stream(s.save())
        else:
            raise ValueError(op[0])
        out.append((s.tokens, s.record(), r))
    return out


def op_desc(op) -> str:
    if op[0] == "append":
        return f"append(T={op[1].shape[2]})"
    if op[0] == "trim":
        return f"trim({op[1]})"
    return op[0]


def check_stream_replay(impl: Implementation, ref: Implementation, params: Params, dtype: str, ops: list) -> None:
    """After every op the implementation's stream equals the reference replaying the same ops."""
    got = replay(impl, params, dtype, ops)
    exp = replay(ref, params, dtype, ops)
    for i, (g, e) in enumerate(zip(got, exp)):
        what = call_desc(f"{impl.name}.Stream", params, dtype,
                         ops=" ".join(op_desc(o) for o in ops[:i + 1]))
        if g[0] != e[0] or g[2] != e[2]:
            raise Mismatch(f"{what}: tokens/trim result ({g[0]}, {g[2]}) != reference ({e[0]}, {e[2]})")
        assert_record_exact(g[1], e[1], what)


def check_stream_rejects(impl: Implementation, params: Params, dtype: str, prefix, bad, argname: str,
                         after=None) -> None:
    """A rejected append raises ValueError naming `argname` and leaves the stream byte-identical; a later
    good append continues exactly as if the bad one never happened."""
    s = impl.new_stream(params, dtype)
    if prefix is not None:
        s.append(prefix.copy())
    t0, r0 = _snapshot(s)
    what = call_desc(f"{impl.name}.Stream.append", params, dtype, np.shape(bad), after_tokens=t0)
    check_raises(s.append, (bad,), argname, what)
    t1, r1 = _snapshot(s)
    if t1 != t0:
        raise Mismatch(f"{what}: rejected append changed tokens {t0} -> {t1}")
    assert_record_exact(r1, r0, what + " state after the rejected append")
    if after is not None:
        try:
            s.append(after.copy())
        except ValueError as e:
            raise Mismatch(f"{what}: after the rejected append, a good append of shape {np.shape(after)} was "
                           f"rejected too ({e}); the rejected chunk must leave no trace") from None
        clean = impl.new_stream(params, dtype)
        if prefix is not None:
            clean.append(prefix.copy())
        clean.append(after.copy())
        assert_record_exact(s.record(), clean.record(), what + " then a good append")


def _to_input_dtype(v32: np.ndarray, dtype: str) -> np.ndarray:
    """binary32 -> the input dtype's interchange array, RNE (bf16 as uint16 patterns; values finite)."""
    v32 = np.ascontiguousarray(v32, dtype=np.float32)
    if dtype == "float32":
        return v32.copy()
    if dtype == "float16":
        return v32.astype(np.float16)
    b = v32.view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def check_kivi_trim_put_back(impl: Implementation, params: Params, dtype: str, x, n: int) -> None:
    """streaming.md 'Trim' step 2 for kivi, checked without the reference: after appending x and trimming n
    tokens into the encoded prefix, the prefix is the old one cut to Q' = G*floor(T'/G) and the window holds
    tokens Q'..T'-1 as the implementation's own decode of the old record, cast to the input dtype (RNE)."""
    s = impl.new_stream(params, dtype)
    s.append(x.copy())
    before = s.record()
    t = s.tokens
    dec = np.asarray(impl.decode({k: v.copy() for k, v in before.items()}, params, dtype), dtype=np.float32)
    q = t - before["window"].shape[2]
    what = call_desc(f"{impl.name}.Stream", params, dtype, np.shape(x), ops=f"append({t}) trim({n})")
    if n <= t - q:
        raise ValueError(f"check_kivi_trim_put_back: trim {n} does not reach the encoded prefix (Q={q}, T={t})")
    got = s.trim(n)
    t2 = t - min(n, t)
    g = params.group_size
    q2 = g * (t2 // g)
    if got != min(n, t) or s.tokens != t2:
        raise Mismatch(f"{what}: trim returned {got}, tokens {s.tokens}; expected {min(n, t)}, {t2}")
    rec = s.record()
    want_window = _to_input_dtype(dec[:, :, q2:t2], dtype)
    assert_exact(np.asarray(rec["window"]), want_window,
                 what + f": window after the trim vs the decoded tokens {q2}..{t2 - 1} of the record before it")
    per_group = params.role == "k"      # key records hold one scale/zero row per group of G tokens
    for k, v in before.items():
        if k == "window":
            continue
        rows = q2 // g if per_group and k != "codes" else q2
        assert_exact(np.asarray(rec[k]), np.asarray(v)[:, :, :rows], what + f": field {k!r} cut to Q'={q2}")


# --- tolerance tier -------------------------------------------------------------------------------------
# Budget for softmax(scale q K^T + mask) V in binary32 against float64 on the same decoded K, V:
# - logits: a d-term dot product, |error| <= d * u * sum|q_j k_j| (u = 2^-24, any summation order);
# - softmax: exp and the normalising sum add a relative error of a few u per term plus T * u for the sum;
# - output: a T-term weighted sum, |error| <= T * u * sum_t p_t |v_t| plus the propagated logit error
#   (d|logit error| of p_t, times |v|).
# ROTATED_DOMAIN_* (spec/attention.md 'Rotated domain'): the rotation family may take scores as
# <RHT(q), y^> and sum values before one RHT_inverse, instead of using the binary32-decoded x^ = RHT_inverse
# (y^). Equal in exact arithmetic; in binary32 each side's log2(d) butterfly stages and two scalings round,
# so a logit moves by up to (2 log2 d + 4) u |q| |k| and an output coordinate by up to
# (log2 d + 2) u sum_t p_t |v_t| (Euclidean norms: the butterfly mixes all coordinates).
# GROUP_DECODE (spec/attention.md 'Budget'): float32 mlx_affine may be decoded inside the attention as one
# fused multiply-add c*S + Bi (contraction is allowed in this tier), which skips the rounding of c*S: a decoded
# coordinate moves by up to u |c S| <= u (|x^| + |Bi|), so a logit gains u sum_j |q_j| |Bi_j| and an output
# coordinate u sum_t p_t |Bi_t| (|x^| is in the terms above). Where x^ = 0 exactly and T = 1 the other terms
# are 0: the H200 kernels returned -2^-25 there (c S = -Bi rounded once). kivi and 16-bit mlx_affine get no
# such term: c*S is exact in binary32 there (c <= 255, S a float16 / bfloat16 value), so a contracted decode
# has the same bits (and mlx_affine's 16-bit decode rounds c*S to T before the add).
# ATTN_SAFETY covers implementations that use a different but legitimate order (tiles, online softmax)
# and exp approximations within a few ulp. The bound is computed per output row from these terms.
U32 = 2.0 ** -24
ATTN_SAFETY = 8.0
ROTATED_METHODS = ("turboquant", "turboquant_rvq", "turboquant_prod", "rabitq")


def causal_keep(tq: int, t: int) -> np.ndarray:
    """(Tq, T) bool: query i (position T - Tq + i) sees tokens 0 .. T - Tq + i (spec/attention.md)."""
    return np.arange(t)[None, :] <= (t - tq + np.arange(tq))[:, None]


def attention_f64(q, k, v, scale, mask=None):
    """float64 softmax attention, the tolerance tier's oracle; GQA by repeating KV heads."""
    rep = q.shape[1] // k.shape[1]
    k = np.repeat(k.astype(np.float64), rep, axis=1)
    v = np.repeat(v.astype(np.float64), rep, axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k) * float(scale)
    if mask == "causal":
        s = np.where(causal_keep(*s.shape[-2:]), s, -np.inf)
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("bhqk,bhkd->bhqd", p, v), p, k, v


def group_zero_magnitude(record, params, t: int, dtype: str = "float32") -> np.ndarray | None:
    """|Bi| of each decoded coordinate (B, H, T, d) of a float32 mlx_affine record (0 for window tokens, which
    are exact), for GROUP_DECODE; None for every other method and dtype (their c*S is exact)."""
    if params.method != "mlx_affine" or dtype != "float32":
        return None
    z = np.abs(np.asarray(record["biases" if params.method == "mlx_affine" else "zero"], dtype=np.float64))
    g = params.group_size
    if params.method == "kivi" and params.role == "k":
        z = np.repeat(z, g, axis=2)                      # (B, H, Q/G, d): one zero per channel and G tokens
    else:
        z = np.repeat(z, g, axis=3)                      # (B, H, Q, d/G): one zero per token and G channels
    out = np.zeros(z.shape[:2] + (t, z.shape[3]))
    out[:, :, :z.shape[2]] = z
    return out


def attention_budget(q, k64, v64, p, scale, rotated_k=False, rotated_v=False, kz=None, vz=None):
    d, T = q.shape[-1], k64.shape[2]
    q64 = np.abs(q.astype(np.float64)) * abs(float(scale))
    absdot = np.einsum("bhqd,bhkd->bhqk", q64, np.abs(k64))   # k64, v64: already one head per query head
    if kz is not None:          # GROUP_DECODE, keys: one skipped rounding of c*S per coordinate
        kz = np.repeat(kz, q.shape[1] // kz.shape[1], axis=1)
        absdot = absdot + np.einsum("bhqd,bhkd->bhqk", q64, kz) / (d + 2)
    logit_err = (d + 2) * U32 * absdot.max(axis=-1, keepdims=True)          # (b,h,q,1)
    if rotated_k:
        norms = np.linalg.norm(q64, axis=-1)[..., None] * np.linalg.norm(k64, axis=-1)[:, :, None, :]
        logit_err = logit_err + (2 * np.log2(d) + 4) * U32 * norms.max(axis=-1, keepdims=True)
    vmax = np.abs(v64).max(axis=2, keepdims=True)                            # (b,h,1,d)
    pv = np.einsum("bhqk,bhkd->bhqd", p, np.abs(v64))
    bound = (T + 4) * U32 * pv + 2 * logit_err * vmax + (T + 4) * U32 * vmax
    if vz is not None:          # GROUP_DECODE, values
        bound = bound + U32 * np.einsum("bhqk,bhkd->bhqd", p, np.repeat(vz, q.shape[1] // vz.shape[1], axis=1))
    if rotated_v:
        pnorm = np.einsum("bhqk,bhk->bhq", p, np.linalg.norm(v64, axis=-1))[..., None]
        bound = bound + (np.log2(d) + 2) * U32 * pnorm
    return ATTN_SAFETY * bound + np.finfo(np.float32).tiny


def check_attention(impl, ref, q, k_record, v_record, k_params, v_params, dtype, scale, mask=None) -> float:
    """impl.attention within the budget of the float64 evaluation on the reference-decoded K, V.
    Returns the worst error / budget ratio."""
    k = ref.decode(k_record, k_params, dtype)
    v = ref.decode(v_record, v_params, dtype)
    exp64, p, k64, v64 = attention_f64(q, k, v, scale, mask)
    got = np.asarray(impl.attention(q, k_record, v_record, k_params, v_params, dtype, scale, mask),
                     dtype=np.float64)
    h = k.shape[1]
    what = call_desc(f"{impl.name}.attention", k_params, dtype, q.shape, T=k.shape[2], scale=scale, mask=mask,
                     kv_heads=h, gqa=f"query head i reads KV head i // {q.shape[1] // h}")
    if got.shape != exp64.shape:
        raise Mismatch(f"{what}: shape {got.shape} != {exp64.shape}")
    budget = attention_budget(q, k64, v64, p, scale, k_params.method in ROTATED_METHODS,
                              v_params.method in ROTATED_METHODS,
                              group_zero_magnitude(k_record, k_params, k.shape[2], dtype),
                              group_zero_magnitude(v_record, v_params, v.shape[2], dtype))
    err = np.abs(got - exp64)
    ratio = err / budget
    if not np.all(np.isfinite(got)) or np.any(ratio > 1):
        i = tuple(int(j) for j in np.unravel_index(int(np.nanargmax(np.where(np.isfinite(ratio), ratio, np.inf))),
                                                    ratio.shape))
        raise Mismatch(f"{what}: {int((~(ratio <= 1)).sum())} outputs exceed the budget; worst at (b, query "
                       f"head, query, coord) {i} (KV head {i[1] // (q.shape[1] // h)}): got {got[i]!r}, "
                       f"float64 {exp64[i]!r}, error {err[i]:.3e} > budget {budget[i]:.3e}")
    return float(ratio.max())


def check_attention_head_mapping(impl, ref, method: str, rep: int, dtype: str = "float32") -> None:
    """Second check of the GQA mapping, independent of the budget: KV heads whose values are constant and
    different (head j's values are all 8(j + 1)) make query head i's output KV head i // rep's decoded
    constant, whatever the softmax weights; another mapping returns another head's constant."""
    h, t, d = 3, 50, 64
    rng = np.random.default_rng(rep)
    kw = dict(group_size=32) if method in ("kivi", "mlx_affine") else {}
    kp = spec.Params(method, window=0, role="k", **kw).resolved()
    vp = spec.Params(method, window=0, role="v", **kw).resolved()
    k = rng.standard_normal((1, h, t, d)).astype(np.float32)
    v = np.broadcast_to(8 * np.arange(1, h + 1, dtype=np.float32)[None, :, None, None], (1, h, t, d)).copy()
    if dtype != "float32":
        k, v = _to_input_dtype(k, dtype), _to_input_dtype(v, dtype)
    q = rng.standard_normal((1, h * rep, 2, d)).astype(np.float32)
    krec, vrec = ref.encode(k, kp, dtype), ref.encode(v, vp, dtype)
    got = np.asarray(impl.attention(q, krec, vrec, kp, vp, dtype, 0.125, None))
    vd = ref.decode(vrec, vp, dtype)   # decoded constants (lossy, per head)
    means = [vd[0, j].mean(axis=0) for j in range(h)]
    for i in range(h * rep):
        errs = [float(np.abs(got[0, i] - means[j]).max()) for j in range(h)]
        want = i // rep
        if not errs[want] < 1e-3 * float(np.abs(means[want]).max()):
            raise Mismatch(
                f"{call_desc(impl.name + '.attention', kp, dtype, q.shape, kv_heads=h)}: query head {i} (GQA: "
                f"{rep} query heads per KV head, {h} KV heads) should read KV head {want}; its output is "
                f"closest to KV head {int(np.argmin(errs))} (max error per KV head {[f'{e:.3g}' for e in errs]})")


def check_golden_attention(impl, case) -> float:
    """A golden attention case (golden_format.AttentionCase): impl.attention over the stored records is finite
    and within the stored budget of the stored float64 output (spec/attention.md 'Budget'); stored inputs
    encode to the stored records. Returns the worst error / budget ratio."""
    for role, x, rec, p in (("k", case.k_x, case.k_record, case.k_params), ("v", case.v_x, case.v_record,
                                                                            case.v_params)):
        if x is not None:
            what = call_desc(f"{impl.name}.encode", p, case.dtype, x.shape, golden=case.id, role=role)
            assert_record_exact(impl.encode(np.array(x, copy=True), p, case.dtype), rec, what)
    got = np.asarray(impl.attention(np.array(case.q, copy=True), {k: v.copy() for k, v in case.k_record.items()},
                                    {k: v.copy() for k, v in case.v_record.items()}, case.k_params, case.v_params,
                                    case.dtype, case.scale, case.mask), dtype=np.float64)
    h = case.k_record["window"].shape[1]
    rep = case.q.shape[1] // h
    what = call_desc(f"{impl.name}.attention", case.k_params, case.dtype, case.q.shape, golden=case.id,
                     scale=case.scale, mask=case.mask, kv_heads=h, gqa=f"query head i reads KV head i // {rep}")
    if got.shape != case.out.shape:
        raise Mismatch(f"{what}: shape {got.shape} != {case.out.shape}")
    err = np.abs(got - case.out)
    ratio = err / case.budget
    if not np.all(np.isfinite(got)) or np.any(~(ratio <= 1)):
        i = tuple(int(j) for j in np.unravel_index(int(np.nanargmax(np.where(np.isfinite(ratio), ratio, np.inf))),
                                                    ratio.shape))
        raise Mismatch(f"{what}: {int((~(ratio <= 1)).sum())} of {ratio.size} outputs exceed the golden budget; "
                       f"worst at (b, query head, query, coord) {i} (KV head {i[1] // rep}): got {got[i]!r}, "
                       f"golden float64 {case.out[i]!r}, error {err[i]:.3e} > budget {case.budget[i]:.3e}")
    return float(ratio.max())


def check_golden_cast(impl, vectors, dtype: str) -> None:
    """golden/cases/cast.toml: impl.cast(x, dtype) gives the stored bit patterns (bfloat16 as uint16)."""
    for v in vectors:
        if isinstance(v, str):
            raise Mismatch(v)
        x = golden._from_hex("float32", [len(v["x"])], v["x"])
        want = golden._from_hex(dtype, [len(v[dtype])], v[dtype])
        got = np.asarray(impl.cast(x.copy(), dtype))
        assert_exact(got, want, f"{impl.name}.cast(<{v['id']}: {v['comment']}>, {dtype})")


def check_unknown_method(impl, dtype: str = "float16") -> None:
    """An unknown method name is rejected naming `method` (number-model.md 'Which error is reported' 1),
    by encode, decode and a new stream."""
    x = np.zeros((1, 1, 2, 16), dtype=np.float16 if dtype == "float16" else np.float32)
    p = Params("turboquant_x")
    check_raises(impl.encode, (x, p, dtype), "method", call_desc(f"{impl.name}.encode", p, dtype, x.shape))
    check_raises(impl.decode, ({"window": x}, p, dtype), "method", call_desc(f"{impl.name}.decode", p, dtype))
    check_raises(impl.new_stream, (p, dtype), "method", call_desc(f"{impl.name}.new_stream", p, dtype))
