"""accelerated.ops: spec examples, MLX primitives the bit-exact tier relies on, and input validation.

Expected values come from the spec text (examples, test vectors) or from an independent computation
(numpy bit manipulation, MLX's own mx.quantize for mlx_affine), never from the code under test.
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from veloxquant import spec
from veloxquant.accelerated import ops
from veloxquant.accelerated.ops import codebooks, numerics, packing, prng, rotation
from veloxquant.accelerated.stream import Stream


def _bits(a: mx.array) -> np.ndarray:
    return np.array(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a).view(np.uint32 if a.dtype == mx.float32 else np.uint16)


# -- spec examples ----------------------------------------------------------------------------------
def test_splitmix64_vectors():  # rotation.md
    s, out = 0, []
    for _ in range(3):
        s, w = prng.next_word(s)
        out.append(w)
    assert out == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def test_pack_example():  # packing.md
    w = packing.pack(mx.array([1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3], dtype=mx.uint32), 3)
    assert w.dtype == mx.uint32 and w.tolist() == [0x111F58D1, 0x00000003]
    assert packing.unpack(w, 3, 11).tolist() == [1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3]


@pytest.mark.parametrize("bits", range(1, 9))
def test_pack_roundtrip_and_zero_padding(bits):
    rng = np.random.default_rng(bits)
    c = rng.integers(0, 2**bits, (3, 37), dtype=np.uint32)
    w = np.array(packing.pack(mx.array(c), bits))
    k = 32 // bits
    want = np.zeros((3, -(-37 // k)), dtype=np.uint32)
    for j in range(37):  # the spec's loop, literally
        want[:, j // k] |= c[:, j] << np.uint32(bits * (j % k))
    assert np.array_equal(w, want)
    assert np.array_equal(np.array(packing.unpack(mx.array(w), bits, 37)), c)


def test_quantize_ties_go_low():  # codebooks.md examples
    _, b1 = codebooks.gaussian(1, 16)
    u = mx.array([0.0, -0.0, float.fromhex("0x1p-149")], dtype=mx.float32)
    assert codebooks.quantize(u, b1).tolist() == [0, 0, 1]
    _, b2 = codebooks.gaussian(2, 16)
    t = np.float32(np.array(b2)[2])
    assert codebooks.quantize(mx.array(np.array([t, np.nextafter(t, np.float32(np.inf))])), b2).tolist() == [2, 3]


def test_kivi_tie_example():  # methods/kivi.md: [0, 1, 2, 3, 0.5, 2.5, 1.5, ...] at b = 2
    v = np.zeros(16, dtype=np.float32)
    v[:7] = [0, 1, 2, 3, 0.5, 2.5, 1.5]
    x = mx.broadcast_to(mx.array(v), (1, 1, 16, 16))  # Q is a multiple of G for values too
    p = spec.Params("kivi", bits=2, group_size=16, role="v", window=0)
    r = ops.encode(x, p)
    assert r["scale"][0, 0, 0, 0].item() == 1.0 and r["zero"][0, 0, 0, 0].item() == 0.0
    assert packing.unpack(r["codes"], 2, 16)[0, 0, 5].tolist()[:7] == [0, 1, 2, 3, 0, 2, 2]


def test_zero_vector_turboquant():  # methods/turboquant.md: codes K/2-1, decode to +-0
    p = spec.Params("turboquant", bits=3)
    r = ops.encode(mx.zeros((1, 1, 1, 32)), p)
    assert packing.unpack(r["codes"], 3, 32).tolist() == [[[[3] * 32]]] and r["norm"].item() == 0.0
    assert np.all(np.array(ops.decode(r, p)) == 0.0)


# -- MLX primitives the tier relies on ------------------------------------------------------------
def _spec_hadamard_loop(x: np.ndarray, transpose: bool = False) -> np.ndarray:
    """rotation.md's two stages written as plain loops over numpy float32 (an independent oracle)."""
    d = x.shape[-1]
    m, n = spec.split_head_dim(d)
    v = x.copy()
    for b0 in range(0, d, n):                 # stage A on each block
        h = 1
        while h < n:
            for i0 in range(b0, b0 + n, 2 * h):
                a, b = v[:, i0:i0 + h].copy(), v[:, i0 + h:i0 + 2 * h].copy()
                v[:, i0:i0 + h], v[:, i0 + h:i0 + 2 * h] = a + b, a - b
            h *= 2
    if m == 1:
        return v
    hm = spec.hadamard_matrix(m)
    out = np.empty_like(v)
    for j in range(m):                         # stage B: +0, then +- w_k left to right
        acc = np.zeros((v.shape[0], n), np.float32)
        for k in range(m):
            sign = hm[k, j] if transpose else hm[j, k]
            w = v[:, k * n:(k + 1) * n]
            acc = acc + w if sign > 0 else acc - w
        out[:, j * n:(j + 1) * n] = acc
    return out


def _hadamard_inputs(d: int) -> np.ndarray:
    rng = np.random.default_rng(d)
    x = (rng.standard_normal((64, d)) * 2.0 ** rng.integers(-40, 40, (64, d))).astype(np.float32)
    x[0], x[1] = 0.0, -0.0                                           # signed zeros: stage B starts at +0
    x[2] = np.where(rng.random(d) < 0.5, np.float32(0.0), np.float32(-0.0))
    x[3] = (rng.standard_normal(d) * 2.0 ** -140).astype(np.float32)   # subnormals (no flush to zero)
    if spec.split_head_dim(d)[1] == 1:   # n = 1: each w_k is an input; signs making every term -0
        m = d
        x[4] = np.where(spec.hadamard_matrix(m)[0] > 0, np.float32(-0.0), np.float32(0.0))
    return x


@pytest.mark.parametrize("d", spec.HEAD_DIMS)
def test_builtin_hadamard_equals_the_spec_on_cpu(d):
    """rotation.BUILTIN_VERIFIED lists CPU: this is the verification (mixed exponents, signed zeros,
    subnormals), for H at every head dim; Hᵀ goes through mx.hadamard_transform only where Hᵀ = H."""
    x = _hadamard_inputs(d)
    with mx.stream(mx.cpu):
        got = mx.hadamard_transform(mx.array(x), scale=1.0)
        want = rotation.explicit(mx.array(x))
        want_t = rotation.explicit(mx.array(x), transpose=True)
    assert np.array_equal(_bits(got), _bits(want))
    assert np.array_equal(np.array(want).view(np.uint32), _spec_hadamard_loop(x).view(np.uint32))
    assert np.array_equal(np.array(want_t).view(np.uint32), _spec_hadamard_loop(x, True).view(np.uint32))
    m = spec.split_head_dim(d)[0]
    hm = spec.hadamard_matrix(m)
    assert rotation._symmetric(m) == bool((hm == hm.T).all()) == (m in (1, 12))


def test_hadamard_dispatch_uses_explicit_transpose_for_asymmetric_h():
    """Hᵀ at m = 20, 28 differs from H, so the inverse never takes mx.hadamard_transform there (this
    test fails if hadamard(transpose=True) returned H)."""
    for d in (20, 80, 224):
        x = _hadamard_inputs(d)[5:9]
        with mx.stream(mx.cpu):
            got = np.array(rotation.hadamard(mx.array(x), transpose=True))
            fwd = np.array(rotation.hadamard(mx.array(x)))
        assert np.array_equal(got.view(np.uint32), _spec_hadamard_loop(x, True).view(np.uint32))
        assert not np.array_equal(got, fwd)


def test_casts_are_rne_with_overflow_to_inf():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(200000) * 2.0 ** rng.integers(-30, 20, 200000)).astype(np.float32)
    x[:4] = [65519.0, 65520.0, 70000.0, float.fromhex("0x1p-25")]
    got16 = np.array(mx.array(x).astype(mx.float16))
    with np.errstate(over="ignore"):
        assert np.array_equal(got16.view(np.uint16), x.astype(np.float16).view(np.uint16))
    u = x.view(np.uint32).astype(np.uint64)
    want_bf = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    assert np.array_equal(_bits(mx.array(x).astype(mx.bfloat16)), want_bf)


def test_constants_are_float32():
    for c in (numerics.scale(128), numerics.qjl_scale(64), numerics.rint_magic(), numerics.f32(0.5)):
        assert c.dtype == mx.float32
    x = mx.ones((2,), dtype=mx.float32)
    assert (x * numerics.scale(32)).dtype == mx.float32
    assert numerics.rint(mx.array([0.5, 1.5, 2.5, 254.5])).tolist() == [0.0, 2.0, 2.0, 254.0]


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.float32])
@pytest.mark.parametrize("bits,g", [(2, 32), (4, 64), (8, 128), (4, 32)])
def test_mlx_affine_matches_mx_quantize_on_cpu(dtype, bits, g):
    """spec/methods/mlx_affine.md is MLX's CPU mx.quantize/dequantize: compare with the real thing."""
    rng = np.random.default_rng(bits * g)
    x = rng.standard_normal((1, 4, 20, 128)) * np.exp(rng.uniform(-6, 6, (1, 4, 20, 1))) + rng.uniform(-3, 3, (1, 4, 20, 1))
    x[0, 0, :2] = 0.0
    x[0, 1, 0] = -np.abs(x[0, 1, 0])
    xm = mx.array(x.astype(np.float32)).astype(dtype)
    p = spec.Params("mlx_affine", bits=bits, group_size=g)
    r = ops.encode(xm, p)
    with mx.stream(mx.cpu):
        w, s, b = mx.quantize(xm.reshape(-1, 128), group_size=g, bits=bits, mode="affine")
        deq = mx.dequantize(w, s, b, group_size=g, bits=bits, mode="affine").astype(mx.float32)
    assert np.array_equal(np.array(r["codes"]).reshape(-1, w.shape[-1]), np.array(w))
    assert np.array_equal(_bits(r["scales"]).reshape(-1), _bits(s).reshape(-1))
    assert np.array_equal(_bits(r["biases"]).reshape(-1), _bits(b).reshape(-1))
    assert np.array_equal(_bits(ops.decode(r, p)).reshape(-1), _bits(deq).reshape(-1))


# -- validation: ValueError naming the argument ----------------------------------------------------
def _x(shape=(1, 2, 4, 16), dtype=mx.float32):
    return mx.ones(shape, dtype=dtype)


@pytest.mark.parametrize("bad,name", [
    (lambda: ops.encode(_x(dtype=mx.int32), spec.Params("turboquant")), "x"),
    (lambda: ops.encode(_x(dtype=mx.uint16), spec.Params("turboquant")), "x"),
    (lambda: ops.encode(mx.ones((2, 4, 16)), spec.Params("turboquant")), "x"),
    (lambda: ops.encode(_x((1, 2, 0, 16)), spec.Params("turboquant")), "x"),
    (lambda: ops.encode(_x((1, 2, 4, 36)), spec.Params("turboquant")), "x"),        # 36 is not m * 2^k
    (lambda: ops.encode(_x((1, 2, 4, 2048)), spec.Params("turboquant")), "x"),      # beyond 1024
    (lambda: ops.encode(_x() * float("nan"), spec.Params("turboquant")), "x"),
    (lambda: ops.encode(_x() * float("inf"), spec.Params("kivi", window=0)), "x"),
    (lambda: ops.encode(np.ones((1, 2, 4, 16), np.float32), spec.Params("turboquant")), "x"),
    (lambda: ops.encode(_x() * 1e30, spec.Params("rabitq")), "x"),                  # norm overflows
    (lambda: ops.encode(mx.concatenate([_x((1, 1, 16, 16)) * -1e6, _x((1, 1, 16, 16)) * 1e6], axis=2),
                        spec.Params("kivi", group_size=32, role="k", window=0)), "x"),  # fp16 scale inf
    (lambda: ops.encode(_x((1, 2, 16, 16)) * 1e5, spec.Params("kivi", group_size=16, role="v", window=0)), "x"),
    (lambda: ops.encode(_x((1, 1, 1, 32)) * mx.array([3e38, -3e38] * 16), spec.Params("mlx_affine", group_size=32)), "x"),
    (lambda: ops.encode(_x(), spec.Params("turboquant"), "float16"), "x"),     # declared dtype differs
    (lambda: ops.encode(_x(), spec.Params("turboquant"), "int8"), "dtype"),
    (lambda: ops.encode(_x(), spec.Params("turboquant", bits=5)), "bits"),
    (lambda: ops.encode(_x(), spec.Params("turboquant_rvq", bits2=7)), "bits2"),
    (lambda: ops.encode(_x(), spec.Params("kivi", group_size=24)), "group_size"),
    (lambda: ops.encode(_x(), spec.Params("kivi", group_size=32, role="v")), "group_size"),
    (lambda: ops.encode(_x((1, 2, 4, 80)), spec.Params("kivi", group_size=32, role="v")), "group_size"),
    (lambda: ops.encode(_x((1, 2, 4, 96)), spec.Params("mlx_affine", group_size=64)), "group_size"),
    (lambda: ops.encode(_x(), spec.Params("turboquant", window=-1)), "window"),
    (lambda: ops.encode(_x(), spec.Params("turboquant", role="q")), "role"),
    (lambda: ops.encode(_x(), spec.Params("turboquant", seed=2**64)), "seed"),
    (lambda: ops.encode(_x(), spec.Params("turboquant", layer=-1)), "layer"),
    (lambda: ops.encode(_x(), spec.Params("turboquant", head_offset=2**32)), "head_offset"),
    (lambda: ops.encode(_x(), spec.Params("nope")), "method"),
    (lambda: ops.decode({"codes": mx.zeros((1, 2, 4, 8), dtype=mx.uint32)}, spec.Params("turboquant")), "record"),
    (lambda: Stream(spec.Params("turboquant")).trim(-1), "n"),
])
def test_errors_name_the_argument(bad, name):
    with pytest.raises(ValueError) as e:
        bad()
    assert str(e.value).startswith(f"{name}:"), str(e.value)


def test_window_tokens_are_not_norm_checked():
    """streaming.md: per-method rules apply to the tokens encoded; an overflowing window token is kept."""
    x = mx.concatenate([_x((1, 2, 3, 16)), _x((1, 2, 1, 16)) * 1e30], axis=2)
    r = ops.encode(x, spec.Params("turboquant", window=1))
    assert r["norm"].shape == (1, 2, 3) and r["window"].shape == (1, 2, 1, 16)


@pytest.mark.parametrize("method", spec.METHODS)
def test_everything_in_the_window_encodes_nothing(method):
    """T <= R: Q = 0, empty encoded fields of the right shapes, decode is the exact upcast."""
    p = spec.Params(method, window=5).resolved()
    x = mx.array(np.random.default_rng(6).standard_normal((2, 3, 4, 64)).astype(np.float32)).astype(mx.bfloat16)
    r = ops.encode(x, p, "bfloat16")
    assert all(v.shape[2] == 0 for k, v in r.items() if k != "window")
    assert np.array_equal(np.array(ops.decode(r, p)), np.array(x.astype(mx.float32)))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("bits,group", [(2, 32), (4, 32), (4, 64), (2, 128), (4, 128)])
def test_mlx_affine_decode_table_equals_elementwise(dtype, bits, group, monkeypatch):
    """mlx_affine's decode on the CPU reads T(T(c S) + Bi) from a per-group table of the 2^bits levels: the same
    bits as the elementwise decode, on encoded groups and on scales and biases drawn over the dtype's range."""
    from veloxquant.accelerated.ops import mlx_affine as ma
    dt = getattr(mx, dtype)
    p = spec.Params("mlx_affine", bits=bits, group_size=group, window=0).resolved()
    assert ma._per_group_table(p, dt) == (mx.default_device() == mx.cpu)
    rng = np.random.default_rng(bits * group)
    x = mx.array(rng.standard_normal((2, 3, 24, 128)).astype(np.float32)).astype(dt)
    f = {k: v for k, v in ops.encode(x, p, dt).items() if k != "window"}
    wide = {n: mx.array((rng.standard_normal(f[n].shape) * 10.0 ** rng.integers(-8, 4, size=f[n].shape))
                        .astype(np.float32)).astype(dt) for n in ("scales", "biases")}
    for fields in (f, {**f, **wide}):
        monkeypatch.setattr(ma, "_per_group_table", lambda p, dt: True)
        got = ma.decode_tokens(fields, p, 128)
        monkeypatch.setattr(ma, "_per_group_table", lambda p, dt: False)
        want = ma.decode_tokens(fields, p, 128)
        assert mx.array_equal(got.view(mx.uint32), want.view(mx.uint32)).item(), \
            f"mlx_affine decode_tokens(bits={bits}, G={group}, {dtype}): table and elementwise differ"
