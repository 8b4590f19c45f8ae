"""The suite catches broken implementations: each mutant (conformance/mutants.py, the reference with one
deliberate bug) is run through the check function that targets its bug, which must fail; the unmodified
reference must pass the same check (so the check is not simply always failing)."""
from __future__ import annotations

import numpy as np
import pytest

import spec

from . import checks, data, mutants
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
    from tools import golden
    return [c for c in golden.iter_cases() if pred(c)]


def _flag(flag, methods=None):
    return lambda c: flag in c.flags and (methods is None or c.method in methods)


def _m_n(c):
    import spec as _spec
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


@pytest.fixture(autouse=True)
def _tag_mutants(record_property):
    record_property("method", "(mutants)")
