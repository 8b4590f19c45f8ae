"""Encode and decode of T tokens (B = 1, 8 heads, d = 128, float16), our MLX ops (accelerated.ops) against MLX's own
mx.quantize / mx.dequantize (4 bits, groups of 64) and against the numpy reference on the same inputs, in the same
rounds; gated: ours / mx.quantize and ours / reference per round (medians). The reference is timed every few rounds
only (it is slow)."""
from __future__ import annotations

import pytest

import harness

H, D = 8, 128
QGROUP, QBITS = 64, 4
METHODS = {   # about 4 bits per coordinate where the method allows
    "turboquant b4": ("turboquant", dict(bits=4)),
    "kivi b4": ("kivi", dict(bits=4, group_size=32, window=0)),
    "rabitq": ("rabitq", dict()),
}


@pytest.fixture(scope="module")
def inputs(bench):
    import mlx.core as mx
    import numpy as np
    t = bench.sizes["ops"]["tokens"]
    xs = [mx.random.normal((1, H, t, D), key=mx.random.key(i)).astype(mx.float16) for i in range(harness.POOL)]
    mx.eval(xs)
    return xs, [np.array(x) for x in xs]


@pytest.mark.parametrize("op", ["encode", "decode"])
@pytest.mark.parametrize("label", list(METHODS))
def test_ops(benchmark, bench, request, inputs, label, op):
    import mlx.core as mx

    from veloxquant import spec
    from veloxquant.accelerated import ops
    reference = pytest.importorskip("veloxquant.reference")
    sz = bench.sizes["ops"]
    method, kw = METHODS[label]
    p = spec.Params(method, **kw).resolved()
    xs, xs_np = inputs
    if op == "encode":
        ours = lambda i: mx.eval(*ops.encode(xs[i], p).values())  # noqa: E731
        base = {"mx.quantize": lambda i: mx.eval(*mx.quantize(xs[i], group_size=QGROUP, bits=QBITS)),
                "reference": lambda i: reference.encode(xs_np[i], p, "float16")}
    else:
        recs = [ops.encode(x, p) for x in xs]
        qs = [mx.quantize(x, group_size=QGROUP, bits=QBITS) for x in xs]
        mx.eval(recs, qs)
        rec_np = reference.encode(xs_np[0], p, "float16")   # the reference's decode input (one: it is slow)
        ours = lambda i: mx.eval(ops.decode(recs[i], p))  # noqa: E731
        base = {"mx.quantize": lambda i: mx.eval(mx.dequantize(*qs[i], group_size=QGROUP, bits=QBITS)),
                "reference": lambda i: reference.decode(rec_np, p, "float16")}
    benchmark.group = f"{op} {sz['tokens']} tokens x {H} heads, d {D}"
    res = harness.paired(benchmark, ours, base, rounds=sz["rounds"], warmup=sz["warmup"],
                         every={"reference": sz["reference_every"]},
                         info=dict(suite="ops", arm=label, op=op, tokens=sz["tokens"]))
    bench.gate(request, "ops", res)
