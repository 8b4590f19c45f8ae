"""spec/ loader: constants are binary32-exact and equal to independently computed roundings, codebook
tables are sorted, symmetric, with binary32-midpoint boundaries; Params validation names the parameter."""
from __future__ import annotations

import io
from contextlib import redirect_stdout
from decimal import Decimal, getcontext
from fractions import Fraction

import numpy as np
import pytest

from veloxquant import spec
from veloxquant.tools import cli

getcontext().prec = 80
# pi to 70 digits (a published constant, not computed by code under test)
PI = Decimal("3.141592653589793238462643383279502884197169399375105820974944592307816")


def rne32(v: Fraction) -> np.float32:
    """Round an exact rational to binary32, ties to even, by comparing exact distances."""
    f = np.float32(float(v))
    cands = [np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))]
    best = min(cands, key=lambda c: (abs(Fraction(float(c)) - v), int(np.array(c).view(np.uint32)) & 1))
    return np.float32(best)


def test_every_hex_constant_is_binary32_exact():
    f = spec.formats()
    strings = list(f["scale"].values()) + list(f["qjl_scale"].values()) + [f["rint_magic"]]
    cb = spec.codebooks()
    for t in list(cb["gaussian"].values()) + [t for row in cb["residual"].values() for t in row.values()]:
        strings += t["centroids"] + t["boundaries"]
    for s in strings:
        v = float.fromhex(s)
        assert float(np.float32(v)) == v, s
    assert spec.rint_magic() == np.float32(1.5 * 2 ** 23)


@pytest.mark.parametrize("d", spec.HEAD_DIMS)
def test_scale_is_rne_of_inverse_sqrt(d):
    exact = Fraction(Decimal(1) / Decimal(d).sqrt())   # 80 digits: far beyond a binary32 tie
    assert spec.scale(d) == rne32(exact)
    assert spec.scale(d).dtype == np.float32


@pytest.mark.parametrize("d", spec.HEAD_DIMS)
def test_qjl_scale_is_rne_of_sqrt_pi_over_2d(d):
    exact = Fraction((PI / (2 * Decimal(d))).sqrt())
    assert spec.qjl_scale(d) == rne32(exact)


def _tables():
    for b in (1, 2, 3, 4):
        yield f"gaussian{b}", spec.gaussian(b)
        for b2 in (1, 2, 3, 4):
            yield f"residual{b}.{b2}", spec.residual(b, b2)


@pytest.mark.parametrize("name,book", list(_tables()))
def test_codebook_sorted_symmetric_midpoints(name, book):
    c, bnd = book.centroids, book.boundaries
    assert c.dtype == np.float32 and bnd.dtype == np.float32
    k = c.size
    assert k in (2, 4, 8, 16) and bnd.size == k - 1
    assert np.all(np.diff(c.astype(np.float64)) > 0), name
    assert np.array_equal(c, -c[::-1]), name
    for i in range(k - 1):
        mid = (Fraction(float(c[i])) + Fraction(float(c[i + 1]))) / 2
        assert bnd[i] == rne32(mid), (name, i)
    assert bnd[k // 2 - 1] == 0 and not np.signbit(bnd[k // 2 - 1])
    assert not book.centroids.flags.writeable


def test_gaussian_mse_matches_the_spec_reference_values():
    for b, ref in zip((1, 2, 3, 4), (0.3634, 0.1175, 0.03455, 0.009500)):
        mse = float.fromhex(spec.codebooks()["gaussian"][str(b)]["mse"])
        assert abs(mse - ref) / ref < 2e-3, (b, mse)


def test_codebooks_check_cli_passes():
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = cli.main(["codebooks", "check"])
    assert rc == 0, buf.getvalue()


def test_words_per_row_and_encoded_tokens():
    assert [spec.words_per_row(128, b) for b in range(1, 9)] == [4, 8, 13, 16, 22, 26, 32, 32]
    assert spec.words_per_row(11, 3) == 2
    p = spec.Params("kivi", group_size=32, window=5).resolved()
    assert [p.encoded_tokens(t) for t in (0, 5, 36, 37, 69, 70)] == [0, 0, 0, 32, 64, 64]
    q = spec.Params("turboquant", window=3).resolved()
    assert [q.encoded_tokens(t) for t in (0, 3, 4, 10)] == [0, 0, 1, 7]


def test_params_defaults_follow_formats_toml():
    for m in spec.METHODS:
        info = spec.method_info(m)
        p = spec.Params(m).resolved()
        assert p.bits == info["default_bits"] and p.window == info["default_window"]
        if m == "turboquant_rvq":
            assert p.bits2 == p.bits
        assert p.group_size == info.get("default_group_size")


BAD = [
    (dict(method="turboquant", bits=5), "bits"),
    (dict(method="turboquant", bits=0), "bits"),
    (dict(method="turboquant", bits=True), "bits"),
    (dict(method="turboquant", bits=2.0), "bits"),
    (dict(method="turboquant_prod", bits=1), "bits"),
    (dict(method="rabitq", bits=2), "bits"),
    (dict(method="kivi", bits=9), "bits"),
    (dict(method="turboquant_rvq", bits2=5), "bits2"),
    (dict(method="turboquant", bits2=2), "bits2"),
    (dict(method="kivi", group_size=8), "group_size"),
    (dict(method="turboquant", group_size=32), "group_size"),
    (dict(method="mlx_affine", group_size=16), "group_size"),
    (dict(method="turboquant", window=-1), "window"),
    (dict(method="turboquant", window=1 << 21), "window"),
    (dict(method="turboquant", seed=-1), "seed"),
    (dict(method="turboquant", seed=1 << 64), "seed"),
    (dict(method="turboquant", layer=1 << 32), "layer"),
    (dict(method="turboquant", head_offset=-1), "head_offset"),
    (dict(method="turboquant", role="q"), "role"),
    (dict(method="nope"), "method"),
]


@pytest.mark.parametrize("kw,name", BAD, ids=[f"{k['method']}-{n}" for k, n in BAD])
def test_params_validation_names_the_parameter(kw, name):
    with pytest.raises(ValueError, match=rf"^{name}:"):
        spec.Params(**kw).resolved()


def test_check_head_dim():
    p = spec.Params("turboquant").resolved()
    for d in spec.HEAD_DIMS:
        p.check_head_dim(d)
    for d in (8, 12, 36, 44, 60, 2048, 1536):   # not m * 2^k with m in (1, 12, 20, 28), or outside [16, 1024]
        with pytest.raises(ValueError, match=r"^x: head dim"):
            p.check_head_dim(d)
    with pytest.raises(ValueError, match=r"^group_size:"):
        spec.Params("kivi", role="v", group_size=32).resolved().check_head_dim(16)
    spec.Params("kivi", role="k", group_size=32).resolved().check_head_dim(16)   # keys group over tokens
    # G must divide d where groups run along d (kivi values, mlx_affine): G <= d is not enough
    for method, role, g, d in (("kivi", "v", 32, 80), ("kivi", "v", 64, 96), ("mlx_affine", "k", 64, 96),
                               ("mlx_affine", "v", 32, 80), ("mlx_affine", "k", 128, 192)):
        with pytest.raises(ValueError, match=r"^group_size: .* does not divide head dim"):
            spec.Params(method, role=role, group_size=g).resolved().check_head_dim(d)
    for method, role, g, d in (("kivi", "v", 16, 80), ("kivi", "k", 128, 20), ("mlx_affine", "k", 32, 96),
                               ("mlx_affine", "v", 64, 192), ("kivi", "v", 32, 96)):
        spec.Params(method, role=role, group_size=g).resolved().check_head_dim(d)


def test_split_head_dim():
    assert [spec.split_head_dim(d) for d in (16, 20, 24, 28, 80, 96, 192, 896, 1024)] == [
        (1, 16), (20, 1), (12, 2), (28, 1), (20, 4), (12, 8), (12, 16), (28, 32), (1, 1024)]
    with pytest.raises(ValueError, match=r"^x: head dim 36"):
        spec.split_head_dim(36)


def test_bits2_default_is_bits():
    """methods/turboquant_rvq.md: bits2 not given means bits2 = bits (not the default bits)."""
    assert spec.method_info("turboquant_rvq")["default_bits2"] == "bits"
    for b in (1, 2, 3, 4):
        assert spec.Params("turboquant_rvq", bits=b).resolved().bits2 == b
