"""reference.packing against spec/packing.md: an independent per-code loop, the spec's example, padding."""
import numpy as np
from hypothesis import given, settings, strategies as st

from veloxquant.reference import packing


def pack_by_loop(codes, bits):
    """spec/packing.md literally: word[j div k] |= c_j << (b * (j mod k)), Python ints."""
    k = 32 // bits
    words = [0] * (-(-len(codes) // k))
    for j, c in enumerate(codes):
        words[j // k] |= int(c) << (bits * (j % k))
    return words


@settings(max_examples=200, deadline=None)
@given(bits=st.integers(1, 8), data=st.data())
def test_round_trip_and_loop_agreement(bits, data):
    n = data.draw(st.integers(1, 70))
    codes = np.array(data.draw(st.lists(st.integers(0, (1 << bits) - 1), min_size=n, max_size=n)), dtype=np.uint32)
    words = packing.pack(codes, bits)
    assert words.dtype == np.uint32
    assert words.tolist() == pack_by_loop(codes.tolist(), bits)
    back = packing.unpack(words, bits, n)
    assert np.array_equal(back, codes)


def test_padding_bits_are_zero_with_all_ones_codes():
    for bits in range(1, 9):
        k = 32 // bits
        for n in (1, k - 1 if k > 1 else 1, k, k + 1, 3 * k + 2):
            words = packing.pack(np.full(n, (1 << bits) - 1, dtype=np.uint32), bits)
            for w_i, w in enumerate(words.tolist()):
                slots = min(k, n - w_i * k)
                assert w == (1 << (slots * bits)) - 1, (bits, n, w_i, hex(w))


def test_spec_example_bits3():
    words = packing.pack(np.array([1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3]), 3)
    assert words.tolist() == [0x111F58D1, 0x00000003]


def test_batched_rows_pack_independently():
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 8, size=(2, 3, 5, 64)).astype(np.uint32)
    words = packing.pack(codes, 3)
    assert words.shape == (2, 3, 5, 7)
    assert words[1, 2, 4].tolist() == pack_by_loop(codes[1, 2, 4].tolist(), 3)
    assert np.array_equal(packing.unpack(words, 3, 64), codes)


def test_out_of_range_code_rejected():
    import pytest
    with pytest.raises(ValueError, match="codes"):
        packing.pack(np.array([4]), 2)
