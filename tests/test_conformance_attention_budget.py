"""conformance/attention_checks.py's attention budget for kivi and mlx_affine decoded inside a fused kernel
(GROUP_DECODE): c*S + Z as one fused multiply-add (one rounding instead of two) stays inside the budget, also
where a decoded value is exactly 0 (the case the H200 kernels failed on before the term), and an error a
few times larger does not."""
from __future__ import annotations

import numpy as np
import pytest

from veloxquant import spec
from veloxquant.conformance import attention_checks
from veloxquant.conformance.adapters.reference import ReferenceImpl


def _fused_decode(rec, p) -> np.ndarray:
    """c*S + Z rounded once to binary32 (a contracted decode), float32 records."""
    codes = np.asarray(rec["codes"])
    bits = p.bits
    per = 32 // bits
    d = codes.shape[-1] * per
    j = np.arange(d)
    c = (codes[..., j // per] >> (bits * (j % per)).astype(np.uint32)) & ((1 << bits) - 1)
    s = np.repeat(np.asarray(rec["scales"], np.float64), p.group_size, axis=-1)
    z = np.repeat(np.asarray(rec["biases"], np.float64), p.group_size, axis=-1)
    return (c.astype(np.float64) * s + z).astype(np.float32)


@pytest.mark.parametrize("zero_value", [True, False])
def test_group_decode_term(zero_value):
    ref = ReferenceImpl()
    p = spec.Params("mlx_affine", bits=4, group_size=32, window=0, role="v").resolved()
    rng = np.random.default_rng(7)
    v = rng.standard_normal((1, 1, 1, 32)).astype(np.float32)
    if zero_value:
        v[0, 0, 0, :] = np.linspace(-1.0, 1.0, 32, dtype=np.float32)
    rec = ref.encode(v, p, "float32")
    dec = ref.decode(rec, p, "float32")
    fused = _fused_decode(rec, p)
    assert np.any(fused != dec), "the fused decode should differ from the two-rounding decode somewhere"
    if zero_value:
        assert np.any((dec == 0) & (fused != 0)), "want a coordinate decoded to 0 exactly, moved by the FMA"
    q = rng.standard_normal((1, 1, 2, 32)).astype(np.float32)
    k = dec                                   # keys irrelevant for T = 1 (one token, weight 1)
    exp64, pw, k64, v64 = attention_checks.attention_f64(q, k, dec, 0.17)
    got = np.broadcast_to(fused.astype(np.float64), exp64.shape)      # T = 1: the output is the value row
    vz = attention_checks.group_zero_magnitude(rec, p, 1, "float32")
    budget = attention_checks.attention_budget(q, k64, v64, pw, 0.17, vz=vz)
    assert np.all(np.abs(got - exp64) <= budget), "a contracted decode must fit the budget"
    worst = np.abs(got - exp64).max()
    assert worst > 0
    if zero_value:
        old = attention_checks.attention_budget(q, k64, v64, pw, 0.17)
        assert np.any(np.abs(got - exp64) > old), "without GROUP_DECODE this case exceeded the budget"
    # (1, 1, 1, d) broadcast over the queries
    wrong = exp64 + 2 * attention_checks.ATTN_SAFETY * attention_checks.U32 * vz
    assert np.any(np.abs(wrong - exp64) > budget), "an error 2 * ATTN_SAFETY times the term must not fit"


@pytest.mark.parametrize("method,dtype", [("kivi", "float16"), ("kivi", "float32"), ("mlx_affine", "float16"),
                                          ("mlx_affine", "bfloat16")])
def test_no_group_decode_term_where_c_times_s_is_exact(method, dtype):
    """spec/methods/kivi.md: c*S is exact in binary32 when S is a 16-bit value (kivi's float16 scale, 16-bit
    mlx_affine), so a contracted c*S + Z equals the two-rounding decode bit for bit and the budget has no
    GROUP_DECODE term there (group_zero_magnitude is None)."""
    from veloxquant.reference import numerics, packing
    ref = ReferenceImpl()
    g = 32
    p = spec.Params(method, bits=8, group_size=g, window=0, role="v").resolved()
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((1, 2, 64, 64)) * 10.0 ** rng.integers(-3, 4, (1, 2, 64, 1))).astype(np.float32)
    if dtype == "float16":
        x = x.astype(np.float16)
    elif dtype == "bfloat16":
        x = numerics.to_bfloat16_bits(x)
    rec = ref.encode(x, p, dtype)
    c = packing.unpack(rec["codes"], 8, 64).astype(np.float64)
    s = numerics.upcast(rec["scale" if method == "kivi" else "scales"], "float16" if method == "kivi" else dtype)
    s = np.repeat(s.astype(np.float64), g, axis=-1)
    prod = c * s                                   # float64: exact for these operands
    assert np.array_equal(prod.astype(np.float32).astype(np.float64), prod), "c*S must be exact in binary32"
    assert attention_checks.group_zero_magnitude(rec, p, 64, dtype) is None
    assert attention_checks.group_zero_magnitude(rec, p, 64, "float32") is None if method == "kivi" else True
