"""Every rejection rule of spec/number-model.md raises ValueError naming the argument (reference layer)."""
import numpy as np
import pytest

from veloxquant import spec
from veloxquant import reference

GOOD = np.ones((1, 2, 4, 16), np.float32)


def rejects(arg, x=GOOD, dtype="float32", method="turboquant", **kw):
    with pytest.raises(ValueError, match=rf"^{arg}\b"):
        reference.encode(x, spec.Params(method, **kw), dtype)


@pytest.mark.parametrize("method", ["turboquant", "turboquant_rvq", "turboquant_prod", "rabitq", "kivi",
                                    "mlx_affine"])
def test_x_rules(method):
    kw = {"kivi": {"group_size": 16, "window": 0}, "mlx_affine": {"group_size": 32}}.get(method, {})
    x16 = np.ones((1, 2, 16, 32), np.float32)
    rejects("x", x16.astype(np.float16), "float32", method, **kw)         # array dtype != dtype
    rejects("x", x16.astype(np.float64), "float32", method, **kw)         # float64 never accepted
    rejects("x", x16.astype(np.float32), "bfloat16", method, **kw)        # bf16 must be uint16 bits
    rejects("x", x16[0], "float32", method, **kw)                         # rank 3
    rejects("x", x16[:, :, :0], "float32", method, **kw)                  # empty axis
    rejects("x", x16.tolist(), "float32", method, **kw)                   # not an array
    for d in (8, 36, 2048):                                              # not m * 2^k in [16, 1024]
        with pytest.raises(ValueError, match=r"^x: head dim"):
            reference.encode(np.ones((1, 1, 16, d), np.float32), spec.Params(method, **kw), "float32")
    for bad in (np.nan, np.inf, -np.inf):
        x = x16.copy(); x[0, 1, 3, 5] = bad
        rejects("x", x, "float32", method, **kw)
    xb = np.full((1, 2, 16, 32), 0x7FC0, np.uint16)                       # bf16 NaN pattern
    rejects("x", xb, "bfloat16", method, **kw)
    xh = np.full((1, 2, 16, 32), np.inf, np.float16)
    rejects("x", xh, "float16", method, **kw)


def test_dtype_rule():
    for bad in ("float64", "bf16", None, np.float32):
        rejects("dtype", dtype=bad)


def test_parameter_rules():
    rejects("bits", bits=5)
    rejects("bits", method="turboquant_prod", bits=1)
    rejects("bits", method="rabitq", bits=2)
    rejects("bits", method="kivi", bits=9)
    rejects("bits2", method="turboquant_rvq", bits2=5)
    rejects("bits2", bits2=2)                                  # only turboquant_rvq takes bits2
    rejects("group_size", method="kivi", group_size=24)
    rejects("group_size", method="kivi", group_size=32, role="v")  # G > d for values
    rejects("window", window=-1)
    rejects("role", role="q")
    rejects("seed", seed=-1)
    rejects("seed", seed=1 << 64)
    rejects("layer", layer=1 << 32)
    rejects("head_offset", head_offset=-3)
    rejects("bits", method="mlx_affine", bits=3)
    rejects("group_size", method="mlx_affine", group_size=16)
    rejects("group_size", method="mlx_affine", group_size=32)      # G > d = 16
    x80 = np.ones((1, 1, 16, 80), np.float32)
    rejects("group_size", x80, method="mlx_affine", group_size=32)       # 32 does not divide 80
    rejects("group_size", x80, method="kivi", group_size=32, role="v")   # nor for kivi values
    reference.encode(x80, spec.Params("kivi", group_size=32, role="k"), "float32")   # keys: any d
    with pytest.raises(ValueError, match=r"^method"):
        reference.encode(GOOD, spec.Params("nope"), "float32")


def test_decode_rejects_malformed_record():
    p = spec.Params("turboquant")
    rec = reference.encode(GOOD, p, "float32")
    broken = dict(rec); del broken["norm"]
    with pytest.raises(ValueError, match=r"^record"):
        reference.decode(broken, p, "float32")
    with pytest.raises(ValueError, match=r"^record"):
        reference.decode(rec, p, "float16")              # window dtype disagrees with dtype
    with pytest.raises(ValueError, match=r"^dtype"):
        reference.decode(rec, p, "int8")
