"""Golden case tables added by spec 1.2: one case per rule that no earlier case pinned.

`cases/<method>-rules12.toml`, the format of the 1.1 rule files; every earlier file keeps its bytes. Each
case carries a flag naming what it pins and a comment with the spec chapter and section:
- `trim-state`: a trim with E > 0 that reaches past the window is the **last** op, so the state right after
  the trim (which kept tokens were dropped, how far the window was refilled) is what is compared;
- `chunk-mismatch`: appends of a chunk whose dtype, B, H or d differ from the stream's are rejected naming x,
  state unchanged (golden_format.CHUNK_MISMATCH);
- `trim-edge`: save/load before any append, trim of an empty stream, trim(0), negative n (rejected naming n),
  a trim of everything and an append after it;
- `param-error`: parameter errors beyond the range boundaries: window above window_max, head_offset
  above 2^32 - 1, exact_trim out of range, non-integer types (4.0, True), role not "k"/"v";
- `decode-error`: decode of a record with a missing or mistyped field names `record`;
- mlx_affine only: `affine-rint-large` (|edge / s| > 2^23: exact rint, not the magic-constant formula),
  `affine-all-negative` (the running max starts at -inf, not 0).
`check_cases` re-checks on the reference that each case exercises its rule (else GenerationError).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ... import spec
from ...conformance.golden_format import ExpectedError, replay
from .cases import CaseDef, GenerationError, _reference_reload
from .inputs import InputRng, cast_input
from .rules import _rule_x

U32 = (1 << 32) - 1


def _base(method: str) -> dict:
    info = spec.method_info(method)
    b = info["default_bits"]
    return {"bits": b, **({"bits2": b} if method == "turboquant_rvq" else {}),
            **({"group_size": 16} if method == "kivi" else {}),
            **({"group_size": 32} if method == "mlx_affine" else {})}


def _consumed(ops) -> int:
    return sum(n for op, n in ops if op in ("append", "reject") or op.startswith("reject_") and op != "reject_trim")


# The rule each kind of 1.2 case pins (spec/rules.toml): carried as a flag, so a case names its rule and the
# rule index (tests/test_rule_index.py) fails on a case naming an unknown one.
RULE_OF_FLAG = {"trim-state": "R-stream-trim", "chunk-mismatch": "R-num-stream-fixed",
                "trim-edge": "R-num-trim-edges", "param-error": "R-num-api-rejects",
                "decode-error": "R-num-decode-errors", "affine-rint-large": "R-affine-rint-exact",
                "affine-all-negative": "R-affine-max-from-neg-inf"}


def case_defs(method: str) -> list[CaseDef]:
    return [dataclasses.replace(c, flags=c.flags + tuple(RULE_OF_FLAG[f] for f in c.flags if f in RULE_OF_FLAG))
            for c in _case_defs(method)]


def _case_defs(method: str) -> list[CaseDef]:
    kivi, affine = method == "kivi", method == "mlx_affine"
    d = 32 if affine else 16
    file = f"cases/{method}-rules12.toml"
    base = _base(method)
    lim = spec.formats()["limits"]
    out: list[CaseDef] = []

    def P(**kw) -> spec.Params:
        return spec.Params(method=method, **{**base, **kw})

    def stream(tag, params, dtype, ops, flags, comment, x=None):
        cid = f"{method}-{tag}"
        if x is None:
            x = _rule_x(cid, (1, 1, _consumed(ops), d), dtype)   # one head: small files
        desc = " ".join(f"{op}{'' if op == 'save_load' else ' ' + str(n)}" for op, n in ops)
        out.append(CaseDef(cid, "stream", method, params.resolved(), dtype, x, tuple(flags),
                           f"{comment} [ops: {desc}]", file, ops=tuple(ops)))

    def error(tag, params, dtype, x, arg, flags, comment, kind="error", record=None):
        out.append(CaseDef(f"{method}-{tag}", kind, method, params, dtype, x, tuple(flags), comment, file,
                           error=ExpectedError("ValueError", arg), record=record))

    _stream_cases(kivi, base, d, P, stream)
    _error_cases(method, kivi, base, d, lim, P, error)
    if affine:
        out += _affine_cases(method, P, file)
    return out


def _stream_cases(kivi: bool, base: dict, d: int, P, stream) -> None:
    """Trims past the window, chunks that do not continue the stream, trim and save/load edges."""
    # -- trims with E > 0 reaching past the window; the trim is the last op (streaming.md 'Trim' 2-3)
    if kivi:
        stream("b2-g16-k-d16-f16-trim-state-000", P(window=4, exact_trim=5, role="k"), "float16",
               [("append", 40), ("append", 9), ("trim", 20)], ["trim-state", "kept-tokens", "trim", "window"],
               "pins streaming.md 'Trim' 2 (kivi): R = 4, E = 5 (C = 16), T = 49 (Q = 32, kept 16..31); trim 20 "
               "truncates to Q' = 16 and tokens 16..28 come back from the kept group (exact); the kept tokens at "
               "index >= 16 are dropped; compared right after the trim")
        stream("b2-g16-v-d16-bf16-trim-state-001", P(window=20, exact_trim=16, role="v"), "bfloat16",
               [("append", 60), ("trim", 25)], ["trim-state", "kept-tokens", "trim", "window"],
               "pins streaming.md 'Trim' 3 (kivi): R = 20, E = 16; T = 60 (Q = 32, window 32..59, kept 16..31); "
               "trim 25 leaves T' = 35: the window keeps 32..34 (3 < R), so the refill moves the kept group "
               "16..31 back in front of it (Q = 16, window 16..34, 19 < R: no more kept tokens); compared right "
               "after the trim")
    else:
        stream(f"b{base['bits']}-d{d}-f16-trim-state-000", P(window=4, exact_trim=3), "float16",
               [("append", 12), ("trim", 6)], ["trim-state", "kept-tokens", "trim", "window"],
               "pins streaming.md 'Trim' 2-3 (the example there): R = 4, E = 3, T = 12 (Q = 8, kept 5..7), one head; trim 6 "
               "drops records 6, 7 and kept tokens 6, 7; the refill moves kept token 5 back: window 5..5 "
               "(1 < R), Q = 5; compared right after the trim")
        stream(f"b{base['bits']}-d{d}-bf16-trim-state-001", P(window=2, exact_trim=5), "bfloat16",
               [("append", 9), ("append", 4), ("trim", 3)], ["trim-state", "kept-tokens", "trim", "window"],
               "pins streaming.md 'Trim' 3: R = 2, E = 5, T = 13 (Q = 11, kept 6..10); trim 3 removes the window "
               "and record 10; the refill stops once the window holds R = 2 tokens (8, 9), leaving kept "
               "6..7 (a refill of every kept token would store Q = 6); compared right after the trim")
    # -- chunks that do not continue the stream (number-model.md 'Which error is reported' steps 4 and 7)
    for i, dtype in enumerate(("float16", "bfloat16", "float32")):
        ops = [("append", 3), ("reject_batch", 1), ("reject_heads", 1), ("reject_dim", 1), ("reject_dtype", 1),
               ("append", 2)]
        if i == 0:
            ops = [("reject_dtype", 1)] + ops       # a first append of another dtype fixes nothing
        stream(f"b{base['bits']}-d{d}-{'f16 bf16 f32'.split()[i]}-chunk-mismatch-{i:03d}",
               P(window=1, **({"role": "v"} if kivi else {})), dtype, ops, ["chunk-mismatch", "reject", "window"],
               "pins number-model.md 'Which error is reported' 7 and 4: after the first append fixed B, H, d (and "
               "the declared dtype), chunks with B, H or d doubled or another array dtype are rejected naming x, "
               "state unchanged; the last append continues the stream")
    # -- trim and save/load edges (number-model.md, end of 'Which error is reported'; streaming.md 'Trim')
    stream(f"b{base['bits']}-d{d}-f32-trim-edge-000", P(window=2, **({"role": "v"} if kivi else {})), "float32",
           [("save_load", 0), ("trim", 0), ("trim", 3), ("reject_trim", 1), ("append", 5), ("trim", 0),
            ("reject_trim", 2), ("save_load", 0), ("trim", 9), ("trim", 1), ("append", 4)],
           ["trim-edge", "trim", "save-load-empty", "window"],
           "pins number-model.md: save/load before any append gives an empty stream; trim(0) and trims of an "
           "empty stream return 0; trim(-n) is rejected naming n, state unchanged; trim 9 of 5 tokens returns 5 "
           "and keeps B, H, d fixed; the stream continues")


def _error_cases(method: str, kivi: bool, base: dict, d: int, lim: dict, P, error) -> None:
    """Parameter errors beyond the boundaries; decode of a faulty record."""
    # -- parameter errors beyond the boundaries (number-model.md 'Which error is reported' 2)
    x = cast_input(InputRng(f"{method}-param12").normalish((1, 1, 1, d)), "float16")   # never read
    bad = [("window-max", P(window=lim["window_max"] + 1), "window", "window_max + 1"),
           ("head-offset-2p32", P(head_offset=U32 + 1), "head_offset", "head_offset = 2^32"),
           ("exact-trim-neg", P(exact_trim=-1), "exact_trim", "exact_trim = -1"),
           ("exact-trim-max", P(exact_trim=lim["exact_trim_max"] + 1), "exact_trim", "exact_trim_max + 1"),
           ("bits-float", P(bits=float(base["bits"])), "bits", f"bits = {float(base['bits'])} (a float)"),
           ("head-offset-bool", P(head_offset=True), "head_offset", "head_offset = True (a bool is not an integer)"),
           ("seed-float", P(seed=1.0), "seed", "seed = 1.0 (a float)"),
           ("layer-bool", P(layer=False), "layer", "layer = False"),
           ("role-upper", P(role="K"), "role", "role = 'K'"),
           ("window-float", P(window=2.0), "window", "window = 2.0"),
           ("exact-trim-role", P(exact_trim=-1, role="q"), "role", "role before exact_trim (both invalid)")]
    for tag, params, arg, what in bad:
        error(f"{tag}-d{d}-param-error-000", params, "float16", x, arg, ["error", "params", "param-error"],
              f"pins number-model.md 'Which error is reported' 2: {what} is rejected naming {arg}")
    # -- decode of a faulty record names `record` (number-model.md, decode's checks)
    p0 = P(window=1, **({"role": "v"} if kivi else {})).resolved()
    xd = _rule_x(f"{method}-decode12", (1, 1, 17 if kivi else 3, d), "bfloat16")
    from ... import reference
    rec = reference.encode(xd, p0, "bfloat16")
    first = next(k for k in rec if k != "window")
    missing = {k: v for k, v in rec.items() if k != first}
    error(f"missing-{first}-d{d}-decode-error-000", p0, "bfloat16", xd, "record", ["error", "decode-error"],
          f"pins number-model.md: decode of a record without field {first!r} names record", kind="decode_error",
          record=missing)
    mistyped = dict(rec)
    mistyped["window"] = (rec["window"].astype(np.uint32) << np.uint32(16)).view(np.float32)   # same values, f32
    error(f"window-f32-d{d}-decode-error-001", p0, "bfloat16", xd, "record", ["error", "decode-error"],
          "pins number-model.md: decode of a bfloat16 record whose window is a float32 array (the same values) "
          "names record", kind="decode_error", record=mistyped)
    last = [k for k in rec if k != "window"][-1]
    mt = dict(rec)
    mt[last] = rec[last].astype(np.float64 if rec[last].dtype.kind == "f" else np.int64)
    error(f"{last}-wide-d{d}-decode-error-002", p0, "bfloat16", xd, "record", ["error", "decode-error"],
          f"pins number-model.md: decode of a record whose field {last!r} is {mt[last].dtype} instead of "
          f"{rec[last].dtype} names record", kind="decode_error", record=mt)


def _affine_cases(method: str, P, file: str) -> list[CaseDef]:
    """mlx_affine: exact rint beyond 2^22, the running max from -inf (methods/mlx_affine.md steps 1, 5)."""
    out: list[CaseDef] = []
    rng = InputRng("affine-rint-large")
    ulps = rng.ints(4 * 64, 0, 3).reshape(1, 1, 4, 64).astype(np.float32) * np.float32(2.0 ** -23)
    w = np.empty((1, 1, 4, 64), np.float32)
    w[0, 0, 0] = -(1 + 2.0 ** -23)                  # constant: edge / s = 10000001 (odd, above 2^23)
    w[0, 0, 1:] = np.float32(-0.6) * (1 + ulps[0, 0, 1:])   # near-constant: edge / s in (-2^23, -2^22)
    w[0, 0, 3, 32:] = 1 + ulps[0, 0, 3, 32:]         # near-constant positive: edge / s ~ -1e7
    out.append(CaseDef(f"{method}-b4-g32-d64-f32-rint-large-000", "encode", method,
                       P(bits=4, window=0).resolved(), "float32", w, ("affine-rint-large",),
                       "pins methods/mlx_affine.md step 5: near-constant groups, s = EPS: a constant group at "
                       "-(1 + 2^-23) gives edge / s = 10000001, groups near -0.6 give edge / s in (-2^23, -2^22) "
                       "with halves; (y + 0x1.8p23) - 0x1.8p23 rounds both wrong, exact rint does not", file))
    for k, (bits, dtype) in enumerate(((4, "float16"), (4, "bfloat16"), (8, "float32"))):
        v = -np.abs(InputRng(f"affine-neg-{k}").normalish((1, 2, 2, 64))) - 0.25
        out.append(CaseDef(f"{method}-b{bits}-g32-d64-{'f16 bf16 f32'.split()[k]}-all-negative-{k:03d}",
                           "encode", method, P(bits=bits, window=0).resolved(), dtype, cast_input(v, dtype),
                           ("affine-all-negative",),
                           "pins methods/mlx_affine.md step 1: groups of negative values only; the maximum "
                           "is the largest element (a running max started at 0, as MLX's GPU backends do, "
                           "gives M = 0 and another scale and bias)", file))
    return out


# ----------------------------------------------------------------------------------------------------
# Checks that each case exercises its rule (run by golden.generate_cases, so by regen and check)

def _replay_record(c, params):
    from ...reference import stream as _reference_stream
    from ... import reference
    s, _ = replay(reference.stream.Stream(params, c.dtype), c.x, c.ops, _reference_reload)
    return s


def check_cases(cases) -> None:
    from ... import reference
    for c in cases:
        if "trim-state" in c.flags:
            if c.ops[-1][0] != "trim":
                raise GenerationError(f"{c.id}: the last op is not a trim")
            plain = _replay_record(c, dataclasses.replace(c.params, exact_trim=0)).record()
            if all(plain[k].shape == c.record[k].shape and np.array_equal(plain[k], c.record[k]) for k in plain):
                raise GenerationError(f"{c.id}: E = 0 stores the same record after the trim")
            if not c.record["window"].shape[2] < c.params.window + (c.params.group_size or 1) and \
                    c.method != "kivi":
                raise GenerationError(f"{c.id}: the window after the trim is not short")
        if "affine-rint-large" in c.flags:
            from ...reference import mlx_affine, numerics
            w = numerics.upcast(c.x, c.dtype).reshape(-1, c.params.group_size)
            lo, hi = w.min(-1), w.max(-1)
            flip = np.abs(lo) > np.abs(hi)
            s = np.maximum((hi - lo) / np.float32(2 ** c.params.bits - 1), mlx_affine.EPS)
            y = np.where(flip, lo, hi) / np.where(flip, s, -s)
            if (numerics.rint(y) != np.rint(y)).sum() < 2:
                raise GenerationError(f"{c.id}: the magic-constant rint agrees with exact rint on q0")
        if "affine-all-negative" in c.flags:
            from ...reference import numerics
            if not (numerics.upcast(c.x, c.dtype) < 0).all():
                raise GenerationError(f"{c.id}: not every input value is negative")
        if c.kind == "decode_error":
            try:
                reference.decode(c.record, c.params, c.dtype)
            except ValueError as e:
                if not str(e).startswith("record:"):
                    raise GenerationError(f"{c.id}: the reference names another argument: {e}") from e
            else:
                raise GenerationError(f"{c.id}: the reference decodes the faulty record")


# ----------------------------------------------------------------------------------------------------
# Component vectors: the cast of decoded binary32 values to the model dtype (cases/cast.toml)

def _f32(*bits: int) -> np.ndarray:
    return np.array(bits, dtype=np.uint32).view(np.float32)


def cast_vectors() -> dict[str, list]:
    """number-model.md 'Outputs': binary32 -> float16 / bfloat16, RNE, beyond the finite range ±Inf."""
    from ...conformance.golden_format import hexarr
    from ...reference import numerics
    sets = [
        ("cast-fp16-ties", "float16 ties to even: 1 + 2^-11 -> 1, 1 + 3*2^-11 -> 1 + 2^-9, and their negatives",
         _f32(0x3F801000, 0x3F803000, 0xBF801000, 0xBF803000, 0x3F801001, 0x3F800FFF)),
        ("cast-fp16-overflow", "float16 range: 65504 stays, 65519.996 -> 65504, 65520 (the tie) -> +Inf, "
         "-65520 -> -Inf, 1e10 and the largest binary32 -> ±Inf",
         _f32(0x477FE000, 0x477FEFFF, 0x477FF000, 0xC77FF000, 0x501502F9, 0x7F7FFFFF, 0xFF7FFFFF)),
        ("cast-fp16-subnormal", "float16 subnormals: 2^-24 stays, 2^-25 (a tie) -> +0, 3*2^-25 -> 2^-23, "
         "-2^-25 -> -0, 2^-26 -> +0, ±0",
         _f32(0x33800000, 0x33000000, 0x33C00000, 0xB3000000, 0x32800000, 0x00000000, 0x80000000)),
        ("cast-bf16-ties", "bfloat16 ties to even: 1 + 2^-8 -> 1, 1 + 3*2^-8 -> 1 + 2^-6, just above a tie -> up",
         _f32(0x3F808000, 0x3F818000, 0xBF808000, 0x3F808001, 0x3F807FFF)),
        ("cast-bf16-overflow", "bfloat16 range: the largest binary32 and 0x7F7F8000 (a tie whose even "
         "neighbour is Inf) -> +Inf, 0x7F7F7FFF -> 0x7F7F (finite), negatives likewise",
         _f32(0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0xFF7FFFFF, 0xFF7F8000)),
        ("cast-bf16-subnormal", "bfloat16 subnormals: 0x00008000 (a tie) -> +0, 0x00018000 -> 0x0002, the "
         "smallest binary32 subnormal -> +0, -0",
         _f32(0x00008000, 0x00018000, 0x00000001, 0x80000001, 0x80000000)),
    ]
    rng = InputRng("cast-random")
    v = (rng.normalish((64,)) * 2.0 ** rng.ints(64, -30, 20)).astype(np.float32)
    sets.append(("cast-random", "64 values from 2^-30 to 2^20 times a normal-ish value", v))
    out = []
    for cid, comment, x in sets:
        out.append({"id": cid, "comment": comment, "x": hexarr(x, "float32"),
                    "float16": hexarr(numerics.to_float16(x), "float16"),
                    "bfloat16": hexarr(numerics.to_bfloat16_bits(x), "bfloat16")})
    return {"cast": out}
