"""`veloxquant distortion` (tools/quality/distortion.py, its measurements in distortion_measure.py): the numbers
of one small configuration are reproducible and sit where the papers put them; a broken codebook is caught."""
from __future__ import annotations

import argparse
import json
import math

import pytest

pytest.importorskip("mlx.core")

from veloxquant.tools.quality import distortion as qd  # noqa: E402
from veloxquant.tools.quality import distortion_measure as dm  # noqa: E402
from veloxquant.tools.quality import distortion_doc as doc  # noqa: E402
from veloxquant.tools.quality.papers import SQRT3_PI_2, TQ_PAPER_DMSE  # noqa: E402

GRID = [("turboquant", b, None) for b in (1, 2, 3, 4)] + [("turboquant_prod", 3, None), ("rabitq", 1, None)]


def small(grid=GRID):
    return dm.synthetic_rows(64, 256, 8, 0, grid, lambda r: None)


def paper_failures(rows) -> list[str]:
    """What the papers state, checked on sphere rows; [] when all hold."""
    out = []
    for r in rows:
        b = r["bits"]
        if r["method"] == "turboquant":
            if not 4.0**-b <= r["d_mse"] <= SQRT3_PI_2 * 4.0**-b:
                out.append(f"{r['label']}: D_mse {r['d_mse']:.4f} outside Theorem 1's bounds")
            if abs(r["d_mse"] - TQ_PAPER_DMSE[b]) > 0.005 + 0.1 * TQ_PAPER_DMSE[b]:
                out.append(f"{r['label']}: D_mse {r['d_mse']:.4f} vs the paper's {TQ_PAPER_DMSE[b]}")
            # an MSE quantizer shrinks inner products by about its D_mse (2/pi at b = 1)
            if abs(r["ip_rel_bias"] + r["d_mse"]) > 0.02:
                out.append(f"{r['label']}: inner-product bias {r['ip_rel_bias']:+.4f}, expected ~ -D_mse")
        if r["method"] in ("turboquant_prod", "rabitq"):
            if abs(r["ip_rel_bias"]) > 0.01 + 3 * r["ip_rel_bias_se"]:
                out.append(f"{r['label']}: biased inner products ({r['ip_rel_bias']:+.4f})")
        if r["method"] == "turboquant_prod" and r["ip_d_var"] > r["ip_d_var_upper"]:
            out.append(f"{r['label']}: d*Var {r['ip_d_var']:.4f} above Theorem 2's bound")
        if r["method"] == "rabitq" and abs(r["ip_d_var"] / r["ip_d_var_expected"] - 1) > 0.15:
            out.append(f"{r['label']}: d*Var {r['ip_d_var']:.4f} vs the bound's scale {r['ip_d_var_expected']:.4f}")
    return out


def test_small_config_reproducible_and_within_the_papers():
    a, b = small(), small()
    keys = ("d_mse", "ip_rel_bias", "ip_d_var", "bits_per_coord")
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]
    assert paper_failures(a) == []
    # stored bits: codes plus the float32 norm (spec/methods/turboquant.md), b = 3 packs 10 codes a word
    assert [r["bits_per_coord"] for r in a[:4]] == [1.5, 2.5, 4.0, 4.5]


def test_broken_codebook_is_caught(monkeypatch):
    from veloxquant.accelerated.ops import codebooks

    real = codebooks.gaussian

    def stretched(bits, d):        # centroids 30 % too far out: still a quantizer, no longer Lloyd-Max
        c, bd = real(bits, d)
        return c * 1.3, bd

    monkeypatch.setattr(codebooks, "gaussian", stretched)
    fails = paper_failures(small([("turboquant", b, None) for b in (1, 2, 3, 4)]))
    assert any("vs the paper's" in f for f in fails), fails


def test_prod_bias_check_catches_a_wrong_qjl_constant(monkeypatch):
    from veloxquant.accelerated.ops import numerics

    real = numerics.qjl_scale
    monkeypatch.setattr(numerics, "qjl_scale", lambda d: real(d) * 1.2)   # A_d 20 % too large
    fails = paper_failures(small([("turboquant_prod", 3, None)]))
    assert any("biased" in f for f in fails), fails


def test_paper_figures():
    f = dm.paper_figures("turboquant_prod", 2, 128)
    assert f["ip_d_var_upper"] == pytest.approx(math.sqrt(3) * math.pi**2 / 16)
    assert f["ip_d_var_expected"] == pytest.approx(math.pi / 2 * (1 - 2 / math.pi), rel=1e-4)  # D_1 = 1 - 2/pi
    assert dm.paper_figures("kivi", 2, 128)["ip_unbiased"] is None


def test_cli_writes_json_markdown_and_rejects_bad_dims(tmp_path, capsys):
    p = argparse.ArgumentParser()
    qd.add_arguments(p)
    out = tmp_path / "d.json"
    md = tmp_path / "d.md"
    args = p.parse_args(["--dims", "64", "--tokens", "64", "--heads", "2", "--trained", "--methods", "turboquant",
                         "--quality-json", str(tmp_path / "absent.json"), "--json", str(out), "--markdown", str(md)])
    assert qd.run(args) == 0
    res = json.loads(out.read_text())
    assert {"command", "date", "versions", "machine", "device"} <= set(res)
    assert len(res["rows"]) == 4 and res["recommendation"] == []
    text = md.read_text()
    assert "TurboQuant D_mse beside the paper" in text and "[4/4]" in capsys.readouterr().out
    assert qd.run(p.parse_args(["--dims", "65", "--trained"])) == 2
    assert "--dims" in capsys.readouterr().err


def test_page_marks_an_explanation_the_data_no_longer_supports():
    rows = small([("turboquant", 1, None)])
    ok = doc.checks({"rows": rows})
    assert ok["tq_near_paper"]
    rows[0]["d_mse"] *= 1.5
    assert not doc.checks({"rows": rows})["tq_near_paper"]


def test_committed_recommendation_flags_build_working_caches():
    """Every recommended configuration in docs/distortion.json is one `veloxquant generate` can run."""
    import mlx.core as mx

    from veloxquant.accelerated.cache import make_prompt_cache
    from veloxquant.tools.cli import kv_flags
    from veloxquant.tools.quality import tiny_llama

    rec = json.loads((qd.ROOT / "docs" / "distortion.json").read_text())["recommendation"]
    assert rec, "docs/distortion.json has no recommendation"
    model = tiny_llama(64, layers=1)
    for flags in sorted({x["flags"] for x in rec}):
        p = argparse.ArgumentParser()
        kv_flags.add_arguments(p, model=False)      # the cache flags alone (generate adds --model)
        caches = make_prompt_cache(model, **kv_flags.settings(p.parse_args(flags.split())))
        out = model(mx.array([[1, 2, 3, 4] * 2]), cache=caches)
        assert bool(mx.isfinite(out).all()), flags


def test_quality_recommend_prints_the_committed_table(capsys, tmp_path):
    from veloxquant.tools import cli

    assert cli.main(["quality", "--recommend"]) == 0
    out = capsys.readouterr().out
    rec = json.loads((qd.ROOT / "docs" / "distortion.json").read_text())["recommendation"]
    assert all(x["flags"] in out for x in rec)
    assert qd.print_recommendation(tmp_path / "absent.json") == 2
    assert "--recommend" in capsys.readouterr().err


@pytest.mark.skipif(not (qd.RETRIEVAL_MODEL / "heldout.json").is_file(), reason="the committed retrieval model is "
                    "not in this installation (source checkout only)")
def test_update_adds_the_retrieval_models_rows_and_keeps_the_rest(tmp_path):
    import shutil

    from veloxquant.tools import cli

    src = qd.ROOT / "docs" / "distortion.json"
    js, md = tmp_path / "d.json", tmp_path / "d.md"
    shutil.copy(src, js)
    before = json.loads(js.read_text())
    others = [r for r in before["rows"] if r["data"] != qd.RETRIEVAL_DATA]
    for _ in range(2):    # a second update replaces its rows and its entry, it does not add more
        assert cli.main(["distortion", "--update", str(js), "--markdown", str(md), "--methods", "turboquant"]) == 0
    after = json.loads(js.read_text())
    new = [r for r in after["rows"] if r["data"] == qd.RETRIEVAL_DATA]
    assert [r for r in after["rows"] if r["data"] != qd.RETRIEVAL_DATA] == others
    assert sorted((r["role"], r["label"]) for r in new) == sorted(
        (role, f"turboquant b{b}") for role in "kv" for b in (1, 2, 3, 4))
    assert [u["data"] for u in after["updates"]] == [qd.RETRIEVAL_DATA]
    for r in new:          # real keys and values after the rotation: the sphere's D_mse (the paper's figures)
        sph = next(x for x in after["rows"] if x["data"] == "sphere" and x["d"] == 128 and x["label"] == r["label"])
        assert abs(r["d_mse"] - sph["d_mse"]) < 0.05 * sph["d_mse"], (r["role"], r["label"], r["d_mse"], sph["d_mse"])
    text = md.read_text()
    assert "trained retrieval-4m keys" in text and "Rows of `trained retrieval-4m` (" in text
    assert cli.main(["distortion", "--update", str(tmp_path / "none.json")]) == 2
