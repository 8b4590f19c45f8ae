"""The suite catches broken implementations: each mutant (conformance/mutants.py, the reference with one
deliberate bug) is run through the check function that targets its bug, which must fail; the unmodified
reference must pass the same check (so the check is not simply always failing)."""
from __future__ import annotations

import numpy as np
import pytest

from .. import spec

from . import attention_checks, checks, data, mutants
from .adapters.reference import ReferenceImpl
from .assertions import Mismatch


@pytest.fixture(scope="module")
def reference_impl(ref):
    return ref


def _must_fail(check, mutant, control):
    """`check(mutant)` raises Mismatch; `check(control)` does not. Returns the mutant's message."""
    check(control)
    with pytest.raises(Mismatch) as e:
        check(mutant)
    return str(e.value)


def _x(shape, dtype="float32", seed=0, regime="normal"):
    return data.make_x(np.random.default_rng(seed), shape, dtype, regime)


@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_one_ulp_codebook_caught_by_exhaustive(reference_impl, bits):
    mutant, control = mutants.OneUlpCodebook(), ReferenceImpl()
    msg = _must_fail(lambda impl: checks.check_codebook(impl, reference_impl, ("gaussian", bits), 64),
                     mutant, control)
    assert "dequantize" in msg and "XOR" in msg


def test_one_ulp_codebook_caught_by_differential(reference_impl):
    p = spec.Params("turboquant", bits=4).resolved()
    x = _x((1, 2, 16, 64))
    _must_fail(lambda impl: checks.check_encode_decode(impl, reference_impl, x, p, "float32"),
               mutants.OneUlpCodebook(), ReferenceImpl())


@pytest.mark.parametrize("method,bits", [("turboquant", 3), ("turboquant_prod", 3), ("kivi", 4),
                                         ("rabitq", 1), ("turboquant_rvq", 2)])
def test_msb_first_packing_caught(reference_impl, method, bits):
    kw = dict(group_size=16) if method == "kivi" else {}
    p = spec.Params(method, bits=bits, window=0, **kw).resolved()
    x = _x((1, 2, 16, 32), "float16")
    msg = _must_fail(lambda impl: checks.check_encode(impl, reference_impl, x, p, "float16"),
                     mutants.MsbFirstPacking(), ReferenceImpl())
    assert "worst block" in msg


@pytest.mark.parametrize("method", ["turboquant", "turboquant_rvq", "turboquant_prod", "rabitq"])
def test_sequential_norm_caught(reference_impl, method):
    p = spec.Params(method).resolved()
    x = _x((2, 2, 8, 128), "float32")
    msg = _must_fail(lambda impl: checks.check_encode(impl, reference_impl, x, p, "float32"),
                     mutants.SequentialNorm(), ReferenceImpl())
    assert "norm" in msg


def _kivi_ties(role):
    """The tie example of methods/kivi.md: groups spanning [0, 3] with elements on .5 (b = 2, L = 3)."""
    base = np.array([0, 3, 0.5, 1.5, 2.5, 1, 2, 0.5], dtype=np.float32)
    x = np.empty((1, 1, 16, 16), dtype=np.float32)
    for t in range(16):
        for c in range(16):
            x[0, 0, t, c] = base[(t + c) % 8]
    return x


@pytest.mark.parametrize("role", ["k", "v"])
def test_kivi_half_away_caught(reference_impl, role):
    p = spec.Params("kivi", bits=2, group_size=16, window=0, role=role).resolved()
    x = _kivi_ties(role)
    _must_fail(lambda impl: checks.check_encode(impl, reference_impl, x, p, "float32"),
               mutants.KiviHalfAway(), ReferenceImpl())


@pytest.mark.parametrize("method", ["turboquant", "turboquant_prod", "rabitq"])
def test_chunking_dependent_caught(reference_impl, method):
    p = spec.Params(method, window=0).resolved()
    x = _x((1, 2, 9, 32), "bfloat16")
    # one chunk passes even for the mutant (the bug needs chunk boundaries) ...
    checks.check_stream_matches_oneshot(mutants.ChunkingDependent(), reference_impl, x, p, "bfloat16", [9])
    # ... a split does not
    _must_fail(lambda impl: checks.check_stream_matches_oneshot(impl, reference_impl, x, p, "bfloat16",
                                                                [4, 1, 4]),
               mutants.ChunkingDependent(), ReferenceImpl())


@pytest.mark.parametrize("mutant_cls", [mutants.ExactTrimIgnored, mutants.KeptTokensDecoded])
@pytest.mark.parametrize("method", ["turboquant", "kivi"])
def test_exact_trim_check_catches(reference_impl, mutant_cls, method):
    """checks.check_exact_trims (conformance/test_exact_trim.py) fails on a stream without exact trims."""
    kw = {"group_size": 16} if method == "kivi" else {}
    p = spec.Params(method, window=4, exact_trim=5, **kw).resolved()
    rng = np.random.default_rng(3)
    pre = data.make_x(rng, (1, 2, 35, 32), "float16", "normal")
    cycles = [(data.make_x(rng, (1, 2, a, 32), "float16", "normal"), n) for a, n in ((3, 3), (2, 1), (5, 4))]
    checks.check_exact_trims(reference_impl, reference_impl, pre, cycles, p, "float16")
    _must_fail(lambda impl: checks.check_exact_trims(impl, reference_impl, pre, cycles, p, "float16"),
               mutant_cls(), reference_impl)


# ---- spec 1.1: each deviation issue 9 lists, and each head-dim bug, fails the golden cases made for it ------

def _golden(pred):
    from . import golden_format as golden
    return [c for c in golden.iter_cases() if pred(c)]


def _flag(flag, methods=None):
    return lambda c: flag in c.flags and (methods is None or c.method in methods)


def _m_n(c):
    from .. import spec as _spec
    return _spec.split_head_dim(c.shape[3]) if c.kind != "error" else (1, 0)


NORM = ("turboquant", "turboquant_rvq", "turboquant_prod", "rabitq")
RULE_TARGETS = [  # (mutant, the golden cases made to catch it: every one of them must)
    (mutants.KiviTrimOriginals, _flag("kivi-trim")),
    (mutants.OneShotAfterTrim, _flag("short-window")),
    (mutants.RejectedChunkKept, _flag("reject")),
    (mutants.WindowCheckedOnArrival, _flag("flush-reject", NORM + ("mlx_affine",))),
    (mutants.LoadReencodes, _flag("save-load")),
    (mutants.HeadIndexWrap32, _flag("head-index-64", NORM)),
    (mutants.Bits2DefaultIsDefaultBits, _flag("bits2-default")),
    (mutants.GroupAtMostHeadDim, lambda c: "group-divides" in c.flags and c.kind == "error"
     and c.params.group_size <= c.shape[3]),
    (mutants.NoGroupCheck, lambda c: "group-divides" in c.flags and c.kind == "error"),
    (mutants.ValuesBeforeGroupSize, lambda c: "precedence" in c.flags and "-group-nan-" in f"-{c.id}-"),
    (mutants.StageBFirstTerm, _flag("stage-b-zero")),
    (mutants.ExactTrimIgnored, lambda c: any(f.startswith("exact-trim") for f in c.flags)),
    (mutants.KeptTokensDecoded, _flag("exact-trim")),
]
HEAD_DIM_TARGETS = [  # (mutant, the head-dim cases it shows in: each method's set must catch it)
    (mutants.InverseUsesH, lambda c: "head-dim" in c.flags and c.method in NORM and _m_n(c)[0] in (20, 28)),
    (mutants.StagesSwapped, lambda c: "head-dim" in c.flags and c.method in NORM and _m_n(c)[0] > 1
     and _m_n(c)[1] > 1),
    (mutants.FoldHalvingFirst, lambda c: "head-dim" in c.flags and c.method in NORM and _m_n(c)[0] > 1
     and _m_n(c)[1] > 1),
]


def _catches(mutant, case) -> bool:
    try:
        checks.check_golden(mutant, case)
    except Mismatch:
        return True
    return False


@pytest.mark.parametrize("mutant_cls,select", RULE_TARGETS, ids=[m.name for m, _ in RULE_TARGETS])
def test_spec11_rule_golden_catches_its_deviation(mutant_cls, select):
    cases = _golden(select)
    assert cases, f"no golden case pins what {mutant_cls.name} breaks"
    control, mutant = ReferenceImpl(), mutant_cls()
    for c in cases:
        checks.check_golden(control, c)            # the unmodified reference passes ...
        assert _catches(mutant, c), c.id           # ... the deviation fails


@pytest.mark.parametrize("mutant_cls,select", HEAD_DIM_TARGETS, ids=[m.name for m, _ in HEAD_DIM_TARGETS])
def test_spec11_head_dim_goldens_catch_head_dim_bugs(mutant_cls, select):
    cases = _golden(select)
    by_method = {}
    control, mutant = ReferenceImpl(), mutant_cls()
    for c in cases:
        checks.check_golden(control, c)
        by_method.setdefault(c.method, []).append(_catches(mutant, c))
    assert set(by_method) == set(NORM)
    for m, hits in by_method.items():
        assert sum(hits) >= max(1, len(hits) // 2), (m, sum(hits), len(hits))


# ---- issue 11: each added check fails on the mutant made for it (conformance/mutants_suite.py) -------------

def _bad_input_module():
    from . import test_bad_input
    return test_bad_input


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_first_append_lock_caught(dtype):
    tbi = _bad_input_module()
    p = tbi._params("turboquant")
    good = tbi._x((1, 2, 16, 32), dtype, seed=3)
    bad = {label: x for label, x, _ in tbi._bad_inputs("turboquant", dtype)}
    for label in ("rank3", "head-dim-36", "nan"):
        # the older check (a bad append after a good prefix) cannot see it: the prefix fixed the shape
        checks.check_stream_rejects(mutants.FirstAppendLocksShape(), p, dtype, good, bad[label], "x", after=good)
    for label in ("rank3", "head-dim-36"):
        _must_fail(lambda impl: checks.check_stream_rejects(impl, p, dtype, None, bad[label], "x", after=good),
                   mutants.FirstAppendLocksShape(), ReferenceImpl())


@pytest.mark.parametrize("method", ["turboquant", "kivi", "mlx_affine"])
def test_buffer_step_row256_caught(reference_impl, method):
    from .test_cache_sequences import LONG_CHUNKS, _params
    p = _params(method, 0)
    short = _x((1, 2, 77, 32), "float16", seed=11)
    # the older sequence test (T = 77) passes the mutant ...
    checks.check_stream_matches_oneshot(mutants.BufferStepRow256(), reference_impl, short, p, "float16", [37] + [1] * 40)
    x = _x((1, 2, sum(LONG_CHUNKS), 32), "float16", seed=600)
    msg = _must_fail(lambda impl: checks.check_stream_matches_oneshot(impl, reference_impl, x, p, "float16",
                                                                      LONG_CHUNKS),
                     mutants.BufferStepRow256(), ReferenceImpl())
    assert "256" in msg


@pytest.mark.parametrize("method", ["turboquant", "kivi"])
def test_missing_limit_checks_caught(method):
    tbi = _bad_input_module()
    x = tbi._x((1, 2, 3, 32), "float32")
    caught = []
    for arg, kw in tbi.past_limits():
        p = tbi._params(method, **kw)
        what = f"encode {kw}"
        checks.check_raises(ReferenceImpl().encode, (x, p, "float32"), arg, what)
        try:
            checks.check_raises(mutants.MissingLimitChecks().encode, (x, p, "float32"), arg, what)
        except Mismatch:
            caught.append(kw)
    assert [list(k)[0] for k in caught] == ["window", "layer", "head_offset"], caught


@pytest.mark.parametrize("method", ["turboquant", "rabitq", "turboquant_prod"])
def test_seed_truncated_caught_at_the_largest_seed(reference_impl, method):
    tbi = _bad_input_module()
    x = tbi._x((1, 2, 3, 32), "float32")
    small = spec.Params(method, window=0, seed=2 ** 62).resolved()
    checks.check_encode_decode(mutants.SeedTruncated63(), reference_impl, x, small, "float32")
    p = tbi._params(method, seed=2 ** 64 - 1).resolved()
    _must_fail(lambda impl: checks.check_encode_decode(impl, reference_impl, x, p, "float32"),
               mutants.SeedTruncated63(), ReferenceImpl())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kivi_zero_saturated_caught(dtype):
    tbi = _bad_input_module()
    p = tbi._params("kivi")
    bad = {label: (x, arg) for label, x, arg in tbi._bad_inputs("kivi", dtype)}
    x, arg = bad["kivi-float16-overflow"]      # the older scale-overflow input: the mutant still rejects it
    checks.check_raises(mutants.KiviZeroSaturated().encode, (x, p, dtype), arg, "scale overflow")
    x, arg = bad["kivi-zero-overflow"]
    _must_fail(lambda impl: checks.check_raises(impl.encode, (x, p, dtype), arg, "zero overflow"),
               mutants.KiviZeroSaturated(), ReferenceImpl())


@pytest.mark.parametrize("method", NORM)
def test_head_signs_modulo4_caught_by_wide_shapes(reference_impl, method):
    from .test_differential import WIDE_SHAPES
    p = spec.Params(method, window=0, seed=5).resolved()
    narrow = _x((2, 3, 3, 32), "float16")
    checks.check_encode_decode(mutants.HeadSignsModulo4(), reference_impl, narrow, p, "float16")
    b, h, t, d = WIDE_SHAPES[0]
    _must_fail(lambda impl: checks.check_encode_decode(impl, reference_impl, _x((b, h, t, d), "float16"), p,
                                                       "float16"),
               mutants.HeadSignsModulo4(), ReferenceImpl())
    wide = _golden(lambda c: "wide" in c.flags and c.method == method)
    assert wide and all(_catches(mutants.HeadSignsModulo4(), c) for c in wide if c.shape[1] > 4)


def test_kivi_trim_originals_caught_by_the_put_back_check():
    p = spec.Params("kivi", window=5, group_size=16, role="v", seed=3).resolved()
    x = _x((1, 2, 40, 32), "float16", seed=40)
    _must_fail(lambda impl: checks.check_kivi_trim_put_back(impl, p, "float16", x, 12),
               mutants.KiviTrimOriginals(), ReferenceImpl())


@pytest.mark.parametrize("rep", [2, 3])
def test_attention_heads_tiled_caught(reference_impl, rep):
    msg = _must_fail(lambda impl: attention_checks.check_attention_head_mapping(impl, reference_impl, "turboquant",
                                                                                rep),
                     mutants.AttentionHeadsTiled(), ReferenceImpl())
    assert "should read KV head" in msg


def test_every_element_differs_is_said():
    from .assertions import assert_exact
    a = np.arange(32, dtype=np.uint32)
    with pytest.raises(Mismatch, match="every element differs"):
        assert_exact(a + 1, a, "probe")
    b = a.copy()
    b[3] += 1
    with pytest.raises(Mismatch) as e:
        assert_exact(b, a, "probe")
    assert "every element" not in str(e.value)


@pytest.fixture(autouse=True)
def _tag_mutants(record_property):
    record_property("method", "(mutants)")


# ---- spec 1.2 (issue 30): each rule no 1.1 case pinned fails the 1.2 cases made for it --------------------
# Every mutant here passes every golden case of spec 1.1 (all 902: checked when the cases were made, and
# test_spec12_mutants_pass_the_earlier_goldens re-checks the stream, error and mlx_affine ones).
from . import mutants_spec12 as m12  # noqa: E402

RULE12_TARGETS = [  # (mutant, the 1.2 golden cases made to catch it: every one of them must)
    (m12.RefillAllKept, lambda c: "trim-state" in c.flags and c.method != "kivi" and c.id.endswith("-001")),
    (m12.KeptNotDropped, lambda c: "trim-state" in c.flags and c.method != "kivi"),
    (m12.ChunkMismatchAccepted, _flag("chunk-mismatch")),
    (m12.NegativeTrimIsZero, _flag("trim-edge")),
    (m12.EmptySaveFails, _flag("trim-edge")),
    (m12.ParamTypesLenient, lambda c: "param-error" in c.flags and any(
        t in c.id for t in ("-float-", "-bool-", "role-upper"))),
    (m12.ExactTrimUnbounded, lambda c: "param-error" in c.flags and "exact-trim-" in c.id
     and "-role-" not in c.id),
    (m12.DecodeRecordUnchecked, _flag("decode-error")),
    (m12.AffineMagicRint, _flag("affine-rint-large")),
    (m12.AffineMaxFromZero, _flag("affine-all-negative")),
]


def _fails(mutant, case) -> bool:
    """check_golden on the mutant fails: a Mismatch, or any exception (as test_golden would report it)."""
    try:
        checks.check_golden(mutant, case)
    except Exception:  # noqa: BLE001 - a crash fails test_golden too
        return True
    return False


@pytest.mark.parametrize("mutant_cls,select", RULE12_TARGETS, ids=[m.name for m, _ in RULE12_TARGETS])
def test_spec12_rule_golden_catches_its_deviation(mutant_cls, select):
    cases = _golden(lambda c: c.file.endswith("-rules12.toml") and select(c))
    assert cases, f"no golden case pins what {mutant_cls.name} breaks"
    control, mutant = ReferenceImpl(), mutant_cls()
    for c in cases:
        checks.check_golden(control, c)
        assert _fails(mutant, c), c.id


@pytest.mark.parametrize("mutant_cls", [m for m, _ in RULE12_TARGETS], ids=[m.name for m, _ in RULE12_TARGETS])
def test_spec12_mutants_pass_the_earlier_goldens(mutant_cls):
    """The deviation was invisible before spec 1.2: the mutant passes the 1.1 cases of its kind."""
    mutant = mutant_cls()
    kinds = ("encode",) if mutant_cls.__name__.startswith("Affine") else ("stream", "error")
    earlier = _golden(lambda c: not c.file.endswith("-rules12.toml") and c.kind in kinds and (
        c.method == "mlx_affine" or not mutant_cls.__name__.startswith("Affine")))
    assert len(earlier) > 50
    caught = [c.id for c in earlier if _fails(mutant, c)]
    assert not caught, caught[:5]


# ---- spec 1.2: golden attention cases catch a wrong GQA mapping, mask and block merge -------------------
ATTENTION_TARGETS = [  # (mutant, the golden attention cases that must catch it: every one of them)
    (m12.AttentionMergeNoRescale, lambda c: "attention-long" in c.flags),
    (m12.AttentionNoCausalMask, lambda c: "attention-causal" in c.flags),
    (mutants.AttentionHeadsTiled, lambda c: "attention-gqa" in c.flags),
]


@pytest.mark.parametrize("mutant_cls,select", ATTENTION_TARGETS, ids=[m.name for m, _ in ATTENTION_TARGETS])
def test_golden_attention_catches(mutant_cls, select):
    from . import golden_format as golden
    cases = [c for c in golden.iter_attention_cases() if select(c)]
    assert cases
    control, mutant = ReferenceImpl(), mutant_cls()
    for c in cases:
        attention_checks.check_golden_attention(control, c)
        with pytest.raises(Mismatch):
            attention_checks.check_golden_attention(mutant, c)


def test_merge_no_rescale_passes_the_earlier_attention_checks():
    """Before the long golden case no attention check saw a record longer than one 2048-token block: the
    mutant passes attention_checks.check_attention at T = 700 (conformance/test_attention.py's longest draw) and
    the golden cases shorter than 2048 tokens."""
    from . import golden_format as golden
    ref, mutant = ReferenceImpl(), m12.AttentionMergeNoRescale()
    rng = np.random.default_rng(5)
    p = spec.Params("turboquant", window=0).resolved()
    k = _x((1, 2, 700, 64), "float16", seed=1)
    v = _x((1, 2, 700, 64), "float16", seed=2)
    q = (rng.standard_normal((1, 4, 2, 64)) * 4).astype(np.float32)
    attention_checks.check_attention(mutant, ref, q, ref.encode(k, p, "float16"), ref.encode(v, p, "float16"), p,
                                     p, "float16", 0.125, "causal")
    for c in golden.iter_attention_cases():
        if "attention-long" not in c.flags:
            attention_checks.check_golden_attention(mutant, c)


@pytest.mark.parametrize("mutant_cls,dtype", [(m12.CastTruncates, "bfloat16"), (m12.CastSaturates, "float16")])
def test_golden_cast_catches(mutant_cls, dtype):
    from . import golden_format as golden
    vecs = golden.iter_vectors("cast")["cast"]
    checks.check_golden_cast(ReferenceImpl(), vecs, dtype)
    with pytest.raises(Mismatch):
        checks.check_golden_cast(mutant_cls(), vecs, dtype)


def test_unknown_method_check_catches():
    checks.check_unknown_method(ReferenceImpl())
    with pytest.raises(Mismatch):
        checks.check_unknown_method(m12.UnknownMethodFallsBack())


def test_message_not_leading_caught():
    """number-model.md 'Error messages': the message starts with '<argument>:'. The mutant's messages still
    contain the name (what check_raises asked before spec 1.2), so only the leading-name rule catches it."""
    from . import golden_format as golden
    errs = [c for c in golden.iter_cases(kinds=["error"]) if "param-error" in c.flags][:6]
    assert errs
    for c in errs:
        checks.check_golden(ReferenceImpl(), c)
        with pytest.raises(ValueError) as e:
            m12.MessageNotLeading().encode(c.x, c.params, c.dtype)
        assert c.error.argument in str(e.value)          # the pre-1.2 check (a substring) would pass
        with pytest.raises(Mismatch, match="must start with"):
            checks.check_golden(m12.MessageNotLeading(), c)
