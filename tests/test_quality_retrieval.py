"""tools/quality/retrieval.py and its parts (retrieval_sequences.py, retrieval_model.py): the passkey format is
the trainer's, the outlier injection keeps the model's function, and the table tells a cache that retrieves from
one that does not.

The table test needs a model that retrieves on the CPU in seconds: CopyModel is a one-layer attention model
built by hand (an induction head): the key at position j is a random unit vector named by the 8 bytes before
j, the query at p the one named by the 8 bytes ending at p, the value at j the bits of byte j. At the answer
the query names the needle's digits, so the fp16 cache retrieves every passkey; a cache that decodes zeros
cannot.
"""
from __future__ import annotations

import json
import pathlib
import sysconfig
import types
import zlib

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from veloxquant.tools.quality import retrieval as qr  # noqa: E402
from veloxquant.tools.quality import retrieval_doc as qd  # noqa: E402
from veloxquant.tools.quality import retrieval_model as qm  # noqa: E402
from veloxquant.tools.quality import retrieval_sequences as qs  # noqa: E402
from veloxquant.tools.quality import retrieval_data as qrd
from veloxquant.tools.quality import retrieval_train as qrt  # noqa: E402

D, NGRAM, BETA, GAMMA = 128, 8, 40.0, 4.0


def _text(min_bytes: int = 300_000) -> np.ndarray:
    base = pathlib.Path(sysconfig.get_paths()["stdlib"])
    parts, n = [], 0
    for p in sorted(base.glob("*.py")):
        parts.append(p.read_bytes())
        n += len(parts[-1])
        if n >= min_bytes:
            break
    return np.frombuffer(b"\n\n".join(parts), np.uint8)


# ---- the passkey format ----------------------------------------------------------------------------------
@pytest.mark.parametrize("depth", [0.1, 0.5, 0.9])
def test_passkey_sequence_is_the_trainers_format(depth):
    text = _text()
    for seed in range(3):
        s = qs.passkey_sequence(text, 1024, np.random.default_rng(seed), depth)
        assert s["tokens"].size == 1024
        assert qs.check_passkey_format(s["tokens"]) == s["digits"]
        b = bytes(s["tokens"].astype(np.uint8))
        assert b[s["needle_at"] : s["needle_at"] + s["needle_len"]] == qrd.PASSKEY_PREFIX + s["digits"].encode() + b"\n"
        assert abs(s["needle_at"] / 1024 - depth) < 0.3       # the line start after depth (<= 200 bytes on)
        # scored rows: neither the needle line nor the query/answer
        rows = np.flatnonzero(s["score_mask"]) + 1
        assert not np.any((rows >= s["needle_at"]) & (rows < s["needle_at"] + s["needle_len"]))
        assert rows.max() < 1024 - len(qrd.PASSKEY_PREFIX) - qrd.DIGITS
    # the checker accepts the trainer's own sequences, so both share one format
    rng = np.random.default_rng(7)
    for _ in range(5):
        seq, mask = qrd.make_sequence(text, 1024, rng, {"passkey": 1.0})
        assert qs.check_passkey_format(seq) == bytes(seq[mask]).decode()


def test_check_passkey_format_rejects_broken_sequences():
    s = qs.passkey_sequence(_text(), 512, np.random.default_rng(0), 0.5)
    t = s["tokens"].copy()
    t[s["needle_at"] + len(qrd.PASSKEY_PREFIX)] ^= 1          # the needle's first digit changed
    with pytest.raises(ValueError, match="occurs 0 times"):
        qs.check_passkey_format(t)
    with pytest.raises(ValueError, match="digits"):
        qs.check_passkey_format(s["tokens"][:-1])
    with pytest.raises(ValueError, match="depth"):
        qs.passkey_sequence(_text(), 512, np.random.default_rng(0), 1.5)


# ---- outlier injection --------------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [None, 8], ids=["float", "8-bit export"])
def test_inject_outliers_keeps_the_function_and_makes_outlier_key_channels(bits):
    import mlx.nn as nn
    from mlx_lm.models.cache import KVCache

    a, b = qrt.new_model("smoke", 0), qrt.new_model("smoke", 0)
    if bits:        # the committed model's layers (retrieval_train export --bits 8): packed weights, scales, biases
        for m in (a, b):
            nn.quantize(m, group_size=64, bits=bits)
    info = qm.inject_outliers(b, seed=3)
    assert len(info) == len(b.layers) and all(len(x["head_channel_factor"]) == qm.OUTLIER_PAIRS for x in info)
    s = qs.passkey_sequence(_text(), 256, np.random.default_rng(1), 0.5)
    x = mx.array(s["tokens"][None])
    la = a(x, cache=[KVCache() for _ in a.layers])
    lb = b(x, cache=[KVCache() for _ in b.layers])
    assert float(mx.abs(la - lb).max()) < 1e-3 * float(mx.abs(la).max())
    ta, tb = qm.key_table(a, [s]), qm.key_table(b, [s])
    for ra, rb in zip(ta, tb):
        assert rb["k"]["rms_ratio_max"] > 4 * ra["k"]["rms_ratio_max"]
        assert rb["k"]["outlier_channels"] >= 2 * qm.OUTLIER_PAIRS       # both channels of each pair
        assert rb["k"]["token_kurtosis_median"] > 2 * ra["k"]["token_kurtosis_median"]
        # values only move by the rounding of the previous layers
        assert rb["v"]["rms_ratio_max"] == pytest.approx(ra["v"]["rms_ratio_max"], rel=1e-3)


# ---- the table on a model that retrieves --------------------------------------------------------------------
class _Lin:
    def __init__(self):
        self.weight = mx.zeros((1, 1), dtype=mx.float32)


class CopyModel:
    """One attention layer that copies (see the module docstring). It keeps the bytes it has read to name
    keys and queries by their preceding bytes; keys and values go through the cache under test."""

    def __init__(self):
        rng = np.random.default_rng(0)
        self.table = rng.standard_normal((1 << 16, D)).astype(np.float32)
        self.table /= np.linalg.norm(self.table, axis=1, keepdims=True)
        self.bits = np.array([[1.0 if (b >> i) & 1 else -1.0 for i in range(8)] for b in range(256)], np.float32)
        attn = types.SimpleNamespace(q_proj=_Lin(), head_dim=D, n_kv_heads=1, n_heads=1)
        self.layers = [types.SimpleNamespace(self_attn=attn)]
        self.seen = []

    def _vec(self, gram: list[int]) -> np.ndarray:
        return self.table[zlib.crc32(bytes(x % 256 for x in gram) + bytes([len(gram)])) & 0xFFFF]

    def __call__(self, x, cache):
        toks = [int(t) for t in np.array(x[0])]
        c = cache[0]
        if c.offset == 0:
            self.seen = []
        start = len(self.seen)
        self.seen += toks
        h = self.seen
        keys = np.stack([self._vec(h[max(0, j - NGRAM) : j]) for j in range(start, len(h))])
        qs = np.stack([self._vec(h[max(0, p + 1 - NGRAM) : p + 1]) for p in range(start, len(h))]) * BETA
        vals = np.zeros((len(toks), D), np.float32)
        vals[:, :8] = self.bits[toks]
        k, v = c.update_and_fetch(mx.array(keys)[None, None], mx.array(vals)[None, None])
        s = mx.array(qs)[None, None] @ k.swapaxes(-1, -2)                        # (1, 1, L, T)
        T = s.shape[-1]
        causal = mx.arange(T)[None, :] <= (mx.arange(len(toks)) + start)[:, None]
        s = mx.where(causal, s, -1e9)
        out = (mx.softmax(s.astype(mx.float32), axis=-1) @ v.astype(mx.float32))[0, 0, :, :8]
        return (GAMMA * out @ mx.array(self.bits).T)[None]                      # (1, L, 256)


class Raises:
    """A cache that fails on its first use."""

    offset = 0

    def update_and_fetch(self, keys, values):
        raise RuntimeError("deliberately broken")


class ZeroDecode:
    """A broken cache: stores through the real one, decodes zeros."""

    def __init__(self, inner):
        self.inner = inner

    @property
    def offset(self):
        return self.inner.offset

    @property
    def state(self):
        return self.inner.state

    @property
    def nbytes(self):   # what the table's bits/coord reads (the real cache behind the float16 boundary)
        return self.inner.inner.nbytes

    def update_and_fetch(self, keys, values):
        k, v = self.inner.update_and_fetch(keys, values)
        return mx.zeros_like(k), mx.zeros_like(v)


def _run_table(tmp_path, monkeypatch, broken: set[str], budget: float = 600.0) -> dict:
    text = _text()
    corpus = tmp_path / "corpus.npz"
    manifest = {"python": "test", "files": 1, "sha256": "x" * 64, "bytes": {"train": 0, "heldout": int(text.size)},
                "heldout_every": 8}
    np.savez_compressed(corpus, train=text[:10], heldout=text, manifest=json.dumps(manifest))
    model = CopyModel()
    monkeypatch.setattr(qr, "load_model", lambda d, dtype: (model, {"preset": "copy", "parameters": 0, "step": 0,
                                                                    "total": 0, "corpus": manifest}))
    real = qr.make_caches

    def make(m, cfg, seed, native):
        caches = real(m, cfg, seed, native)
        if qr.label(cfg) == "kivi/2/kv" and "raise" in broken:
            return [Raises() for _ in caches]
        return [ZeroDecode(c) for c in caches] if qr.label(cfg) in broken else caches

    monkeypatch.setattr(qr, "make_caches", make)
    out = tmp_path / "r.json"
    rc = qr.main(["run", "--model-dir", str(tmp_path), "--corpus", str(corpus), "--contexts", "256", "512",
                  "--max-sequences", "2", "--tiers", "main", "--chunk", "128", "--budget-seconds", str(budget),
                  "--json", str(out), "--markdown", str(tmp_path / "r.md")])
    assert rc == 0
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("table")
    with pytest.MonkeyPatch.context() as mp:
        res = _run_table(tmp, mp, broken={"turboquant/2/kv", "raise"})
    return res, (tmp / "r.md").read_text()


def test_table_tells_a_broken_cache_from_working_ones(table):
    res, md = table
    rows = {(r["label"], r["context"]): r for r in res["results"]}
    for ctx in (256, 512):
        fp = rows[("fp16", ctx)]
        assert fp["sequences"] == 2 and fp["retrieval"] == 1.0         # the copy model retrieves
        bad = rows[("turboquant/2/kv", ctx)]
        assert bad["retrieval"] == 0.0 and bad["kl_mean"] > 0.1 and bad["kl_answer_mean"] > 1.0
        for lab in ("mlx_q8", "turboquant/4/kv", "kivi/4/kv"):
            assert rows[(lab, ctx)]["retrieval"] == 1.0, lab
            assert rows[(lab, ctx)]["kl_mean"] < bad["kl_mean"]
        assert rows[("mlx_q8", ctx)]["kl_mean"] < 1e-2
    # a cache that raises is reported, and the rest of the run goes on
    assert not any(r["label"] == "kivi/2/kv" for r in res["results"])
    assert len(res["errors"]) == 4 and all("deliberately broken" in e["error"] for e in res["errors"])
    assert "kivi/2/kv at 256 bytes, round 0: `RuntimeError: deliberately broken`" in md
    assert "| turboquant/2/kv |" in md and "0/2" in md and "| fp16 | 16.00 | 2/2 | 2/2 |" in md


def test_render_merges_runs_and_names_each_columns_run(table):
    res, _ = table
    a = dict(res, results=[r for r in res["results"] if r["context"] == 256])
    b = dict(res, results=[r for r in res["results"] if r["context"] == 512],
             run=dict(res["run"], device="Device(gpu, 0)"))
    md = qd.render([a, b], ["a.json", "b.json"])
    assert "Columns from run 256: A, 512: B." in md
    assert "| B | " in md and "Device(gpu, 0)" in md


def _split_rounds(res: dict, rounds: set[int]) -> dict:
    """The run as if it had measured only `rounds` (every cell cut to those sequences)."""
    rows = []
    for r in res["results"]:
        seqs = [s for s in r["per_sequence"] if s["round"] in rounds]
        if seqs:
            rows.append(dict(r, per_sequence=seqs, sequences=len(seqs), hits=sum(s["hit"] for s in seqs)))
    return dict(res, results=rows)


def test_runs_over_disjoint_rounds_pool_and_overlapping_ones_do_not(table):
    res, _ = table
    a, b = _split_rounds(res, {0}), _split_rounds(res, {1})
    b["results"] = [dict(r, nll=r["nll"] + 0.5, kl_p99=r["kl_p99"] * 3) for r in b["results"]]
    rows, src = qd.merge([a, b])
    fp = next(r for r in rows if r["label"] == "fp16" and r["context"] == 256)
    ra = next(r for r in a["results"] if r["label"] == "fp16" and r["context"] == 256)
    rb = next(r for r in b["results"] if r["label"] == "fp16" and r["context"] == 256)
    assert fp["run"] == "A+B" and fp["sequences"] == 2 and fp["hits"] == ra["hits"] + rb["hits"]
    assert fp["nll"] == pytest.approx((ra["nll"] + rb["nll"]) / 2) and fp["ppl"] == pytest.approx(np.exp(fp["nll"]))
    assert fp["kl_p99"] == max(ra["kl_p99"], rb["kl_p99"])
    assert "Columns from run 256: A+B, 512: A+B." in qd.render([a, b], ["a.json", "b.json"])
    # the same model read from another folder still pools
    moved = dict(b, model=dict(b["model"], dir="/elsewhere/retrieval_4m"))
    assert next(r for r in qd.merge([a, moved])[0] if r["label"] == "fp16" and r["context"] == 256)["run"] == "A+B"
    # the same rounds twice, another device or another model: the first run's cell stands alone
    for other in (a, dict(b, run=dict(b["run"], device="Device(gpu, 0)")), dict(b, model=dict(b["model"], step=1))):
        rows, _ = qd.merge([a, other])
        fp = next(r for r in rows if r["label"] == "fp16" and r["context"] == 256)
        assert fp["run"] == "A" and fp["sequences"] == 1
    # how mlx-lm's QuantizedKVCache attends (mx.quantized_matmul or not) keeps only its own cells apart
    ops = dict(b, settings=dict(b["settings"], mlx_q_native=not b["settings"].get("mlx_q_native")))
    rows, _ = qd.merge([a, ops])
    assert next(r for r in rows if r["label"] == "fp16" and r["context"] == 256)["run"] == "A+B"
    q = [r for r in rows if r["method"].startswith("mlx_q")]
    assert q and all(r["run"] == "A" for r in q)       # one sequence each: a tie keeps the first run's
    more = dict(ops, results=[dict(r, per_sequence=r["per_sequence"] * 2, sequences=2 * r["sequences"])
                              for r in ops["results"]])
    q = [r for r in qd.merge([a, more])[0] if r["method"].startswith("mlx_q")]
    assert q and all(r["run"] == "B" and r["sequences"] == 2 for r in q)


def test_exclude_leaves_a_model_variant_out_and_says_why(table, tmp_path):
    res, _ = table
    out = tmp_path / "p.md"
    assert qd.main(["--json", str(_dump(res, tmp_path)), "--markdown", str(out),
                    "--exclude", "plain=weights were broken"]) == 0
    md = out.read_text()
    assert "**Left out: model variant `plain`** — weights were broken" in md and "| fp16 |" not in md
    with pytest.raises(SystemExit):
        qd.main(["--json", str(_dump(res, tmp_path)), "--markdown", str(out), "--exclude", "plain"])


def _dump(res: dict, tmp_path) -> pathlib.Path:
    p = tmp_path / "res.json"
    p.write_text(json.dumps(res))
    return p


def test_budget_skips_rounds_and_says_so(tmp_path, monkeypatch):
    res = _run_table(tmp_path, monkeypatch, broken=set(), budget=0.01)
    # the set-up alone passes this budget: every round is skipped, and the JSON and the page say so
    assert not res["run"]["partial"] and res["results"] == []
    assert sorted((x["context"], x["round"]) for x in res["skipped_rounds"]) == [(256, 0), (256, 1), (512, 0), (512, 1)]
    assert "4 round(s) skipped" in (tmp_path / "r.md").read_text()


def test_budget_estimates_from_measured_rounds_else_scales_shorter_contexts():
    b = qr.Budget()
    assert b.estimate("main", 1024, 10, {}) is None
    assert b.estimate("main", 4096, 10, {1024: 0.5}) == pytest.approx(0.5 * 10 * 4**1.5)
    assert b.estimate("main", 4096, 10, {1024: 0.5, 2048: 1.0}) == pytest.approx(1.0 * 10 * 2**1.5)
    b.seen[("main", 4096)] = 3.0
    assert b.estimate("main", 4096, 10, {1024: 0.5}) == 3.0


def _fake_device(tmp_path, monkeypatch, fake_forward):
    """Everything but the clock and the planner replaced by stand-ins that cost nothing."""
    monkeypatch.setattr(qr, "forward", fake_forward)
    monkeypatch.setattr(qr, "make_caches", lambda m, cfg, seed, native: [qr.label(cfg) + cfg["variant"]])
    monkeypatch.setattr(qr, "key_table", lambda m, seqs: [])
    monkeypatch.setattr(qr, "inject_outliers", lambda m, seed: [])
    import veloxquant.tools.quality.caches as qc

    monkeypatch.setattr(qc, "cache_bits", lambda caches, width, tokens: (16.0, 16.0))
    monkeypatch.setattr(qr, "score", lambda logits, seq, ref: {"nll": np.zeros(2), "hit": True, "answer_nll": 0.0,
                                                               "lp": None, **({} if ref is None else
                                                               {"kl": np.zeros(2), "kl_answer": np.zeros(5)})})
    text = _text(400_000)
    corpus = tmp_path / "corpus.npz"
    manifest = {"python": "test", "files": 1, "sha256": "x" * 64, "bytes": {}, "heldout_every": 8}
    np.savez_compressed(corpus, train=text[:10], heldout=text, manifest=json.dumps(manifest))
    monkeypatch.setattr(qr, "load_model", lambda d, dtype: (CopyModel(), {"corpus": manifest}))


def test_planner_fits_the_budget_on_a_simulated_device(tmp_path, monkeypatch):
    """The budget on a fake clock: each configuration costs what a long-context device might (quadratic in
    the context, a first run of each configuration 2 s more for compiling); the run must end inside its
    budget with every context measured at least once in the main tier."""
    clock = [0.0]
    monkeypatch.setattr(qr.time, "time", lambda: clock[0])
    seen = set()

    def fake_forward(model, caches, tokens, chunk):
        cfg = caches[0]
        clock[0] += 0.1 + 1.2 * (tokens.size / 32768) ** 2 + (2.0 if cfg not in seen else 0.0)
        seen.add(cfg)
        return np.zeros((tokens.size - 1, 256), np.float32)

    _fake_device(tmp_path, monkeypatch, fake_forward)
    out = tmp_path / "p.json"
    assert qr.main(["run", "--model-dir", str(tmp_path), "--corpus", str(tmp_path / "corpus.npz"), "--budget-seconds", "270",
                    "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert clock[0] <= 270
    n = {(r["model"], r["label"], r["context"]): r["sequences"] for r in res["results"]}
    for ctx in (1024, 4096, 16384, 32768):
        assert n[("plain", "fp16", ctx)] >= 1 and n[("plain", "turboquant/4/kv", ctx)] >= 1
    assert n[("plain", "kivi/2/k", 1024)] >= 1 and n[("outliers", "turboquant/4/k", 1024)] >= 1
    assert res["skipped_rounds"]


def test_planner_measures_every_context_once_even_when_the_longest_costs_most_of_the_budget(tmp_path, monkeypatch):
    """Main tier round 0 at 32k estimated above the tier's share but inside the whole budget: it runs."""
    clock = [0.0]
    monkeypatch.setattr(qr.time, "time", lambda: clock[0])

    def fake_forward(model, caches, tokens, chunk):
        clock[0] += 0.05 + 8.0 * (tokens.size / 32768) ** 2
        return np.zeros((tokens.size - 1, 256), np.float32)

    _fake_device(tmp_path, monkeypatch, fake_forward)
    out = tmp_path / "p.json"
    assert qr.main(["run", "--model-dir", str(tmp_path), "--corpus", str(tmp_path / "corpus.npz"),
                    "--budget-seconds", "270", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    n = {(r["model"], r["label"], r["context"]): r["sequences"] for r in res["results"]}
    assert clock[0] <= 270 and n[("plain", "turboquant/4/kv", 32768)] == 1


def test_bad_paths_name_the_argument(tmp_path, capsys):
    assert qr.main(["run", "--model-dir", str(tmp_path), "--contexts", "256"]) == 2
    assert "--model-dir" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        qr.main(["run", "--model-dir", str(tmp_path), "--contexts", "16"])
    assert "--contexts" in capsys.readouterr().err


def test_delta_vs_fp16_compares_the_same_sequences():
    base = {"ppl": float(np.exp(1.5)), "per_sequence": [{"round": 0, "nll": 1.0}, {"round": 1, "nll": 2.0}]}
    x = {"ppl": float(np.exp(1.1)), "nll": 1.1, "per_sequence": [{"round": 0, "nll": 1.1}]}
    assert qd._delta_vs_fp16(x, base) == pytest.approx(100 * (np.exp(0.1) - 1))     # against round 0's 1.0
    both = {"ppl": float(np.exp(1.6)), "nll": 1.6, "per_sequence": [{"round": 0}, {"round": 1}]}
    assert qd._delta_vs_fp16(both, base) == pytest.approx(100 * (np.exp(0.1) - 1))
    old = {"ppl": float(np.exp(1.5)), "per_sequence": [{"round": 0}, {"round": 1}]}      # no per-sequence loss
    assert qd._delta_vs_fp16(x, old) is None


def test_recommendation_picks_the_least_kl_pair_that_fits_each_budget():
    def cell(method, bits, variant, kl, bpc, ctx=1024, hits=1, bits2=None):
        lab = f"{method}/{bits}{'+' + str(bits2) if bits2 else ''}/{variant}"
        return {"model": "plain", "label": lab, "method": method, "bits": bits, "bits2": bits2, "variant": variant,
                "context": ctx, "kl_mean": kl, "role_bits_per_coord": bpc, "hits": hits, "sequences": 2}
    rows = [cell("turboquant", 2, "k", 0.30, 2.25), cell("turboquant", 2, "v", 0.10, 2.25),
            cell("turboquant", 4, "k", 0.05, 4.25), cell("turboquant", 4, "v", 0.01, 4.25),
            cell("kivi", 2, "k", 0.08, 3.39), cell("kivi", 2, "v", 0.20, 3.39),
            cell("mlx_affine", 8, "k", 0.0, 9.0), cell("mlx_affine", 8, "v", 0.0, 9.0),
            cell("turboquant", 4, "k", 0.07, 4.25, ctx=4096, hits=0)]
    rec = {r["budget"]: r for r in qd.recommend(rows, budgets=(2.0, 2.5, 3.0, 4.5))}
    assert rec[2.0]["keys"] is None
    assert (rec[2.5]["keys"], rec[2.5]["values"]) == ("turboquant/2", "turboquant/2")
    assert (rec[3.0]["keys"], rec[3.0]["values"]) == ("kivi/2", "turboquant/2")     # 2.82 bits, KL 0.18
    assert (rec[4.5]["keys"], rec[4.5]["values"]) == ("turboquant/4", "turboquant/4")   # mlx_affine never
    assert rec[4.5]["key_retrieval"] == {1024: (1, 2), 4096: (0, 2)} and rec[3.0]["context"] == 1024
    assert "--kv-key-method kivi --kv-key-bits 2 --kv-value-method turboquant --kv-value-bits 2" in rec[3.0]["flags"]


def test_committed_page_is_rendered_from_the_committed_runs(tmp_path):
    """docs/quality-retrieval.md is what `retrieval_doc --committed` makes of RUNS and SPEED (the same list
    `veloxquant quality --recommend` reads): a run added, dropped or edited without a re-render fails here."""
    page = qd.ROOT / qd.PAGE
    if not page.is_file() or not all(p.is_file() for p in qd.committed_runs()):
        pytest.skip("the committed quality runs live in the source checkout's docs/")
    out = tmp_path / page.name
    assert qd.main(["--committed", "--markdown", str(out)]) == 0
    assert out.read_text() == page.read_text(), \
        f"{qd.PAGE} is stale: re-render it with docs/retrieval/render.sh (retrieval_doc --committed)"
    if out.with_suffix(".png").is_file():      # the figure: the same bytes from the same cells
        assert out.with_suffix(".png").read_bytes() == page.with_suffix(".png").read_bytes(), \
            f"{page.with_suffix('.png').name} is stale: re-render it with docs/retrieval/render.sh"


def test_figure_plots_the_keys_and_values_cells_or_says_why_not(tmp_path):
    """The page's figure: KL against bits from the k / v cells at 1k; without such cells the page says why."""
    pytest.importorskip("matplotlib")
    from veloxquant.tools.quality import retrieval_plot as rp
    rows = [dict(model=mo, method=m, variant=v, context=1024, kl_mean=kl, role_bits_per_coord=b)
            for mo in ("plain", "outliers") for m in ("turboquant", "kivi") for v in ("k", "v")
            for b, kl in ((2.25, 0.2), (4.25, 0.01))]
    path, why = rp.plot(rows, tmp_path / "f.png")
    assert why is None and path.is_file() and path.stat().st_size > 5000
    path, why = rp.plot([dict(r, variant="kv") for r in rows], tmp_path / "g.png")
    assert path is None and "no keys-only or values-only cells at 1024 bytes" in why
