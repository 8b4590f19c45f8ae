"""reference.numerics against spec/number-model.md: fold order, rint ties, exact upcasts, RNE downcasts."""
import numpy as np
from hypothesis import given, settings, strategies as st

from veloxquant import spec
from veloxquant.reference import numerics

f32 = np.float32


def fold_by_loop(v):
    """spec/number-model.md's pseudocode, one np.float32 add at a time: block fold, then halving."""
    v = [f32(a) for a in v]
    m, n = spec.split_head_dim(len(v)) if len(v) >= 16 else (1, len(v))
    for k in range(1, m):
        for i in range(n):
            v[i] = f32(v[i] + v[k * n + i])
    while n > 1:
        n //= 2
        for i in range(n):
            v[i] = f32(v[i] + v[i + n])
    return v[0]


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 5), st.integers(0, 2**32 - 1))
def test_fold_matches_pseudocode_bitwise(log_n, seed):
    rng = np.random.default_rng(seed)
    v = (rng.standard_normal(2**log_n) * 10.0 ** rng.integers(-30, 30, 2**log_n)).astype(np.float32)
    assert numerics.fold(v).view(np.uint32) == fold_by_loop(v).view(np.uint32)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(spec.HEAD_DIMS), st.integers(0, 2**32 - 1))
def test_fold_matches_pseudocode_bitwise_at_every_head_dim(d, seed):
    rng = np.random.default_rng(seed)
    v = (rng.standard_normal(d) * 10.0 ** rng.integers(-30, 30, d)).astype(np.float32)
    assert numerics.fold(v).view(np.uint32) == fold_by_loop(v).view(np.uint32)


def test_fold_of_m_blocks_is_left_to_right_before_halving():
    """d = 20 = 20 * 1: the block fold alone, left to right. 1e8 + 1 (= 1e8 in binary32) ... a halving
    tree over 20 values or a right-to-left order would keep the 1s."""
    v = np.zeros(20, np.float32)
    v[0], v[1], v[2], v[3] = 1e8, 1, -1e8, 1
    assert numerics.fold(v) == f32(1)
    # d = 24 = 12 * 2: blocks of 2 summed first (w = [1e8 - 1e8 + ..., ...]), then one halving step
    w = np.zeros(24, np.float32)
    w[0], w[2], w[1], w[3] = 1e8, -1e8, 1, 1
    assert numerics.fold(w) == f32(2)     # (1e8 + -1e8) + (1 + 1)


def test_fold_order_is_halving_not_sequential():
    v = np.array([1e8, 1, -1e8, 1], dtype=np.float32)
    # halving: (1e8 + -1e8) + (1 + 1) = 2; a left-to-right sum in binary32 gives 1.
    assert numerics.fold(v) == f32(2)


def test_rint_ties_to_even():
    y = np.array([0.5, 1.5, 2.5, 3.5, 254.5, 255.0, 0.49999997], dtype=np.float32)
    assert numerics.rint(y).tolist() == [0, 2, 2, 4, 254, 255, 0]


def test_bf16_upcast_is_bit_shift():
    bits = np.array([0x0000, 0x8000, 0x0001, 0x3F80, 0xC2F7, 0x7F7F], dtype=np.uint16)
    out = numerics.upcast(bits, "bfloat16")
    assert out.dtype == np.float32
    assert out.view(np.uint32).tolist() == [int(b) << 16 for b in bits.tolist()]


def test_bf16_downcast_rne():
    one = 0x3F800000
    cases = {
        one: 0x3F80,                    # exact
        one + 0x8000: 0x3F80,           # tie, even stays
        one + 0x18000: 0x3F82,          # tie, odd rounds up to even
        one + 0x8001: 0x3F81,           # above the tie
        0x7F7FFFFF: 0x7F80,             # beyond bf16 max rounds to +Inf
        0x00000001: 0x0000,             # tiny subnormal rounds to +0
        0x80018000: 0x8002,             # negative subnormal tie to even
    }
    src = np.array(list(cases), dtype=np.uint32).view(np.float32)
    assert numerics.to_bfloat16_bits(src).tolist() == list(cases.values())


def test_float16_downcast_rne_and_overflow():
    v = np.array([2049, 2051, 65519, 65520, -65520, 2.0**-25, 3 * 2.0**-26], dtype=np.float32)
    out = numerics.to_float16(v)
    assert out.dtype == np.float16
    assert out[:4].tolist() == [2048, 2052, 65504, np.inf]
    assert out[4] == -np.inf
    assert out[5] == 0.0                 # tie between 0 and the smallest subnormal 2^-24: even (0)
    assert out[6] == np.float16(2.0**-24)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_float16_and_bf16_round_trip_exact(seed):
    rng = np.random.default_rng(seed)
    h = rng.integers(0, 2**16, 256, dtype=np.uint16)
    h = h[(h & 0x7C00) != 0x7C00]  # finite fp16 patterns
    assert np.array_equal(numerics.to_float16(numerics.upcast(h.view(np.float16), "float16")).view(np.uint16), h)
    b = rng.integers(0, 2**16, 256, dtype=np.uint16)
    b = b[(b & 0x7F80) != 0x7F80]
    assert np.array_equal(numerics.to_bfloat16_bits(numerics.upcast(b, "bfloat16")), b)
