"""Bad input (spec/number-model.md "Special values", streaming.md step 1): a ValueError naming the
argument, and a stream left byte-identical by the rejected append (a later good append continues as if the
bad one never happened). Expectations come from the spec text, not from any implementation."""
from __future__ import annotations

import numpy as np

from .. import spec

from . import checks, data
from .conftest import selected_methods

NORM_METHODS = ("turboquant", "turboquant_rvq", "turboquant_prod", "rabitq")


def _x(shape, dtype, seed=0):
    return data.make_x(np.random.default_rng(seed), shape, dtype, "normal")


def _poison(x, dtype, value):
    """x with one element set to NaN/Inf (bf16 as its bit pattern)."""
    x = x.copy()
    v32 = np.array([value], dtype=np.float32)
    x[0, 0, -1, 3] = (v32.view(np.uint32) >> 16).astype(np.uint16)[0] if dtype == "bfloat16" else v32[0]
    return x


def _bad_inputs(method, dtype):
    """(label, x, argname) triples that every method must reject with the spec's argument name."""
    good = _x((1, 2, 3, 32), dtype)
    out = [("nan", _poison(good, dtype, np.nan), "x"),
           ("+inf", _poison(good, dtype, np.inf), "x"),
           ("-inf", _poison(good, dtype, -np.inf), "x"),
           ("empty-T", good[:, :, :0], "x"), ("empty-B", good[:0], "x"), ("empty-d", good[..., :0], "x"),
           ("rank3", good[0], "x"), ("rank5", good[None], "x"),
           ("head-dim-36", _x((1, 2, 3, 36), dtype), "x"), ("head-dim-8", _x((1, 2, 3, 8), dtype), "x"),
           ("head-dim-44", _x((1, 2, 3, 44), dtype), "x"),       # neither 36 nor 44 is m * 2^k
           ("head-dim-2048", _x((1, 1, 1, 2048), dtype), "x")]
    if dtype == "float32":
        out += [("int32", good.astype(np.int32), "x"), ("float64", good.astype(np.float64), "x")]
    if dtype == "float16":
        out += [("float32-as-float16", good.astype(np.float32), "x")]
    if method in NORM_METHODS and dtype != "float16":
        # squares overflow binary32 (fp16 values cannot: 65504^2 * 1024 < 3.4e38)
        huge = np.full((1, 2, 3, 32), 1e30, dtype=np.float32)
        out.append(("norm-overflow", data.to_dtype(huge, dtype), "x"))
    if method == "kivi" and dtype != "float16":
        # the group range / 1 does not fit float16 (bits=1 so L=1): scale is +Inf in float16
        wide = np.zeros((1, 2, 16, 32), dtype=np.float32)   # T = G = 16: the group is encoded
        wide[..., 0::2] = 1e6
        wide[..., 1::2] = -1e6
        out.append(("kivi-float16-overflow", data.to_dtype(wide, dtype), "x"))
        # the zero point alone overflows: a constant group at -70000 has S = 0 but z16 = -Inf (kivi.md step 3)
        out.append(("kivi-zero-overflow", data.to_dtype(np.full((1, 2, 16, 32), -7e4, np.float32), dtype), "x"))
    return out


def _params(method, **kw):
    if method == "kivi":
        kw.setdefault("group_size", 16)
        kw.setdefault("bits", 1)
        kw.setdefault("role", "v")
    if method == "mlx_affine":
        kw.setdefault("group_size", 32)
    return spec.Params(method, window=kw.pop("window", 0), **kw)


CELLS = [(m, dt) for m in spec.METHODS for dt in spec.DTYPES]


def pytest_generate_tests(metafunc):
    if {"method", "dtype"} <= set(metafunc.fixturenames):
        cells = [(m, dt) for m, dt in CELLS if m in selected_methods(metafunc.config)]
        if metafunc.function.__name__ == "test_group_must_divide_head_dim":
            cells = [(m, dt) for m, dt in cells if "group_sizes" in spec.method_info(m)]
        metafunc.parametrize("method,dtype", cells, ids=[f"{m}-{dt}" for m, dt in cells])


def test_encode_rejects(impl, methods_ok, tally, method, dtype):
    """One-shot encode of bad x raises ValueError naming x."""
    methods_ok(method)
    p = _params(method)
    for label, x, arg in _bad_inputs(method, dtype):
        tally.case()
        checks.check_raises(impl.encode, (x, p, dtype), arg,
                            checks.call_desc(f"{impl.name}.encode", p, dtype, np.shape(x), case=label))


def test_bad_params(impl, methods_ok, tally, method, dtype):
    """Parameters outside formats.toml are rejected naming the parameter (encode and new stream)."""
    methods_ok(method)
    info = spec.method_info(method)
    x = _x((1, 2, 3, 32), dtype)
    bad = [("bits", dict(bits=max(info["bits"]) + 1)), ("bits", dict(bits=0)),
           ("role", dict(role="q"))] + past_limits()
    if "group_sizes" in info:
        bad.append(("group_size", dict(group_size=24)))
    if method == "kivi":
        bad.append(("group_size", dict(group_size=64, role="v")))   # G > d for values
    if method == "turboquant_rvq":
        bad.append(("bits2", dict(bits2=5)))
    for arg, kw in bad:
        p = _params(method, **kw)
        tally.case()
        checks.check_raises(impl.encode, (x, p, dtype), arg,
                            checks.call_desc(f"{impl.name}.encode", p, dtype, x.shape))


def past_limits() -> list[tuple[str, dict]]:
    """Each common parameter one step past each end of its range (formats.toml [limits])."""
    lim = spec.formats()["limits"]
    return [("window", dict(window=-1)), ("window", dict(window=lim["window_max"] + 1)),
            ("seed", dict(seed=-1)), ("seed", dict(seed=int(lim["seed_max"], 16) + 1)),
            ("layer", dict(layer=-1)), ("layer", dict(layer=lim["layer_max"] + 1)),
            ("head_offset", dict(head_offset=-1)), ("head_offset", dict(head_offset=lim["head_offset_max"] + 1))]


def at_limits() -> list[dict]:
    """Each common parameter at the top of its range (all accepted, same bytes as the reference)."""
    lim = spec.formats()["limits"]
    return [dict(window=lim["window_max"]), dict(seed=int(lim["seed_max"], 16)), dict(layer=lim["layer_max"]),
            dict(head_offset=lim["head_offset_max"]),
            dict(seed=int(lim["seed_max"], 16), layer=lim["layer_max"], head_offset=lim["head_offset_max"] - 1)]


def test_params_at_limits(other, ref, methods_ok, tally, method, dtype):
    """The largest seed, layer, head_offset and window are accepted and give the reference's bytes
    (head_offset at its top with H = 2 puts global head 2^32 in play: 64-bit head index)."""
    methods_ok(method)
    x = _x((1, 2, 3, 32), dtype)
    for kw in at_limits():
        p = _params(method, **kw).resolved()
        tally.case()
        checks.check_encode_decode(other, ref, x, p, dtype)


def test_group_must_divide_head_dim(impl, methods_ok, tally, method, dtype):
    """Groups along d (kivi values, mlx_affine) need G to divide d, not only G <= d (spec 1.1); keys any d."""
    methods_ok(method)
    x = _x((1, 2, 16, 96), dtype)
    bad = [("group_size", dict(group_size=64, **({"role": "v"} if method == "kivi" else {})))]  # 64 <= 96
    x80 = _x((1, 2, 16, 80), dtype)
    bad.append(("group_size", dict(group_size=32, **({"role": "v"} if method == "kivi" else {}))))
    if method == "kivi":
        tally.case()
        impl.encode(x80, _params(method, group_size=32, role="k"), dtype)   # keys group tokens: accepted
    for (arg, kw), xx in zip(bad, (x, x80)):
        p = _params(method, **kw)
        tally.case()
        checks.check_raises(impl.encode, (xx, p, dtype), arg,
                            checks.call_desc(f"{impl.name}.encode", p, dtype, xx.shape))


def test_stream_state_unchanged(impl, methods_ok, tally, method, dtype):
    """A rejected append leaves the stream byte-identical; the next good append continues exactly."""
    methods_ok(method)
    p = _params(method)
    prefix = _x((1, 2, 16, 32), dtype, seed=1)   # one whole kivi group (G=16) gets encoded
    after = _x((1, 2, 5, 32), dtype, seed=2)
    for label, bad, arg in _bad_inputs(method, dtype):
        if label.startswith("empty") and label != "empty-T":
            continue
        if label == "empty-T":
            continue  # an empty chunk: the spec rejects it for encode; covered there
        if bad.ndim == 4 and bad.shape[3] != 32 and not label.startswith("head-dim"):
            continue
        tally.case()
        checks.check_stream_rejects(impl, p, dtype, prefix, bad, arg, after=after)
    # a chunk that does not continue the stream's (B, H, d)
    for label, shape in (("other-d", (1, 2, 2, 64)), ("other-H", (1, 3, 2, 32)), ("other-B", (2, 2, 2, 32))):
        tally.case()
        checks.check_stream_rejects(impl, p, dtype, prefix, _x(shape, dtype), "x", after=after)


def test_first_append_rejected(impl, methods_ok, tally, method, dtype):
    """A bad *first* append (NaN, wrong dtype, wrong rank or shape) is rejected naming x and leaves a stream
    that still takes any good first chunk, as a fresh stream would (its B, H, d and dtype are not fixed by
    the rejected chunk)."""
    methods_ok(method)
    p = _params(method)
    good = _x((1, 2, 16, 32), dtype, seed=3)
    bad = [(label, x) for label, x, _ in _bad_inputs(method, dtype) if label not in ("empty-T",)]
    for label, x in bad:
        tally.case()
        checks.check_stream_rejects(impl, p, dtype, None, x, "x", after=good)


def test_unknown_method(impl):
    """number-model.md 'Which error is reported' 1: an unknown method names `method` (spec 1.2: no golden case
    can hold it, since every case belongs to a method)."""
    checks.check_unknown_method(impl)
