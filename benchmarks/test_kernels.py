"""The fused encode and decode kernels against the memory (what tools/bench/sweep.py measured): N vectors (B = 1,
8 heads, d = 128, float16, window 0), each method's kernel launch alone (accelerated.kernels' method module: encode
with its fault flags evaluated, decode of the record) against an fp16 copy of x (read + write: the memory's pace) and
mx.quantize / mx.dequantize (4 bits, groups of 64), in the same rounds. Recorded per benchmark: x GB/s (fp16 bytes of
x per second) and moved GB/s (bytes read + written: encode x + record, decode record + float32 output). Where the
kernels cannot run (the CPU; accelerated.kernels.available()) every benchmark skips with the reason."""
from __future__ import annotations

import pytest

import harness

SUITE = "kernels"
H, D = 8, 128
QGROUP, QBITS = 64, 4
CASES = {   # label -> (method, Params keywords)
    "turboquant b4": ("turboquant", dict(bits=4)),
    "turboquant_rvq 2+2": ("turboquant_rvq", dict(bits=2, bits2=2)),
    "turboquant_prod b4": ("turboquant_prod", dict(bits=4)),
    "rabitq": ("rabitq", dict()),
    "kivi b4 keys": ("kivi", dict(bits=4, group_size=32, role="k")),
    "kivi b4 values": ("kivi", dict(bits=4, group_size=32, role="v")),
    "mlx_affine b4": ("mlx_affine", dict(bits=4, group_size=64)),
}


def nbytes(out) -> int:
    """Bytes of an array, or of the arrays in a dict / list / tuple."""
    if isinstance(out, dict):
        return sum(nbytes(v) for v in out.values())
    if isinstance(out, (list, tuple)):
        return sum(nbytes(v) for v in out)
    return int(out.nbytes)


def gbps(bytes_: int, seconds: float | None) -> float | None:
    return bytes_ / seconds / 1e9 if seconds else None


@pytest.mark.parametrize("op", ["encode", "decode"])
@pytest.mark.parametrize("label", list(CASES))
def test_kernels(benchmark, bench, request, label, op, vectors):
    from veloxquant.accelerated import kernels
    ok, why = kernels.available()
    if not ok:
        pytest.skip(f"the fused kernels do not run here: {why}")
    import mlx.core as mx

    from veloxquant import spec
    sz = bench.sizes[SUITE]
    method, kw = CASES[label]
    p = spec.Params(method, window=0, **kw).resolved()
    km = kernels.method_module(method)
    t = vectors // H
    q = p.encoded_tokens(t)
    xs = [mx.random.normal((1, H, t, D), key=mx.random.key(i)).astype(mx.float16) for i in range(harness.POOL)]
    qs = [mx.quantize(x, group_size=QGROUP, bits=QBITS) for x in xs]
    recs = [km.encode_launch(x, p, q, 0)[0] for x in xs]
    mx.eval(xs, qs, [list(r.values()) for r in recs])
    xb = vectors * D * 2
    copy = lambda i: mx.eval((xs[i] * 1).astype(mx.float16))  # noqa: E731
    if op == "encode":
        def ours(i):
            fields, flags = km.encode_launch(xs[i], p, q, 0)
            mx.eval(list(fields.values()) + (list(flags) if flags else []))
        base = {"fp16 copy": copy, "mx.quantize": lambda i: mx.eval(*mx.quantize(xs[i], group_size=QGROUP, bits=QBITS))}
        moved = {"ours": xb + nbytes(recs[0]), "mx.quantize": xb + nbytes(qs[0])}
    else:
        ours = lambda i: mx.eval(km.decode_tokens(recs[i], p, D))  # noqa: E731
        base = {"fp16 copy": copy,
                "mx.quantize": lambda i: mx.eval(mx.dequantize(*qs[i], group_size=QGROUP, bits=QBITS))}
        moved = {"ours": nbytes(recs[0]) + 4 * vectors * D, "mx.quantize": nbytes(qs[0]) + xb}
    moved["fp16 copy"] = 2 * xb
    benchmark.group = f"kernels: {op} of {vectors} vectors, d {D}"
    res = harness.paired(benchmark, ours, base, rounds=sz["rounds"], warmup=sz["warmup"],
                         info=dict(suite=SUITE, arm=label, op=op, vectors=vectors, x_bytes=xb, moved_bytes=moved))
    med, bmed = res.get("median_s"), res.get("baseline_median_s", {})
    benchmark.extra_info["x_GBps"] = {"ours": gbps(xb, med), **{n: gbps(xb, bmed.get(n)) for n in base}}
    benchmark.extra_info["moved_GBps"] = {"ours": gbps(moved["ours"], med),
                                          **{n: gbps(moved[n], bmed.get(n)) for n in base}}
    bench.gate(request, SUITE, res)
