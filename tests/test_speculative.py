"""Speculative decoding through VeloxQuant caches (issue 10 item 5; spec/streaming.md "Exact trims").

mlx_lm.generate.speculative_generate_step appends the drafted tokens to the main model's cache and trims the
rejected ones at every step (the draft model's cache likewise). Models: a random 2-layer llama whose weights
are scaled so greedy tokens vary (the unscaled random model repeats one token), and a 1-layer draft that
shares its embedding, first layer and head (so drafts are sometimes accepted and sometimes rejected).

Checked: (1) after the whole run every layer's stored bytes equal a one-shot encode of the keys/values the
cache accepted (what appending only the accepted tokens stores) with exact_trim = the number of draft tokens,
which fails without exact trims (exact_trim=0, the caches' default); (2) the issue's example: a turboquant b4
cache with window 32 and exact_trim 17 generates 17 tokens, trims them, and then holds the record bytes it had
before and continues with the same tokens; (3) `veloxquant generate --draft-model` asks the caches mlx-lm makes
for exact_trim = --num-draft-tokens (tools/cli/kv_flags.py); (4) tokens of speculative
generation equal plain generate_step's through the same cache where the fp16 caches' do, for turboquant with
R = 0 (its default). Not claimed for R > 0: a verify step appends 1 + k tokens at once, and the window is
defined after the append (streaming.md), so the chunk's first queries read up to k of the oldest window
keys through their records where the one-token step reads them exactly; on these random models that moves
logprobs by enough to flip tokens (seen at top-2 margins up to 0.27), while the stored state stays exact.
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map, tree_unflatten
from mlx_lm.generate import generate_step, speculative_generate_step
from mlx_lm.models import cache as mlx_cache

import veloxquant.accelerated.cache as vc
from veloxquant.accelerated.stream import Stream
from veloxquant.tools.quality import VOCAB, tiny_llama

N_TOKENS = 40


@pytest.fixture(scope="module")
def models():
    model = tiny_llama(64, seed=0, layers=2)
    model.update(tree_map(lambda w: w * 3 if w.ndim == 2 else w, model.parameters()))
    mx.eval(model.parameters())
    draft = tiny_llama(64, seed=1, layers=1)
    shared = dict(tree_flatten(model.parameters()))
    draft.update(tree_unflatten([(k, shared[k]) for k, _ in tree_flatten(draft.parameters())]))
    mx.eval(draft.parameters())
    return model, draft


PROMPT = mx.random.randint(0, VOCAB, (40,), key=mx.random.key(4))


def ours(model, **kw):
    return vc.make_prompt_cache(model, **{**dict(method="turboquant", bits=4, window=32, seed=3), **kw})


K_DRAFT = 2       # speculative_generate_step's default num_draft_tokens


def spec_run(models, main_cache, draft_cache, k=K_DRAFT):
    model, draft = models
    out = list(speculative_generate_step(PROMPT, model, draft, num_draft_tokens=k, max_tokens=N_TOKENS,
                                         prompt_cache=None if main_cache is None else main_cache + draft_cache))
    return [t for t, _, _ in out], [d for _, _, d in out]


def plain_run(model, cache):
    out = list(generate_step(PROMPT, model, max_tokens=N_TOKENS, prompt_cache=cache))
    return [t for t, _ in out], [lp for _, lp in out]


def record_spy(caches):
    """Make each cache remember the keys/values it holds: appended chunks minus trimmed tokens."""
    held = []
    for c in caches:
        kv = {"k": None, "v": None}
        held.append(kv)

        def update(keys, values, c=c, kv=kv, real=c.update_and_fetch):
            for r, a in (("k", keys), ("v", values)):
                kv[r] = a if kv[r] is None else mx.concatenate([kv[r], a], axis=2)
            return real(keys, values)

        def trim(n, c=c, kv=kv, real=c.trim):
            n = real(n)
            for r in kv:
                kv[r] = kv[r][:, :, : kv[r].shape[2] - n]
            return n
        c.update_and_fetch, c.trim = update, trim
    return held


def assert_one_shot(caches, held):
    """Each layer's records equal one-shot encodes of exactly the keys/values it holds."""
    for layer, (c, kv) in enumerate(zip(caches, held)):
        for r, stream, params in (("k", c._k, c.key_params), ("v", c._v, c.value_params)):
            one = Stream(params)
            one.append(kv[r])
            got, exp = stream.record(), one.record()
            assert stream.tokens == one.tokens == c.offset
            for f in exp:
                assert np.array_equal(np.array(got[f]).view(np.uint8), np.array(exp[f]).view(np.uint8)), \
                    f"layer {layer} {r}: field {f} differs from the one-shot encode of the held tokens"


@pytest.mark.parametrize("method,kw", [("turboquant", dict(bits=4, window=32)),
                                       ("kivi", dict(bits=4, group_size=32, window=16))])
@pytest.mark.parametrize("exact_trim", [K_DRAFT, 0])
def test_speculative_state_is_one_shot(models, method, kw, exact_trim):
    main = ours(models[0], method=method, exact_trim=exact_trim, **kw)
    draft = ours(models[1], method=method, exact_trim=exact_trim, **kw)
    held, draft_held = record_spy(main), record_spy(draft)
    _, from_draft = spec_run(models, main, draft)
    assert 0 < sum(from_draft) < len(from_draft), "drafts were all accepted or all rejected"
    if exact_trim:
        assert_one_shot(main, held)
        assert_one_shot(draft, draft_held)
    else:       # no kept tokens: the rejected drafts leave flushed records behind (the check above fails)
        with pytest.raises(AssertionError, match="differs from the one-shot"):
            assert_one_shot(main, held)


def test_issue_example_generate_17_trim_17(models):
    """turboquant b4, window 32, exact_trim 17: 17 generated tokens trimmed give back the record before them
    (the kept tokens are a suffix of the ones before: the 17 flushed tokens pushed the prompt's 7 out;
    streaming.md 'What a trim restores'), and the continuation equals the continuation of a cache that never
    saw them."""
    model = models[0]
    a, b = ours(model, exact_trim=17), ours(model, exact_trim=17)
    for c in (a, b):
        model(PROMPT[None, :-1], cache=c)
    before = [dict(c.state[0]) for c in a]
    y = PROMPT[-1:]
    tok = y
    for _ in range(17):      # greedy decode steps, each appending one token
        tok = mx.argmax(model(tok[None], cache=a)[0, -1:], axis=-1)
    assert all(c.offset == PROMPT.size - 1 + 17 for c in a)
    vc_trimmed = mlx_cache.trim_prompt_cache(a, 17)
    assert vc_trimmed == 17
    for c, rec in zip(a, before):
        now = dict(c.state[0])
        kept, kept_before = now.pop("kept", None), rec.pop("kept")
        assert now.keys() == rec.keys()
        assert all(np.array_equal(np.array(now[f]).view(np.uint8), np.array(rec[f]).view(np.uint8)) for f in rec)
        assert kept is None and kept_before.shape[2] == PROMPT.size - 1 - 32
    cont = [t for t, _ in generate_step(y, model, max_tokens=12, prompt_cache=a)]
    fresh = [t for t, _ in generate_step(y, model, max_tokens=12, prompt_cache=b)]
    assert cont == fresh


def test_cli_draft_model_asks_for_exact_trims(models):
    """The caches mlx-lm makes for `veloxquant generate --draft-model D --num-draft-tokens k` (through
    serve.install) have E = k; without --draft-model, E = 0."""
    import argparse
    from veloxquant.accelerated.cache import serve
    from veloxquant.tools.cli import kv_flags
    p = argparse.ArgumentParser()
    kv_flags.add_arguments(p, model=False)
    for passthrough, e in ((["--draft-model", "D", "--num-draft-tokens", "2"], 2), (["--draft-model", "D"], 3),
                           (["--num-draft-tokens", "5"], 0), ([], 0)):
        args = p.parse_args(["--kv-window", "32", "--kv-bits", "4"])
        args.passthrough = passthrough
        assert kv_flags.settings(args)["exact_trim"] == e, passthrough
    args.passthrough = ["--draft-model", "D", "--num-draft-tokens", str(K_DRAFT)]
    made: list = []
    kv_flags.install(kv_flags.settings(args), keep=made)
    try:
        spec_run(models, None, None)     # mlx-lm makes the model's caches, then the draft model's
    finally:
        serve.uninstall()
    assert len(made) == 2
    for caches in made:
        assert all(c.key_params.exact_trim == c.value_params.exact_trim == K_DRAFT for c in caches)


def test_speculative_tokens_match_plain(models):
    """turboquant, R = 0: the same tokens as plain generation wherever the fp16 caches' runs agree."""
    model, draft = models
    fp_plain, _ = plain_run(model, mlx_cache.make_prompt_cache(model))
    fp_spec, _ = spec_run(models, mlx_cache.make_prompt_cache(model), mlx_cache.make_prompt_cache(draft))
    agree = next((i for i, (x, y) in enumerate(zip(fp_plain, fp_spec)) if x != y), N_TOKENS)
    assert agree > N_TOKENS // 2, "the fp16 caches' speculative and plain tokens part too early to compare"
    plain, _ = plain_run(model, ours(model, window=0))
    spec, from_draft = spec_run(models, ours(model, window=0), ours(draft, window=0))
    assert 0 < sum(from_draft) < len(from_draft)
    assert spec[:agree] == plain[:agree]
