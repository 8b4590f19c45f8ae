"""reference.prng and reference.rotation against spec/rotation.md."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from veloxquant import spec
from veloxquant.reference import prng, rotation
from veloxquant import reference


def test_splitmix64_spec_vectors():
    assert prng.words(0, 3) == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def test_stream_key_composition():
    # stream_key is four mix64 steps; check against the spec formula written out here.
    seed, layer, head, role, purpose = 0xDEADBEEF12345678, 7, 3, 1, 1
    k = prng.mix64(seed)
    k = prng.mix64(k ^ layer)
    k = prng.mix64(k ^ head)
    k = prng.mix64(k ^ (2 * role + purpose))
    assert prng.stream_key(seed, layer, head, role, purpose) == k
    # distinct purposes / roles give distinct streams
    keys = {prng.stream_key(seed, layer, head, r, p) for r in (0, 1) for p in (0, 1)}
    assert len(keys) == 4


@pytest.mark.parametrize("d", [16, 64, 128, 1024])
def test_sign_vector_bit_layout(d):
    w = prng.words(prng.stream_key(5, 1, 2, 0, 0), -(-d // 64))
    expected = [-1.0 if (w[j // 64] >> (j % 64)) & 1 else 1.0 for j in range(d)]
    got = prng.sign_vector(5, 1, 2, 0, 0, d)
    assert got.dtype == np.float32 and got.tolist() == expected


def sylvester(d):
    h = np.array([[1]], dtype=np.int64)
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    return h


def h_matrix(d):
    """rotation.md's H as a matrix: H_m ⊗ H_n (Sylvester H_n), index k·n + i."""
    m, n = spec.split_head_dim(d)
    return np.kron(spec.hadamard_matrix(m).astype(np.int64), sylvester(n))


def test_head_dims_follow_the_rule_and_h_m_are_hadamard():
    f = spec.formats()
    want = sorted({m * 2**k for m in f["head_dim_radices"] for k in range(11)
                   if f["head_dim_min"] <= m * 2**k <= f["head_dim_max"]})
    assert list(spec.HEAD_DIMS) == want and len(want) == 25
    for m in (12, 20, 28):
        h = spec.hadamard_matrix(m).astype(np.int64)
        assert np.array_equal(h @ h.T, m * np.eye(m, dtype=np.int64)), m
    assert [bool((spec.hadamard_matrix(m) == spec.hadamard_matrix(m).T).all()) for m in (12, 20, 28)] == \
        [True, False, False]   # so RHT_inverse must use Hᵀ at m = 20, 28


@pytest.mark.parametrize("d", spec.HEAD_DIMS)
def test_hadamard_is_kronecker_and_transpose_inverts_on_integers(d):
    rng = np.random.default_rng(d)
    x = rng.integers(-1000, 1000, size=(3, d))
    got = rotation.hadamard(x.astype(np.float32))
    assert np.array_equal(got, (x @ h_matrix(d).T).astype(np.float32))  # exact: small integers
    got_t = rotation.hadamard(x.astype(np.float32), transpose=True)
    assert np.array_equal(got_t, (x @ h_matrix(d)).astype(np.float32))
    assert np.array_equal(rotation.hadamard(got, transpose=True), (d * x).astype(np.float32))  # Hᵀ H = d I


def _loop_hadamard(x, transpose=False):
    """rotation.md's pseudocode with one np.float32 operation at a time (an independent oracle)."""
    d = x.size
    m, n = spec.split_head_dim(d)
    v = [f for f in x.astype(np.float32)]
    for b0 in range(0, d, n):
        h = 1
        while h < n:
            for i0 in range(b0, b0 + n, 2 * h):
                for i in range(i0, i0 + h):
                    a, b = v[i], v[i + h]
                    v[i], v[i + h] = np.float32(a + b), np.float32(a - b)
            h *= 2
    if m == 1:
        return np.array(v, np.float32)
    hm = spec.hadamard_matrix(m)
    out = [None] * d
    for i in range(n):
        for j in range(m):
            acc = np.float32(0.0)
            for k in range(m):
                s = hm[k, j] if transpose else hm[j, k]
                acc = np.float32(acc + v[k * n + i]) if s > 0 else np.float32(acc - v[k * n + i])
            out[j * n + i] = acc
    return np.array(out, np.float32)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([d for d in spec.HEAD_DIMS if d <= 256]), st.booleans(), st.integers(0, 2**32 - 1))
def test_hadamard_matches_the_pseudocode_bitwise(d, transpose, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(d) * 2.0 ** rng.integers(-60, 60, d)).astype(np.float32)
    x[rng.random(d) < 0.2] = -0.0
    got = rotation.hadamard(x, transpose=transpose)
    assert np.array_equal(got.view(np.uint32), _loop_hadamard(x, transpose).view(np.uint32))


def test_stage_b_starts_from_plus_zero():
    """Signed zeros chosen so every term H_20[0][k] * x_k is -0: starting from +0 gives +0 (a sum that
    starts from the first term, as MLX's CUDA codelet does, gives -0)."""
    h = spec.hadamard_matrix(20)
    x = np.where(h[0] > 0, np.float32(-0.0), np.float32(0.0)).astype(np.float32)
    y = rotation.hadamard(x)
    assert y[0] == 0 and not np.signbit(y[0])


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(spec.HEAD_DIMS), st.integers(0, 2**32 - 1))
def test_rht_round_trip_close(d, seed):   # fails at d = 80 if the inverse used H instead of Hᵀ
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, d)).astype(np.float32)
    sigma = prng.sign_vector(seed, 0, 0, 0, 0, d)
    y = rotation.rht(x, sigma)
    # orthonormal: norms agree and the round trip is the identity up to a few ulps per stage
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)
    back = rotation.rht_inverse(y, sigma)
    np.testing.assert_allclose(back, x, rtol=0, atol=1e-5 * np.abs(x).max())


def test_rht_scale_applied_after_stages():
    d = 32
    x = np.zeros(d, np.float32); x[0] = 1
    sigma = np.ones(d, np.float32)
    assert np.array_equal(rotation.rht(x, sigma), np.full(d, spec.scale(d), np.float32))


@pytest.mark.parametrize("method", ["turboquant", "turboquant_rvq", "turboquant_prod", "rabitq"])
def test_signs_use_global_head_index(method):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, 5, 64)).astype(np.float32)
    full = reference.encode(x, spec.Params(method, seed=11, layer=2), "float32")
    part = reference.encode(x[:, 2:], spec.Params(method, seed=11, layer=2, head_offset=2), "float32")
    for name in full:
        assert np.array_equal(full[name][:, 2:], part[name]), name
    # and local order alone (head_offset 0) gives different codes: the test can fail
    wrong = reference.encode(x[:, 2:], spec.Params(method, seed=11, layer=2), "float32")
    assert not np.array_equal(wrong[list(wrong)[0]], full[list(full)[0]][:, 2:])
    dec_full = reference.decode(full, spec.Params(method, seed=11, layer=2), "float32")
    dec_part = reference.decode(part, spec.Params(method, seed=11, layer=2, head_offset=2), "float32")
    assert np.array_equal(dec_full[:, 2:], dec_part)
