"""The mixed pair's in-place step in a ragged batch (cache/ragged_step.py's RaggedMixedInPlace: turboquant keys per
token with R = 0 beside KIVI values of each row's own phase) through the library's own DecodeStep, every launch run by
its kernel body on the CPU (tests/test_ragged_step_emulated.py's `bodies`): the plan's first step the append kernel
alone (kernels/append.py MIXED with rphase), every later one the ragged MIXED partial with the append inside (APPEND +
VQ_RAGGED + HASWIN 3) and its combine. The bodies write into the cache's own buffers, so what is checked is what the
host planned: each row's stored bytes after every step are, byte for byte, its single cache's (the MLX ops path), and
each row's output is within the emulated tests' tolerance of float64 over that single cache."""
from __future__ import annotations

import dataclasses
import shutil

import pytest

import veloxquant.accelerated.cache as vc
from veloxquant.accelerated import layouts
from veloxquant.accelerated.kernels import attention as katt
import test_ragged_step_emulated as rse
from test_ragged_step_emulated import bodies   # noqa: F401  (the fixture)


# (g16-R8: the 55-token row's phase flushes at the plan's first step, the append kernel's own launch)
# (fuse_append off: every step's append is the kernel's own launch, then the ragged MIXED partial without it)
CASES = [("g16-R8", 16, 8, [37, 50, 64, 21, 55], True), ("g32-R128", 32, 128, [200, 163, 181, 150], True),
         ("g16-R8-append-alone", 16, 8, [37, 50, 64, 21, 55], False)]
# the keys with a window too (kwin: RaggedMixedWindowsInPlace, the MIXED partial's HASWIN 4): g16-R8-K8 one window for
# both roles, as a user's window applies to both; g16-R8-K12 the keys' the wider (the keys' token encoded past the
# values' boundary in some rows); g16-R8-K40 the keys' boundary below the values' least one (nenc the keys' count);
# g32-R32-K32 the benchmarks' window 32
WINDOWED_CASES = [("g16-R8-K8", 16, 8, 8, [37, 50, 64, 21, 55], True),
                  ("g16-R8-K12", 16, 8, 12, [37, 50, 64, 21, 55], True),
                  ("g16-R8-K40", 16, 8, 40, [37, 50, 64, 21, 55], True),
                  ("g32-R32-K32", 32, 32, 32, [200, 163, 181, 150], True),
                  ("g16-R8-K8-append-alone", 16, 8, 8, [37, 50, 64, 21, 55], False)]
# the values without a window (R = 0, the "window 0" setting; keys R = 0: RaggedMixedInPlace with its OWN texts, a
# flush's last value the chunk's own): rows of two or more phases (one phase: refused); g16: the 47-token row's
# phase flushes at the plan's first step (the append kernel alone, its own value: RaggedMixedInPlace.owns)
R0_CASES = [("g16-R0", 16, [37, 50, 64, 21, 47], True), ("g32-R0", 32, [200, 163, 181, 150], True),
            ("g16-R0-append-alone", 16, [37, 50, 64, 21, 47], False)]


def _maker(g: int, window: int, kwin: int = 0, key_method: str = "turboquant", key_bits: int = 3, kg: int = 0):
    def make():     # (kg: the keys' own group size, mlx_affine's coordinate groups; the values' G is g)
        c = vc.VeloxKVCache(key_method=key_method, key_bits=key_bits, value_method="kivi", value_bits=2,
                            group_size=kg or g, seed=2, layer=1, window=window)
        c.value_params = dataclasses.replace(c.value_params, group_size=g)
        c.key_params = dataclasses.replace(c.key_params, window=kwin)     # (the recommended pair: keys R = 0)
        return c
    return make


@pytest.mark.parametrize("g, window, lengths, inside", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_ragged_mixed_batch_steps_through_the_fused_decode_step(bodies, monkeypatch, tune,  # noqa: F811
                                                                  g, window, lengths, inside):
    _fused_steps(bodies, monkeypatch, tune, g, window, 0, lengths, inside)


@pytest.mark.parametrize("g, window, kwin, lengths, inside", [c[1:] for c in WINDOWED_CASES],
                         ids=[c[0] for c in WINDOWED_CASES])
def test_a_windowed_ragged_mixed_batch_steps_through_the_fused_decode_step(bodies, monkeypatch, tune,  # noqa: F811
                                                                           g, window, kwin, lengths, inside):
    """The keys with a window of their own (each step their oldest window token encoded in every row, the chunk
    copied into their window: append.MIXED's (kf, kw, vf, vw); the partial HASWIN 4 with the append inside)."""
    _fused_steps(bodies, monkeypatch, tune, g, window, kwin, lengths, inside)


@pytest.mark.parametrize("g, lengths, inside", [c[1:] for c in R0_CASES], ids=[c[0] for c in R0_CASES])
def test_a_ragged_mixed_batch_without_windows_steps_through_the_fused_decode_step(bodies, monkeypatch, tune,  # noqa
                                                                                  g, lengths, inside):
    """The values with R = 0 (keys R = 0 too): a flushing row's group ends with the chunk's own value (the append reads
    it from the chunk), which the window after the step keeps for the rows that do not flush; the fused partial is the
    OWN text (tag 'og': no window rows as the values' own)."""
    _fused_steps(bodies, monkeypatch, tune, g, 0, 0, lengths, inside)
    if inside:
        assert all(x["key"][8] == katt.src.OWN for x in bodies.launches if x["key"][6]), bodies.launches


# the other per-token key methods beside KIVI values (the same plans and texts, MK the key method's id): (method,
# bits); rabitq's codes 1-bit only
KEY_METHODS = [("turboquant_rvq", 3), ("turboquant_prod", 3), ("rabitq", 1)]
# mlx_affine keys, their coordinate groups (kg) another size than the values' G: (id, kg, values' G and R, lengths)
AFFINE_CASES = [("kg32-g16-R8", 32, 16, 8, [37, 50, 64, 21, 55]), ("kg64-g32-R32", 64, 32, 32, [200, 163, 181, 150])]


@pytest.mark.parametrize("kwin", [0, 8], ids=["keys-R0", "keys-R8"])
@pytest.mark.parametrize("method, bits", KEY_METHODS, ids=[m for m, _ in KEY_METHODS])
def test_a_ragged_mixed_batch_of_other_keys_steps_through_the_fused_decode_step(bodies, monkeypatch, tune,  # noqa
                                                                                method, bits, kwin):
    """Keys of another per-token method (R = 0: RaggedMixedInPlace, HASWIN 3; R = 8: RaggedMixedWindowsInPlace,
    HASWIN 4) beside KIVI values G = 16, R = 8: each row's bytes and output its single cache's after every step, every
    fused step's partial of that key method (MK)."""
    _fused_steps(bodies, monkeypatch, tune, 16, 8, kwin, [37, 50, 64, 21, 55], True, method, bits)
    assert {x["key"][0] for x in bodies.launches} == {layouts.KERNEL_IDS[method]}, bodies.launches


@pytest.mark.parametrize("kwin", [0, 8], ids=["keys-R0", "keys-R8"])
@pytest.mark.parametrize("kg, g, window, lengths", [c[1:] for c in AFFINE_CASES], ids=[c[0] for c in AFFINE_CASES])
def test_a_ragged_mixed_batch_of_affine_keys_steps_through_the_fused_decode_step(bodies, monkeypatch, tune,  # noqa
                                                                                 kg, g, window, lengths, kwin):
    """mlx_affine 4-bit keys (coordinate groups kg) beside KIVI values of another G: each row's bytes and output its
    single cache's after every one of G + 2 steps (a per-token scope's rows encode wherever x reaches the values'
    phase, append.RAGGED_ENCODES), every partial of the affine key method (MK)."""
    _fused_steps(bodies, monkeypatch, tune, g, window, kwin, lengths, True, "mlx_affine", 4, kg)
    assert {x["key"][0] for x in bodies.launches} == {layouts.KERNEL_IDS["mlx_affine"]}, bodies.launches


def _fused_steps(bodies, monkeypatch, tune, g, window, kwin, lengths, inside,  # noqa: F811
                 key_method="turboquant", key_bits=3, kg=0):
    """G + 2 steps of rse.fused_steps (each row's bytes and output its single cache's after every step), every row's
    values flushing; the first step's append the kernel's own launch, every later one inside the ragged MIXED partial
    (HASWIN 3, or 4 with the keys' window kwin) unless `inside` is off."""
    monkeypatch.setattr(rse, "_Append", rse.MixedAppend)
    tune(fuse_append=inside)
    rse.flushing_steps(bodies, _maker(g, window, kwin, key_method, key_bits, kg), lengths, g + 2, "_v", inside,
                       4 if kwin else 3)


@pytest.mark.parametrize("kwin", [0, 8], ids=["keys-R0", "keys-R8"])
def test_a_mixed_step_left_pending_is_stored_alone_by_a_read_of_the_cache(bodies, monkeypatch, tune, kwin):  # noqa
    """A read of the cache between a fused step's append and its attention (here its nbytes) launches the pending
    append alone (DecodeStep.flush) with the inputs the step made: its keys' first row `base` (the plan's base(), which
    the partial with the append inside never reads: it derives the row from nenc and the windows), its values' vbase;
    each row's bytes and output stay its single cache's after every step, no partial with the append inside."""
    monkeypatch.setattr(rse, "_Append", rse.MixedAppend)
    g, steps = 16, 18
    reads = []
    flushed = rse.fused_steps(_maker(g, 8, kwin), [37, 50, 64, 21, 55], steps, role="_v",
                              between=lambda c: reads.append(c.nbytes))
    assert flushed == set(range(5)) and len(reads) == steps, (sorted(flushed), len(reads))
    assert bodies.appends == steps, f"{bodies.appends} append launches alone for {steps} steps"
    assert len(bodies.launches) == steps and not any(x["key"][6] for x in bodies.launches), \
        sorted({x["key"] for x in bodies.launches})


# (name, G, values' R, keys' R, lengths, keys (method, bits, their group size)): the windowed and window-0 cases, and
# mlx_affine keys (coordinate groups of 32 beside the values' G = 16) at keys' R 0 and 8, for a CUDA GPU
AFFINE_KEYS = ("mlx_affine", 4, 32)
GPU_CASES = ([(c[0], *c[1:5], ("turboquant", 3, 0)) for c in WINDOWED_CASES if c[5]]
             + [(c[0], c[1], 0, 0, c[2], ("turboquant", 3, 0)) for c in R0_CASES if c[3]]
             + [("affine-kg32-keys-R0", 16, 8, 0, [37, 50, 64, 21, 55], AFFINE_KEYS),
                ("affine-kg32-keys-R8", 16, 8, 8, [37, 50, 64, 21, 55], AFFINE_KEYS)])


@pytest.mark.parametrize("g, window, kwin, lengths, keys", [c[1:] for c in GPU_CASES], ids=[c[0] for c in GPU_CASES])
def test_a_ragged_mixed_batch_steps_through_the_fused_decode_step_on_the_gpu(g, window, kwin, lengths, keys, tune,
                                                                             monkeypatch):
    """The windowed and the window-0 steps on a CUDA GPU (MLX's CUDA build, the kernels compiled and launched by MLX):
    each row's bytes and output its single cache's after every step, the fused steps' partial the ragged MIXED kernel
    with the append inside (HASWIN 4 with the keys' window; at window 0 HASWIN 3's OWN text) (skipped without a CUDA
    backend)."""
    from veloxquant.accelerated.kernels import backend
    if not backend.available()[0] or backend.backend() != "cuda":
        pytest.skip("no CUDA GPU backend here")
    tune(ragged=True, fuse_append=True)
    fused_ = rse.fused_partials(monkeypatch, _maker(g, window, kwin, *keys), lengths, g, "_v")
    want = (4, True) if kwin else (3, True if window else katt.src.OWN)
    assert fused_ and all((a["haswin"], a["ragged"]) == want for a in fused_), fused_


@pytest.mark.parametrize("keys", [("turboquant", 3, 0), ("mlx_affine", 4, 32)], ids=["turboquant", "affine-kg32"])
@pytest.mark.parametrize("kwin", [0, 8], ids=["keys-R0", "keys-R8"])
def test_a_rejected_mixed_step_rolls_every_row_back(bodies, monkeypatch, kwin, keys):  # noqa: F811
    """A NaN in one row's keys, stored by a fused step of the mixed plan (keys-R8: the windowed plan's, the NaN copied
    into the keys' window): the deferred check raises at a later step with every row back before that chunk (marks
    over the in-place buffers), and the steps after it (a new plan) keep each row its single cache's bytes."""
    monkeypatch.setattr(rse, "_Append", rse.MixedAppend)
    rse.rollback_case(bodies, _maker(16, 8, kwin, *keys), [37, 50, 64, 21, 55], vc.VeloxKVCache.merge)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: CUDA compile check skipped")
@pytest.mark.parametrize("win", [(False, True), (True, True)], ids=["values-window", "both-windows"])
def test_cuda_ragged_mixed_append_compiles(tmp_path, win):
    """The append kernel alone for the mixed plans (kernels/append.py MIXED with rphase, the values' window only or
    both roles': turboquant 3-bit keys, KIVI 2-bit values) as mx.fast.cuda_kernel wraps it, both role layouts: sm_90,
    no spills."""
    from veloxquant import spec
    kp = spec.Params("turboquant", bits=3, window=32 if win[0] else 0, role="k").resolved()
    vp = spec.Params("kivi", bits=2, group_size=32, window=128, role="v").resolved()
    rse.append_compiles(tmp_path, "append_mixed_ragged", kp, vp, win)
