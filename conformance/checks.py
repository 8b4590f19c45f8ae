"""Check functions: each runs an implementation and raises `assertions.Mismatch` (an AssertionError) when
it does not conform. Tests call them; test_mutants calls them on broken implementations and asserts
that they fail. Nothing here quantizes: expectations come from the reference or the golden files. These are
the bit-exact tier; the tolerance tier (attention and its budget) is attention_checks.py.
"""
from __future__ import annotations

import numpy as np

from .. import spec
from ..spec import Params

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
