"""The mixed pair's in-place step in a ragged batch (cache/ragged_step.py's RaggedMixedInPlace: turboquant keys per
token with R = 0 beside KIVI values of each row's own phase) through the library's own DecodeStep, every launch run by
its kernel body on the CPU (tests/test_ragged_step_emulated.py's `bodies`): the plan's first step the append kernel
alone (kernels/append.py MIXED with rphase), every later one the ragged MIXED partial with the append inside (APPEND +
VQ_RAGGED + HASWIN 3) and its combine. The bodies write into the cache's own buffers, so what is checked is what the
host planned: each row's stored bytes after every step are, byte for byte, its single cache's (the MLX ops path), and
each row's output is within the emulated tests' tolerance of float64 over that single cache."""
from __future__ import annotations

import dataclasses
import types

import pytest

import veloxquant.accelerated.cache as vc
from veloxquant.accelerated.cache import ragged
from veloxquant.accelerated.kernels import append as fused
from _batch_util import filled_with
import test_ragged_step_emulated as rse
from test_ragged_step_emulated import bodies   # noqa: F401  (the fixture)


class _MixedAppend(rse._Append):
    """The append kernel's MIXED ragged variant (vq_append_turboquant_kivi_m01_g) run by its body."""

    def __init__(self, ns, name, names):
        assert name.startswith("vq_append_turboquant_kivi") and "_m01" in name and name.endswith("_g"), name
        self.ns, self.names = ns, list(names)
        self.apart, self.ragged = "_apart" in name, True

    def _lib(self, inputs, template):
        text = fused.body("turboquant", "kivi", self.apart, (False, True), True)
        with pytest.MonkeyPatch.context() as m:
            m.setattr(rse, "fused", types.SimpleNamespace(body=lambda *a: text))
            return super()._lib(inputs, template)


# (g16-R8: the 55-token row's phase flushes at the plan's first step, the append kernel's own launch)
CASES = [("g16-R8", 16, 8, [37, 50, 64, 21, 55]), ("g32-R128", 32, 128, [200, 163, 181, 150])]


@pytest.mark.parametrize("g, window, lengths", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_ragged_mixed_batch_steps_through_the_fused_decode_step(bodies, monkeypatch, g, window, lengths):  # noqa: F811
    monkeypatch.setattr(rse, "_Append", _MixedAppend)

    def make():
        c = vc.VeloxKVCache(key_method="turboquant", key_bits=3, value_method="kivi", value_bits=2, group_size=g,
                            seed=2, layer=1, window=window)
        c.key_params = dataclasses.replace(c.key_params, window=0)     # (the recommended pair: keys R = 0)
        return c
    steps = g + 2
    want = rse._singles(make, lengths, [900 + s for s in range(steps)])
    batch = vc.VeloxKVCache.merge(filled_with(make, lengths, seed=7))
    assert ragged.is_ragged(batch.inner), "not one ragged B-row cache"
    flushed = set()
    for step in range(steps):
        before = batch.inner._v.bounds()
        kk = rse._step(batch, 900 + step, want[step], f"step {step}")
        assert (kk.step is not None) == (step > 0), f"step {step}: DecodeStep {kk.step}"
        flushed.update(i for i, (b0, b1) in enumerate(zip(before, batch.inner._v.bounds())) if b1 > b0)
    assert flushed == set(range(len(lengths))), f"the steps flushed rows {sorted(flushed)} only"
    assert bodies.appends == 1, f"{bodies.appends} append launches alone (the plan's first step only)"
    fused_steps = [x for x in bodies.launches if x["key"][6]]
    assert len(fused_steps) == steps - 1 and all(x["key"][2] == 3 and x["key"][7] and x["key"][-1]
                                                 for x in fused_steps), sorted({x["key"] for x in bodies.launches})
