"""reference.codebooks: scaling to d and quantization by strict crossings (spec/codebooks.md)."""
import numpy as np
from hypothesis import given, settings, strategies as st

from veloxquant import spec
from veloxquant.reference import codebooks

f32 = np.float32


def test_b1_ties_and_smallest_subnormal():
    _c, b = codebooks.gaussian(1, 128)
    u = np.array([0.0, -0.0, np.float32(2.0**-149)], dtype=np.float32)
    assert float(u[2]) > 0  # no flush to zero
    assert codebooks.quantize(u, b).tolist() == [0, 0, 1]


def test_b2_d16_boundary_gives_lower_index():
    _c, b = codebooks.gaussian(2, 16)
    tie = b[2]
    above = np.nextafter(tie, f32(np.inf), dtype=np.float32)
    assert codebooks.quantize(np.array([tie, above], dtype=np.float32), b).tolist() == [2, 3]


def test_scaled_tables_are_one_binary32_multiply():
    for bits in (1, 2, 3, 4):
        for d in spec.HEAD_DIMS:
            c, b = codebooks.gaussian(bits, d)
            g = spec.gaussian(bits)
            assert c.dtype == np.float32 and b.dtype == np.float32
            assert np.array_equal(c, (g.centroids.astype(np.float64) * float(spec.scale(d))).astype(np.float32))
            assert np.array_equal(b, (g.boundaries.astype(np.float64) * float(spec.scale(d))).astype(np.float32))


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4), st.sampled_from(spec.HEAD_DIMS), st.integers(0, 2**32 - 1))
def test_quantize_is_nearest_centroid_off_ties(bits, d, seed):
    c, b = codebooks.gaussian(bits, d)
    rng = np.random.default_rng(seed)
    u = (rng.standard_normal(500) * float(spec.scale(d)) * 1.5).astype(np.float32)
    idx = codebooks.quantize(u, b)
    dist = np.abs(u[:, None].astype(np.float64) - c[None, :].astype(np.float64))
    nearest = dist.argmin(axis=1)
    off_tie = np.sort(dist, axis=1)[:, 1] - np.sort(dist, axis=1)[:, 0] > 1e-6 * float(spec.scale(d))
    assert np.array_equal(idx[off_tie], nearest[off_tie])
    assert np.array_equal(codebooks.dequantize(idx, c), c[idx])
