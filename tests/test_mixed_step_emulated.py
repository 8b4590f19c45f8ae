"""The non-ragged mixed pair's fused decode step (accelerated/in_place.py's InPlace with `mixed`, kernels/decode_step.py)
with keys of their own coordinate groups (mlx_affine, G_k 32 or 64) beside KIVI values (G 16 or 32), through the
library's own DecodeStep with every launch run by its kernel body on the CPU (tests/test_ragged_step_emulated.py's
`bodies`): the plan's first step the append kernel alone (kernels/append.py MIXED, no rphase), every later one the
MIXED partial with the append inside and its combine. A single cache, and a B-row batch whose rows are whole value
groups apart (cache/batch_shared.py: the row starts mask). After every step each row's stored bytes (from its first
position) and window are its single cache's (the MLX ops path), and its output is within the emulated tests' tolerance
of float64 over that single cache. The ragged plans' counterpart: tests/test_ragged_mixed_step_emulated.py."""
from __future__ import annotations

import dataclasses

import mlx.core as mx
import numpy as np
import pytest

import veloxquant.accelerated.cache as vc
from veloxquant.accelerated import attention as vattention
from veloxquant.accelerated import layouts
from veloxquant.accelerated.cache import masks
from veloxquant.accelerated.cache.batch_shared import SharedBatchVeloxKVCache
from veloxquant.accelerated.kernels import append as fused
from veloxquant.accelerated.kernels import attention as katt
from _batch_util import D, H, filled_with, kv
import test_ragged_step_emulated as rse
from test_ragged_step_emulated import bodies   # noqa: F401  (the fixture)

REP = 2


class _MixedAppend(rse.MixedAppend):
    """The append kernel's MIXED variant without rphase (vq_append_mlx_affine_kivi_m01, or _m11 with the keys'
    window) run by its body."""
    ragged = False


def _maker(kg: int, g: int, window: int, kwin: int):
    def make():
        c = vc.VeloxKVCache(key_method="mlx_affine", key_bits=4, value_method="kivi", value_bits=2, group_size=kg,
                            seed=2, layer=1, window=window)
        c.value_params = dataclasses.replace(c.value_params, group_size=g)     # (the values' own G)
        c.key_params = dataclasses.replace(c.key_params, window=kwin)
        return c
    return make


def _rows(c, b: int, lp: list) -> list:
    """Each row's (keys' record, values' record) from its first position: the B-row cache's rows past their left
    padding (a group field's rows past lp / G)."""
    out = []
    for i in range(b):
        per_role = []
        for s in (c._k, c._v):
            p, rec = s.params, s.record()
            group = layouts.of(p).group_rows(p.role)
            per_role.append({n: a[i:i + 1] if n == "window" else
                             a[i:i + 1, :, lp[i] // (p.group_size if n in group else 1):] for n, a in rec.items()})
        out.append(per_role)
    return out


# (id, keys' G, values' G, values' R, keys' R, lengths): the first length puts the values' first step at a flush
CASES = [("kg32-g16-R8", 32, 16, 8, 0, [55]), ("kg32-g16-R8-K8", 32, 16, 8, 8, [55]),
         ("kg64-g32-R32-K32", 64, 32, 32, 32, [95]),
         ("kg32-g16-R8-batch", 32, 16, 8, 0, [55, 23, 39]), ("kg64-g32-R32-K32-batch", 64, 32, 32, 32, [95, 31, 63])]


@pytest.mark.parametrize("whole", [False, True], ids=["views", "whole-windows"])
@pytest.mark.parametrize("kg, g, window, kwin, lengths", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_mixed_affine_keys_step_as_their_own_cache_through_the_fused_decode_step(bodies, monkeypatch,  # noqa: F811
                                                                                 tune, kg, g, window, kwin, lengths,
                                                                                 whole):
    """G + 2 steps (every row's values flush once at least): each row's bytes and output its single cache's after
    every step; every step but the first one DecodeStep with the append inside the MIXED partial. `whole`: tuning's
    whole_windows (the window buffers whole, csrc/window_bind.h: the same bytes and outputs)."""
    tune(whole_windows=whole)
    monkeypatch.setattr(rse, "_Append", _MixedAppend)
    make = _maker(kg, g, window, kwin)
    steps = g + 2
    want = rse._singles(make, lengths, [900 + s for s in range(steps)])
    caches = filled_with(make, lengths, seed=7)
    c = vc.VeloxKVCache.merge(caches) if len(lengths) > 1 else caches[0]
    lp = [max(lengths) - n for n in lengths]
    if len(lengths) > 1:
        assert isinstance(c, SharedBatchVeloxKVCache) and c.left_padding.tolist() == lp, "not one B-row cache"
    inner = getattr(c, "inner", c)
    for step in range(steps):
        k, v = kv(1, 900 + step, b=len(lengths))
        q = mx.random.normal((len(lengths), REP * H, 1, D), key=mx.random.key(900 + step)).astype(mx.float16)
        mask = masks.row_starts(c.make_mask(1)) if len(lengths) > 1 else None
        kk, vv = c.update_and_fetch(k, v)
        assert (kk.step is not None) == (step > 0), f"step {step}: DecodeStep {kk.step}"
        out = np.array(vattention.attend(q, kk, vv, D ** -0.5, mask).astype(mx.float32))
        rse.rows_like_singles(want[step], _rows(inner, len(lengths), lp).__getitem__, q, out, f"step {step}")
    assert bodies.appends == 1, f"{bodies.appends} append launches alone"
    fused_steps = [x for x in bodies.launches if x["key"][6]]
    assert all((len(x["key"]) > 9) == whole for x in fused_steps), "whole_windows: the decode steps' kernels"
    assert len(fused_steps) == steps - 1 and all(x["key"][2] == (4 if kwin else 3) for x in bodies.launches), \
        sorted({x["key"] for x in bodies.launches})


class _KeysAppend(rse._Append):
    """The append kernel's MIXED variant with KIVI keys beside per-token values, without rphase
    (vq_append_kivi_{values' method}_m10) run by its body."""

    def __init__(self, ns, name, names):
        rest = name.removeprefix("vq_append_kivi_").replace("_apart", "")
        self.mv = rest[:rest.find("_m10")]
        assert self.mv in layouts.KERNEL_IDS and self.mv != "kivi" and name.endswith("_m10"), name
        self.ns, self.names = ns, list(names)
        self.apart, self.ragged, self.win = "_apart" in name, False, (True, False)

    def _body(self) -> str:
        return fused.body("kivi", self.mv, self.apart, self.win, False)


# (id, keys' G, keys' bits, values' turboquant bits, length): KIVI keys with R = 0 beside turboquant values (the
# quality recommendation's 5-bit pick: kivi 4 + turboquant 4, window 0); the length puts a flush (the group's last
# token the chunk's own: in_place.InPlace.owns) among the fused steps; -first: at the first step too (the append alone)
KEYS_R0_CASES = [("kivi4-g64-tq4", 64, 4, 4, 64 + 20), ("kivi2-g16-tq3", 16, 2, 3, 16 + 5),
                 ("kivi4-g64-tq4-first", 64, 4, 4, 64 + 63)]


@pytest.mark.parametrize("tc", [False, True], ids=["scalar", "tc_mixkv"])
@pytest.mark.parametrize("g, kbits, vbits, length", [c[1:] for c in KEYS_R0_CASES], ids=[c[0] for c in KEYS_R0_CASES])
def test_mixed_kivi_keys_without_a_window_step_as_their_own_cache(bodies, monkeypatch, tune, g, kbits,  # noqa: F811
                                                                  vbits, length, tc):
    """G + 2 steps of one cache, the keys flushing at the steps the length says (inside a fused step; -first also at
    the first, the append alone): after every step the stored bytes and window are the single cache's (the ops path),
    the output within tolerance of float64 over it; every step but the first the MIXED partial (HASWIN 2) with the
    append inside, on the scalar loop or (tuning's tc_mixkv) TC_MIXK; at a flush the launch's keys window is the
    chunk's row (in_place.InPlace.windows), which the body writes."""
    monkeypatch.setattr(rse, "_Append", _KeysAppend)
    monkeypatch.setattr(katt, "_mma_available", lambda: tc)
    tune(tc_mixkv=tc)

    def make():
        return vc.VeloxKVCache(key_method="kivi", key_bits=kbits, value_method="turboquant", value_bits=vbits,
                               group_size=g, seed=2, layer=1, window=0)
    steps = g + 2
    want = rse._singles(make, [length], [900 + s for s in range(steps)])
    c = filled_with(make, [length], seed=7)[0]
    flushed = []
    for step in range(steps):
        k, v = kv(1, 900 + step)
        q = mx.random.normal((1, REP * H, 1, D), key=mx.random.key(900 + step)).astype(mx.float16)
        before = c._k._q
        kk, vv = c.update_and_fetch(k, v)
        assert (kk.step is not None) == (step > 0), f"step {step}: DecodeStep {kk.step}"
        out = np.array(vattention.attend(q, kk, vv, D ** -0.5, None).astype(mx.float32))
        rse.rows_like_singles(want[step], _rows(c, 1, [0]).__getitem__, q, out, f"step {step}")
        flushed += [step] * (c._k._q > before)
    assert flushed == [s for s in range(steps) if (length + s + 1) % g == 0], f"the keys flushed at steps {flushed}"
    assert bodies.appends == 1, f"{bodies.appends} append launches alone"
    fused_steps = [x for x in bodies.launches if x["key"][6]]
    assert len(fused_steps) == steps - 1 and all(x["key"][2] == 2 and x["key"][4] == (katt.src.TC_MIXK if tc else 0)
                                                 for x in bodies.launches), sorted({x["key"] for x in bodies.launches})
    wins = [x["window"] for x in bodies.launches]
    assert any(a == g - 1 and b == 1 for a, b in zip(wins, wins[1:])), f"no flush with the chunk's row as kw: {wins}"
