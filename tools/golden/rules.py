"""Golden rule cases (`cases/<method>-rules.toml`): one case per rule of spec/rules.toml that the method
tables (tools/golden/cases.py) do not pin, each with a flag and a comment naming the rule (spec chapter and
section), in a file of its own so every earlier file keeps its bytes. `check_cases` re-checks, on the
reference, that each rule case really exercises its rule (e.g. that a 32-bit head index would change its
record), so a case cannot silently stop pinning what its comment says.
"""
from __future__ import annotations

import numpy as np

from ... import spec
from ...conformance.golden_format import ExpectedError
from .cases import CaseDef, GenerationError
from .inputs import InputRng, cast_input, random_input, upcast

NORM_METHODS = ("turboquant", "turboquant_rvq", "turboquant_prod", "rabitq")
U32 = (1 << 32) - 1


# ----------------------------------------------------------------------------------------------------
# Rule cases

# turboquant_prod at d = 20, zero-vector tokens: the seeds below make the decode's stage B (rotation.md,
# the inverse Hᵀ with n = 1) meet an output whose 20 terms are all -0, so +0 (the spec's start) and a sum
# that starts from its first term (-0) differ in that coordinate's sign. Found by `find_stage_b_zero`;
# `check_cases` re-checks it on the reference's own values.
STAGE_B_ZERO = {"bits": 4, "seed": 750, "layer": 0, "head_offset": 53}   # find_stage_b_zero(bits=4)


def _zero_token_y_hat(p: spec.Params, heads: int, d: int) -> np.ndarray:
    """ŷ of turboquant_prod's decode for all-zero tokens (one per head): the input of RHT_inverse."""
    from ... import reference
    x = np.zeros((1, heads, 1, d), np.float32)
    rec = reference.encode(x, p, "float32")
    from ...reference import codebooks, packing, rotation
    from ...reference.prng import PURPOSE_QJL
    c, _b = codebooks.gaussian(p.bits - 1, d)
    i = packing.unpack(rec["codes"], p.bits - 1, d)
    q = packing.unpack(rec["qjl"], 1, d)
    s = np.where(q == 1, np.float32(-1.0), np.float32(1.0)).astype(np.float32)
    t = rotation.rht_inverse(s, rotation.head_signs(p, heads, d, PURPOSE_QJL))
    u_hat = codebooks.dequantize(i, c) + t * (rec["rnorm"] * spec.qjl_scale(d))[..., None]
    return u_hat * rec["norm"][..., None]


def stage_b_all_zero_terms(y_hat: np.ndarray) -> np.ndarray:
    """Per row of y_hat (..., d), d = m with n = 1: is there an output j of Hᵀ whose terms H_m[k][j]·ŷ_k
    are all -0? (Then starting from +0 gives +0, starting from the first term gives -0.)"""
    d = y_hat.shape[-1]
    m, n = spec.split_head_dim(d)
    assert n == 1 and m > 1
    hm = spec.hadamard_matrix(m)
    neg = np.signbit(y_hat) & (y_hat == 0)
    pos = ~np.signbit(y_hat) & (y_hat == 0)
    # term k of output j is -0 iff (H[k][j] = +1 and ŷ_k = -0) or (H[k][j] = -1 and ŷ_k = +0)
    term_neg = np.where(hm.T[None] > 0, neg[..., None, :], pos[..., None, :])   # (..., j, k)
    return term_neg.all(axis=-1).any(axis=-1)


def find_stage_b_zero(d: int = 20, bits: int = 3, heads: int = 64, seeds: int = 2000) -> dict | None:
    """Offline search (not run by regen/check) for the STAGE_B_ZERO parameters."""
    for seed in range(seeds):
        p = spec.Params("turboquant_prod", bits=bits, seed=seed, layer=0, head_offset=0, window=0).resolved()
        hits = stage_b_all_zero_terms(_zero_token_y_hat(p, heads, d)[0, :, 0])
        if hits.any():
            return {"bits": bits, "seed": seed, "layer": 0, "head_offset": int(np.argmax(hits))}
    return None


def _rule_x(key: str, shape, dtype: str) -> np.ndarray:
    return random_input(key, shape, dtype, "normal")


def rule_cases(method: str) -> list[CaseDef]:
    """One case per rule that the 1.0 goldens did not pin (the issue's list), d = 16 unless said."""
    out: list[CaseDef] = []
    file = f"cases/{method}-rules.toml"
    info = spec.method_info(method)
    b = info["default_bits"]
    kivi, affine = method == "kivi", method == "mlx_affine"
    d0 = 32 if affine else 16
    base = {"bits": b}
    if method == "turboquant_rvq":
        base["bits2"] = b
    if kivi:
        base["group_size"] = 16
    if affine:
        base["group_size"] = 32

    def P(**kw) -> spec.Params:
        return spec.Params(method=method, **{**base, **kw})

    def add(tag, kind, params, dtype, x, flags, comment, ops=None, error=None, resolve=True):
        out.append(CaseDef(f"{method}-{tag}", kind, method, params.resolved() if resolve else params, dtype, x,
                           tuple(flags), comment, file, ops=ops, error=error))

    def stream(tag, params, dtype, ops, flags, comment, d=d0, x=None):
        n_in = sum(n for op, n in ops if op in ("append", "reject"))
        if x is None:
            x = _rule_x(f"{method}-{tag}", (1, 2, n_in, d), dtype)
        desc = " ".join(f"{op}{'' if op == 'save_load' else ' ' + str(n)}" for op, n in ops)
        flags = list(flags) + [f for f, on in (("trim", any(op == "trim" for op, _n in ops)),
                                               ("chunked", sum(op == "append" for op, _n in ops) > 1))
                               if on and f not in flags]
        add(tag, "stream", params, dtype, x, flags, f"{comment} [ops: {desc}]", ops=tuple(ops))

    _stream_rule_cases(method, kivi, b, d0, P, add, stream)
    _window_rule_cases(method, kivi, b, d0, P, add, stream)
    _param_rule_cases(method, kivi, affine, b, d0, base, P, add)
    # -- stage B of H starts from +0 (rotation.md), turboquant_prod only (see STAGE_B_ZERO)
    if method == "turboquant_prod":
        sp = dict(STAGE_B_ZERO)
        add(f"b{sp['bits']}-d20-f32-stage-b-zero-000", "encode", P(window=0, **sp), "float32",
            np.zeros((1, 2, 2, 20), np.float32), ["zero-vector", "stage-b-zero", "head-dim"],
            f"pins rotation.md 'Hadamard transform H', stage B: sums start from +0. Zero tokens at d = 20 "
            f"(seed {sp['seed']}, head {sp['head_offset']}): decoding meets an Hᵀ output whose 20 terms are "
            "all -0, which is +0 here and -0 for a sum that starts from its first term")
    return out


def _stream_rule_cases(method: str, kivi: bool, b: int, d0: int, P, add, stream) -> None:
    """Head index, trims, rejected chunks, window flushes, save/load (rotation.md, streaming.md)."""
    # -- 64-bit global head index (rotation.md "Stream keys")
    hp = P(head_offset=U32, seed=0x0123456789ABCDEF, layer=7, window=0, **({"role": "v"} if kivi else {}))
    t = 16 if kivi else 2
    add(f"b{b}-d{d0}-f32-head-index-64-000", "encode", hp, "float32",
        _rule_x(f"{method}-hix", (1, 3, t, d0), "float32"), ["head-index-64", "max-params"],
        "pins rotation.md 'Stream keys': the global head head_offset + h is 64-bit; head_offset = 2^32-1 "
        "and H = 3 give heads 2^32-1, 2^32, 2^32+1 (a 32-bit wrap would reuse heads 0 and 1)"
        + ("; kivi and mlx_affine draw nothing from it but must accept it" if not method in NORM_METHODS else ""))
    # -- trim leaves a window shorter than R; not the one-shot state of the survivors (streaming.md "Trim")
    if kivi:
        stream("b2-g16-k-d16-f16-short-window-000", P(bits=2, window=20, role="k"), "float16",
               [("append", 40), ("trim", 26), ("append", 2)], ["short-window", "trim", "kivi-trim", "window"],
               "pins streaming.md 'Trim' (kivi): R = 20, T 40 -> 14 leaves Q' = 0 and 14 decoded tokens in the "
               "window (fewer than R); the state is not rebuilt as the one-shot encode of the survivors")
        stream("b3-g16-k-d16-f16-trim-decoded-000", P(bits=3, window=0, role="k"), "float16",
               [("append", 40), ("trim", 12), ("append", 3), ("append", 5)], ["kivi-trim", "trim"],
               "pins streaming.md 'Trim' 2 (kivi, keys): T 40 -> 28 keeps Q' = 16 and puts tokens 16..27 back "
               "into the window as their decoded values cast to the input dtype (RNE), not the original tokens; "
               "the last append encodes a new key group from 12 decoded and 4 new tokens")
        stream("b3-g16-v-d32-bf16-trim-decoded-000", P(bits=3, window=0, role="v"), "bfloat16",
               [("append", 40), ("trim", 12), ("append", 3)], ["kivi-trim", "trim"],
               "pins streaming.md 'Trim' 2 (kivi, values): T 40 -> 28 keeps Q' = 16; tokens 16..27 wait in the "
               "window as their decoded values cast to bfloat16 (RNE), not the original tokens", d=32)
    else:
        stream(f"b{b}-d{d0}-f16-short-window-000", P(window=4), "float16",
               [("append", 10), ("trim", 6), ("append", 1)], ["short-window", "trim", "window"],
               "pins streaming.md 'Trim': R = 4, T 10 -> 4 drops the window and two records; after one more "
               "token the window holds 1 < R token (Q = 4), not the one-shot state of the 5 tokens (Q = 1)")
    # -- a rejected chunk in the middle of a stream (streaming.md step 1)
    if kivi:
        ops = [("append", 10), ("reject", 3), ("append", 10), ("trim", 1), ("append", 2)]
        bad_at = 10
    else:
        ops = [("append", 5), ("reject", 3), ("append", 4), ("trim", 1), ("append", 2)]
        bad_at = 5
    x = _rule_x(f"{method}-reject", (1, 2, sum(n for _o, n in ops), d0), "float16")
    x[0, 1, bad_at + 1, 3] = np.float16(np.nan)
    stream(f"b{b}-d{d0}-f16-reject-000", P(window=0 if kivi else 2), "float16", ops, ["reject", "nan", "chunked"],
           "pins streaming.md 'Appending a chunk' 1: a chunk holding a NaN is rejected (ValueError naming x) "
           "in the middle of a stream and leaves the state unchanged; its tokens are not part of the stream", x=x)


def _window_rule_cases(method: str, kivi: bool, b: int, d0: int, P, add, stream) -> None:
    """A window token that fails its rule when flushed; save/load of a state that depends on the history."""
    # -- a window token that fails its rule when it is flushed (streaming.md step 1, consequence)
    if method in NORM_METHODS:
        ops = [("append", 3), ("append", 1), ("append", 1), ("reject", 1), ("trim", 2), ("append", 3)]
        x = _rule_x(f"{method}-flush", (1, 2, 9, d0), "bfloat16")
        x[0, 0, 3, 5] = cast_input(np.array([float.fromhex("0x1.fep+127")]), "bfloat16")[0]   # square +Inf
        stream(f"b{b}-d{d0}-bf16-flush-reject-000", P(window=2), "bfloat16", ops, ["flush-reject", "reject",
               "bf16-overflow", "window"],
               "pins streaming.md 'Appending a chunk' 1: token 3 (bf16 0x1.fep+127, norm +Inf) is accepted "
               "into the window (R = 2); the append that would flush it is rejected, state unchanged, until a "
               "trim removes it", x=x)
    elif kivi:
        ops = [("append", 10), ("reject", 6), ("trim", 1), ("append", 7)]
        x = _rule_x(f"{method}-flush", (1, 2, 23, d0), "float32")
        x[0, 1, 9, 4] = -70000.0                                   # float16 zero of its group: -Inf
        stream("b4-g16-k-d16-f32-flush-reject-000", P(bits=4, window=0, role="k"), "float32", ops,
               ["flush-reject", "reject", "fp16-range"],
               "pins streaming.md 'Appending a chunk' 1: token 9 (-70000, beyond float16) waits in the "
               "window; the append completing its group is rejected (float16 zero -Inf), state unchanged, "
               "until a trim removes the token", x=x)
    else:
        ops = [("append", 2), ("reject", 1), ("trim", 1), ("append", 2)]
        x = _rule_x(f"{method}-flush", (1, 2, 5, d0), "float32")
        x[0, 0, 1, 0], x[0, 0, 1, 1] = 3e38, -3e38                 # its group's max - min overflows
        stream(f"b{b}-g32-d32-f32-flush-reject-000", P(window=1), "float32", ops,
               ["flush-reject", "reject", "overflow", "window"],
               "pins streaming.md 'Appending a chunk' 1: token 1 (a group holding ±3e38) waits in the window "
               "(R = 1); the append that would flush it is rejected, state unchanged, until a trim removes it", x=x)
    # -- save / load of a state that depends on the history (streaming.md "Save and load")
    if kivi:
        stream("b2-g16-k-d16-f16-save-load-000", P(bits=2, window=4, role="k"), "float16",
               [("append", 40), ("trim", 6), ("save_load", 0), ("append", 1)],
               ["save-load", "trim", "window"],
               "pins streaming.md 'Save and load': after a trim inside the window, T = 34 holds Q = 32 encoded "
               "and 2 window tokens (one-shot encode of 34 tokens would have Q = 16); save/load keeps that "
               "state exactly and continues like the unsaved stream")
    else:
        stream(f"b{b}-d{d0}-bf16-save-load-000", P(window=3), "bfloat16",
               [("append", 8), ("trim", 5), ("save_load", 0), ("append", 1), ("save_load", 0), ("append", 1)],
               ["save-load", "trim", "window"],
               "pins streaming.md 'Save and load': a state with a window shorter than R (after a trim) survives "
               "save/load exactly (Q and T are not re-derived from R) and continues like the unsaved stream")


def _param_rule_cases(method: str, kivi: bool, affine: bool, b: int, d0: int, base: dict, P, add) -> None:
    """Group sizes, the bits2 default, which error is reported, head dims out of range (methods/, number-model.md)."""
    info = spec.method_info(method)
    # -- G must divide d (methods/kivi.md, mlx_affine.md)
    if affine:
        for g, d in ((64, 32), (64, 96), (32, 80)):
            what = "G > d" if g > d else "G <= d but G does not divide d"
            add(f"g{g}-d{d}-f16-group-error-000", "error", P(group_size=g), "float16",
                cast_input(InputRng(f"ga-{g}-{d}").normalish((1, 1, 2, d)), "float16"),
                ["error", "params", "group-divides"],
                f"pins methods/mlx_affine.md: G must divide d; G = {g}, d = {d} ({what}) names group_size",
                error=ExpectedError("ValueError", "group_size"), resolve=False)
    if kivi:
        for g, d in ((32, 80), (64, 96)):
            add(f"g{g}-v-d{d}-f16-group-error-000", "error", P(group_size=g, role="v"), "float16",
                cast_input(InputRng(f"gv-{g}-{d}").normalish((1, 1, 2, d)), "float16"),
                ["error", "params", "group-divides"],
                f"pins methods/kivi.md: values need G to divide d; G = {g}, d = {d} names group_size",
                error=ExpectedError("ValueError", "group_size"), resolve=False)
        add("b2-g32-k-d80-f16-keys-any-d-000", "encode", P(bits=2, group_size=32, role="k", window=0), "float16",
            _rule_x("kivi-keys-80", (1, 1, 35, 80), "float16"), ["group-divides", "head-dim"],
            "pins methods/kivi.md: keys group tokens, so G = 32 works at d = 80 (values could not)")
    # -- the bits2 default (methods/turboquant_rvq.md)
    if method == "turboquant_rvq":
        for bb in (3, 1):
            add(f"b{bb}-d16-f32-bits2-default-000", "encode", spec.Params(method, bits=bb, window=0), "float32",
                _rule_x(f"rvq-bits2-{bb}", (1, 2, 3, 16), "float32"), ["bits2-default", "params"],
                f"pins methods/turboquant_rvq.md 'Default of bits2': bits = {bb} without bits2 means bits2 = {bb} "
                f"(not default_bits = {info['default_bits']}); params leave bits2 out on purpose",
                resolve=False)
    # -- which error is reported (number-model.md): two faults each, the earlier step wins
    good = _rule_x(f"{method}-prec", (1, 1, 16 if kivi else 2, d0), "float16")
    nan = good.copy(); nan[0, 0, 0, 1] = np.float16(np.nan)
    prec = [
        ("bits-nan", P(bits=max(info["bits"]) + 1), "float16", nan, "bits", "step 2 (bits) before step 6 (NaN)"),
        ("dtype-rank", P(), "float64", good[0], "dtype", "step 3 (declared dtype) before step 4 (rank 3 x)"),
        ("window-role", P(window=-1, role="q"), "float16", good, "window", "step 2: window before role"),
        ("seed-layer", P(seed=-1, layer=1 << 32), "float16", good, "seed", "step 2: seed before layer"),
        ("bits2-group", spec.Params(method, bits=b, bits2=5, group_size=8), "float16", good, "bits2",
         "step 2: bits2 before group_size (both invalid" + (")" if method == "turboquant_rvq" or kivi or affine
                                                              else ", neither taken by this method)")),
        ("layer-f64", P(layer=-1), "float32", good.astype(np.float64), "layer",
         "step 2 (layer) before step 4 (a float64 array declared float32)"),
    ]
    if kivi or affine:
        kw = {"group_size": 64, "role": "v"} if kivi else {"group_size": 64}
        x96 = cast_input(InputRng(f"{method}-prec96").normalish((1, 1, 16 if kivi else 2, 96)), "float16")
        x96n = x96.copy(); x96n[0, 0, 0, 0] = np.float16(np.nan)
        x36 = cast_input(InputRng(f"{method}-prec36").normalish((1, 1, 16 if kivi else 2, 36)), "float16")
        prec += [("group-nan", P(**kw), "float16", x96n, "group_size",
                  "step 5 (G = 64 does not divide d = 96) before step 6 (NaN)"),
                 ("headdim-group", P(**kw), "float16", x36, "x",
                  "step 4 (head dim 36 unsupported) before step 5 (G = 64 does not divide 36)"),
                 ("f64-group", P(**kw), "float32", x96.astype(np.float64), "x",
                  "step 4 (float64 array declared float32) before step 5 (G does not divide d)")]
    for tag, params, dtype, x, arg, why in prec:
        add(f"{tag}-d{x.shape[-1]}-precedence-error-000", "error", params, dtype, x,
            ["error", "precedence"], f"pins number-model.md 'Which error is reported': {why}; names {arg}",
            error=ExpectedError("ValueError", arg), resolve=False)
    for d in (8, 2048):
        add(f"b{b}-d{d}-f16-head-dim-error-000", "error", P(), "float16",
            cast_input(InputRng(f"hd{d}").normalish((1, 1, 16 if kivi else 1, d)), "float16"),
            ["error", "shape"],
            f"pins number-model.md 'Inputs': head dim {d} is outside 16 <= d <= 1024",
            error=ExpectedError("ValueError", "x"))


def case_defs(method: str) -> list[CaseDef]:
    return rule_cases(method)


# ----------------------------------------------------------------------------------------------------
# Checks that the rule cases exercise their rules (run by golden.generate_cases, so by regen and check)

def check_cases(cases) -> None:
    from ... import reference
    for c in cases:
        if "head-index-64" in c.flags and c.method in NORM_METHODS:
            import dataclasses
            wrapped = reference.encode(c.x[:, 1:], dataclasses.replace(c.params, head_offset=0), c.dtype)
            if all(np.array_equal(wrapped[k], c.record[k][:, 1:]) for k in wrapped if k != "window"):
                raise GenerationError(f"{c.id}: a 32-bit head index would store the same record")
        if "short-window" in c.flags and not c.record["window"].shape[2] < c.params.resolved().window:
            raise GenerationError(f"{c.id}: the final window is not shorter than R")
        if "bits2-default" in c.flags:
            p = c.params
            w = c.record["codes2"].shape[-1]
            if p.bits2 is not None or p.bits == spec.method_info(c.method)["default_bits"] or \
                    w != spec.words_per_row(c.x.shape[-1], p.bits):
                raise GenerationError(f"{c.id}: does not distinguish bits2 = bits from the default bits")
        if "stage-b-zero" in c.flags:
            y_hat = _zero_token_y_hat(c.params.resolved(), c.x.shape[1], c.x.shape[-1])
            if not stage_b_all_zero_terms(y_hat[0, :, 0]).any():
                raise GenerationError(f"{c.id}: no Hᵀ output with all-(-0) terms")
        if "kivi-trim" in c.flags and not _kivi_trim_is_lossy(c):
            raise GenerationError(f"{c.id}: the trimmed tokens decode to their original values")


def _kivi_trim_is_lossy(c) -> bool:
    """After some trim, a re-windowed token differs from the original token at that position (so an
    implementation putting the originals back would store different bytes)."""
    from ...reference import stream as _reference_stream
    from ... import reference
    s = reference.stream.Stream(c.params, c.dtype)
    seq, pos = c.x[:, :, :0], 0        # the original tokens of the stream, in order
    for op, n in c.ops:
        if op in ("append", "reject"):
            chunk = c.x[:, :, pos:pos + n]
            pos += n
            if op == "append":
                s.append(np.ascontiguousarray(chunk))
                seq = np.concatenate([seq, chunk], axis=2)
            continue
        if op == "trim":
            s.trim(n)
            seq = seq[:, :, :s.tokens]
            win = s.record()["window"]
            orig = seq[:, :, s.tokens - win.shape[2]:]
            if not np.array_equal(upcast(orig, c.dtype), upcast(win, c.dtype)):
                return True
    return False
