"""accelerated/tuning.py: one frozen object for the launch and cache knobs; `override` nests, restores, checks names
and types, stays in its thread; plans and compiled kernels are keyed by the knobs that shape them."""
from __future__ import annotations

import threading

import pytest

from veloxquant.accelerated import tuning


def test_override_nests_and_restores_even_on_error():
    assert tuning.current() is tuning.DEFAULT
    with tuning.override(fuse_append=False) as outer:
        assert tuning.current() is outer and not outer.fuse_append
        with tuning.override(tc_waves=3):
            assert (tuning.current().fuse_append, tuning.current().tc_waves) == (False, 3)
        assert tuning.current() is outer
        with pytest.raises(RuntimeError), tuning.override(shared=False):
            raise RuntimeError("inside")
        assert tuning.current() is outer
    assert tuning.current() is tuning.DEFAULT


@pytest.mark.parametrize("knobs,match", [(dict(fuse_apend=False), "fuse_apend: not a tuning knob"),
                                         (dict(fuse_append=0), "fuse_append: expected bool"),
                                         (dict(tc_waves=True), "tc_waves: expected int"),
                                         (dict(tc_waves=0), "tc_waves: must be at least 1"),
                                         (dict(prefetch=2), "prefetch: must be 0 or 1")])
def test_bad_knobs_name_the_knob_and_change_nothing(knobs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        with tuning.override(**knobs):
            pass
    assert tuning.current() is tuning.DEFAULT


def test_tuning_is_frozen():
    with pytest.raises(AttributeError):
        tuning.DEFAULT.fuse_append = False


def test_an_override_stays_in_its_thread():
    seen = []
    with tuning.override(split_rows=False):
        t = threading.Thread(target=lambda: seen.append(tuning.current().split_rows))
        t.start()
        t.join()
        assert tuning.current().split_rows is False
    assert seen == [True]


def test_parse_takes_arm_text_and_json():
    assert tuning.parse({"FUSE_APPEND": "0", "tc_waves": " 2", "COLD_LOOPS": 1}) == dict(
        fuse_append=False, tc_waves=2, cold_loops=True)
    for bad, match in (({"NOPE": "1"}, "NOPE: not a tuning knob"), ({"FUSE_APPEND": "x"}, "fuse_append"),
                       ({"SHARED": "2"}, "shared"), ({"TC_WAVES": "-1"}, "tc_waves")):
        with pytest.raises((TypeError, ValueError), match=match):
            tuning.parse(bad)


def test_compiled_attention_kernels_are_keyed_by_the_knobs_in_their_text(monkeypatch):
    """cold_loops and the launch bounds (partial_threads, tc_min_blocks) change the kernel's text: a kernel made
    under one setting is never handed out under another (no cache_clear between them)."""
    from veloxquant.accelerated.kernels import attention as katt
    from veloxquant.accelerated.kernels import backend
    monkeypatch.setattr(backend, "_gpu_backend", lambda: ("cuda", "recorded"))
    monkeypatch.setattr(backend, "available", lambda: (True, "recorded"))
    monkeypatch.setattr(backend, "cuda_kernel", lambda **kw: kw)
    katt._compiled.cache_clear()
    try:
        made = {}
        for knobs in ({}, dict(cold_loops=True), dict(partial_threads=256), dict(tc_min_blocks=3), {}):
            with tuning.override(**knobs):
                made[tuple(knobs.items())] = katt._kernel("partial", 0, 0, False, True, True)
        base = made[()]
        assert '#define VQ_COLD _Pragma("unroll 1")' in made[(("cold_loops", True),)]["header"]
        assert "VQ_COLD _Pragma" not in base["header"]
        assert "__launch_bounds__(256, 2)" in made[(("partial_threads", 256),)]["header"]
        assert "__launch_bounds__(128, 3)" in made[(("tc_min_blocks", 3),)]["header"]
        assert "__launch_bounds__(128, 2)" in base["header"]
        assert len({m["name"] for m in made.values()}) == 4, [m["name"] for m in made.values()]
    finally:
        katt._compiled.cache_clear()
