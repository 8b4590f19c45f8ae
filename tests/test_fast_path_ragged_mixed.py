"""The recommended quality configuration (keys turboquant 3-bit, R = 0; values KIVI 2-bit, R = 128, G = 32) in a ragged
batch (tuning's ragged: accelerated/cache/ragged.py; docs/ragged-kivi.md), with tests/test_fast_path.py's stand-in CUDA
backend (recorded launches): which launches its decode steps make."""
from __future__ import annotations

import pytest

from test_fast_path import (PROMPT, STEPS, _assert_batch_steps_fast, _merge_prefilled, _reset, cuda,  # noqa: F401
                            paths)   # (fixtures)

MIXED = dict(key_method="turboquant", key_bits=3, value_method="kivi", value_bits=2)


def _ragged_mixed_batch():
    from veloxquant.accelerated.cache import ragged
    from veloxquant.accelerated.cache.batch_shared import SharedBatchVeloxKVCache
    model, merged = _merge_prefilled(MIXED, (PROMPT, PROMPT - 37))
    assert all(type(c) is SharedBatchVeloxKVCache and c._seq is None and ragged.is_ragged(c.inner) for c in merged), \
        "not one ragged B-row cache per layer"
    return model, merged


def test_a_ragged_mixed_batch_attends_through_the_ragged_mixed_partial(cuda, paths, tune, monkeypatch):  # noqa: F811
    """Prompts 200 and 163 (37 apart: the values' groups of 32 at different phases): every decode step of every
    layer attends through one ragged MIXED partial launch (VQ_RAGGED with HASWIN 3: the keys' records beside the
    values' window, each row at its own boundary) and its combine; never the ops path, nothing decoded (the in-place
    step: test_a_ragged_mixed_batch_takes_one_fast_step_per_layer)."""
    import mlx.core as mx
    from veloxquant.accelerated.cache import ragged
    tune(ragged=True, tc_ragged=False)        # (the scalar loop; the tensor-core one: the knob tests below)
    decoded = []
    real = ragged.RaggedStream.dequantized
    monkeypatch.setattr(ragged.RaggedStream, "dequantized", lambda self: decoded.append(1) or real(self))
    model, merged = _ragged_mixed_batch()
    q = mx.array([[1], [1]])
    _reset(cuda, paths)
    for i in range(STEPS):
        model(q + i, cache=merged)
    layer_steps = len(merged) * STEPS
    partials = [n for n in cuda if n.startswith("vq_attention_partial")]
    assert len(partials) == layer_steps, f"{len(partials)} partial launches for {layer_steps} layer steps"
    # (the first step's append is the append kernel's own launch, the later ones inside the partial: "a")
    assert all(n.split("_")[3] in ("0430rg", "0430arg") for n in partials), sorted(set(partials))
    assert sum(n.startswith("vq_attention_combine") for n in cuda) == layer_steps
    assert not paths["path"] and not paths["decoded"] and not decoded, (paths["path"], paths["decoded"], decoded)


def test_a_ragged_mixed_batch_takes_one_fast_step_per_layer(cuda, paths, tune):  # noqa: F811
    """... and each step of it is one DecodeStep launch pair per layer (cache/ragged_step.py's RaggedMixedInPlace: the
    keys' token in every row and each row's values group flush inside the partial launch's append, APPEND + VQ_RAGGED
    + MIXED), nothing else."""
    tune(ragged=True)
    _assert_batch_steps_fast(*_ragged_mixed_batch(), cuda, paths)


@pytest.mark.parametrize("on", [True, False], ids=["tc", "tc-off"])
def test_the_ragged_mixed_fast_step_takes_the_tensor_core_loop_with_the_knobs(cuda, paths, tune, on):  # noqa: F811
    """With tc_ragged and tc_mixed on, every fast layer step's partial (the append inside) is TC_MIX's ragged kernel
    (name tag 't', 'mx', 'a', 'g'); with tc_ragged off (tc_mixed on) the ragged scalar MIXED partial."""
    tune(ragged=True, tc_mixed=True, tc_ragged=on)
    _assert_batch_steps_fast(*_ragged_mixed_batch(), cuda, paths)
    tags = {n.split("_")[3] for n in cuda if n.startswith("vq_attention_partial")}
    assert len(tags) == 1, tags
    tag = tags.pop()
    if on:
        assert tag.startswith("0430t") and tag.endswith("mxarg"), tag
    else:
        assert tag == "0430arg", tag


def test_a_windowed_ragged_mixed_batch_takes_one_fast_step_per_layer(cuda, paths, tune):  # noqa: F811
    """The mixed pair with one window for both roles (window 32: turboquant keys with R = 32 beside KIVI values with
    R = 32, G = 32; the MIXED partial's HASWIN 4): each step one DecodeStep launch pair per layer
    (RaggedMixedWindowsInPlace: the keys' oldest window token and each row's values group flush inside the partial
    launch's append), its partial the ragged scalar MIXED kernel with both windows and the append inside (tag
    0440arg), nothing else, nothing decoded; with tc_ragged and tc_mixed on, the same on TC_MIX's tensor-core loop
    (tag 't', 'mx', 'a', 'g'), with either knob off the scalar one."""
    from veloxquant.accelerated.cache import ragged
    from veloxquant.accelerated.cache.batch_shared import SharedBatchVeloxKVCache
    for knobs in KNOBS:
        tune(ragged=True, **knobs)
        model, merged = _merge_prefilled({**MIXED, "window": 32}, (PROMPT, PROMPT - 37))
        assert all(type(c) is SharedBatchVeloxKVCache and ragged.is_ragged(c.inner) for c in merged), \
            "not one ragged B-row cache per layer"
        assert all(c.inner._k.params.window == c.inner._v.params.window == 32 for c in merged)
        _assert_batch_steps_fast(model, merged, cuda, paths)
        _assert_tag(cuda, "0440", "arg", knobs)


# tc_ragged and tc_mixed: both on (TC_MIX's loop), either off or none (the scalar loop)
KNOBS = ({}, dict(tc_ragged=True, tc_mixed=True), dict(tc_ragged=False, tc_mixed=True),
         dict(tc_ragged=True, tc_mixed=False))


def _assert_tag(cuda, head: str, tail: str, knobs: dict) -> None:
    """Every partial launch of the recorded steps one kernel: TC_MIX's (head, 't<blocks>mx', tail) with both knobs on
    (as `knobs` set them, else the defaults), else the scalar one (head + tail)."""
    from veloxquant.accelerated import tuning
    tags = {n.split("_")[3] for n in cuda if n.startswith("vq_attention_partial")}
    assert len(tags) == 1, (knobs, tags)
    tag = tags.pop()
    if tuning.current().tc_ragged and tuning.current().tc_mixed:
        assert tag.startswith(head + "t") and tag.endswith("mx" + tail), (knobs, tag)
    else:
        assert tag == head + tail, (knobs, tag)


def test_a_ragged_mixed_batch_without_windows_takes_one_fast_step_per_layer(cuda, paths, tune):  # noqa: F811
    """The mixed pair at window 0 (turboquant keys R = 0 beside KIVI values R = 0, G = 32: the values' window holds
    each row's unflushed group, up to G - 1 tokens): each step one DecodeStep launch pair per layer
    (RaggedMixedInPlace; at a row's flush the group's last value is the chunk's own), its partial the ragged scalar
    MIXED kernel with the append inside in its OWN text (tag 0430arog), nothing else, nothing decoded; with tc_ragged
    and tc_mixed on, the OWN text on TC_MIX's tensor-core loop (tag 't', 'mx', 'a', 'og')."""
    from veloxquant.accelerated.cache import ragged
    for knobs in KNOBS:
        tune(ragged=True, **knobs)
        model, merged = _merge_prefilled({**MIXED, "window": 0}, (PROMPT, PROMPT - 37))
        assert all(ragged.is_ragged(c.inner) and c.inner._v.params.window == c.inner._k.params.window == 0
                   for c in merged), "not one ragged B-row cache per layer with no windows"
        _assert_batch_steps_fast(model, merged, cuda, paths)
        _assert_tag(cuda, "0430", "arog", knobs)


# (method, bits) of the other per-token key methods: rabitq has 1-bit codes only; mlx_affine's coordinate groups of
# the values' G (the cache's one group_size; another size: tests/test_ragged_mixed_step_emulated.py)
KEY_METHODS = [("turboquant_rvq", 3), ("turboquant_prod", 3), ("rabitq", 1), ("mlx_affine", 4)]


@pytest.mark.parametrize("method, bits", KEY_METHODS, ids=[m for m, _ in KEY_METHODS])
def test_a_ragged_mixed_batch_of_any_per_token_keys_takes_one_fast_step_per_layer(cuda, paths, tune,  # noqa: F811
                                                                                  method, bits):
    """The mixed plans (RaggedMixedInPlace, and RaggedMixedWindowsInPlace at window 32; window 0 too) take any
    per-token key method beside KIVI values, not only turboquant's: each step one DecodeStep launch pair per layer, its
    partial the ragged scalar MIXED kernel of that key method (the tag's first digit: MK) with the append inside (at
    window 0 its OWN text), nothing decoded; with tc_ragged and tc_mixed on, still the scalar loop (TC_MIX's loop is
    turboquant keys' only)."""
    from veloxquant.accelerated import layouts
    from veloxquant.accelerated.cache import ragged
    mk = layouts.layout(method).kernel_id
    for window, knobs in ((None, {}), (None, dict(tc_ragged=True, tc_mixed=True)), (32, {}), (0, {})):
        tune(ragged=True, **knobs)
        kw = {**MIXED, "key_method": method, "key_bits": bits, **({} if window is None else {"window": window})}
        model, merged = _merge_prefilled(kw, (PROMPT, PROMPT - 37))
        assert all(ragged.is_ragged(c.inner) and c.inner._k.params.method == method for c in merged), \
            "not one ragged B-row cache per layer"
        _assert_batch_steps_fast(model, merged, cuda, paths)
        tags = {n.split("_")[3] for n in cuda if n.startswith("vq_attention_partial")}
        want = f"{mk}440arg" if window else f"{mk}430arog" if window == 0 else f"{mk}430arg"
        assert tags == {want}, (window, knobs, tags)


# KIVI keys beside per-token values (method, bits); group_size unset: each role its method's default (KIVI G 32,
# mlx_affine 64-coordinate groups; 32: tests/test_ragged_kivi_keys_step_emulated.py)
VALUE_METHODS = [("turboquant", 3), ("turboquant_rvq", 3), ("turboquant_prod", 3), ("rabitq", 1), ("mlx_affine", 4)]


@pytest.mark.parametrize("method, bits", VALUE_METHODS, ids=[m for m, _ in VALUE_METHODS])
def test_a_ragged_batch_of_kivi_keys_beside_per_token_values_takes_one_fast_step_per_layer(cuda, paths, tune,  # noqa
                                                                                           method, bits):
    """KIVI 2-bit keys (G = 32, each row's own phase) beside per-token values (cache/ragged_step.py's
    RaggedKiviKeysInPlace; RaggedKiviKeysWindowsInPlace with the values' window): each step one DecodeStep launch pair
    per layer, its partial the ragged scalar MIXED kernel (VQ_RKEYS) with the append inside, nothing else, nothing
    decoded. Windows: the defaults (keys R = 128, values R = 0: the keys' window only, tag 4{MV}20arg), the same with
    tc_ragged, tc_mixed and tc_mixkv on, window 32 in both roles (HASWIN 4: 4{MV}40arg), window 0 (the OWN text:
    4{MV}20arog), those two with tc_mixkv on: ragged rows of KIVI keys keep the scalar loop, TC_MIXK's pairs too."""
    from veloxquant.accelerated import layouts
    from veloxquant.accelerated.cache import ragged
    mv = layouts.layout(method).kernel_id
    on = dict(tc_ragged=True, tc_mixed=True, tc_mixkv=True)
    for window, knobs in ((None, {}), (None, on), (32, on), (0, on)):
        tune(ragged=True, **knobs)
        kw = dict(key_method="kivi", key_bits=2, value_method=method, value_bits=bits,
                  **({} if window is None else {"window": window}))
        model, merged = _merge_prefilled(kw, (PROMPT, PROMPT - 37))
        wins = (128, 0) if window is None else (window, window)
        assert all(ragged.is_ragged(c.inner) and (c.inner._k.params.window, c.inner._v.params.window) == wins
                   for c in merged), "not one ragged B-row cache per layer with KIVI keys"
        _assert_batch_steps_fast(model, merged, cuda, paths)
        tags = {n.split("_")[3] for n in cuda if n.startswith("vq_attention_partial")}
        want = f"4{mv}40arg" if window else f"4{mv}20arog" if window == 0 else f"4{mv}20arg"
        assert tags == {want}, (window, knobs, tags)
