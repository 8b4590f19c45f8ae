"""accelerated/layouts.py against the spec: every layout's fields, code widths, tables, sign streams and grouping
checked against spec/formats.toml and against what the numpy reference (an independent reading of the spec) writes
and draws; malformed spec data is refused naming spec."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from veloxquant import reference, spec
from veloxquant.accelerated import layouts
from veloxquant.reference import codebooks as ref_codebooks
from veloxquant.reference import prng as ref_prng

D = 1024        # code widths 1..7 each have their own word count at this head dim (7 and 8: 4 codes a word at any d)


def _params(method: str):
    """Every allowed (bits, bits2, group_size) of a method, both roles, no window."""
    info = spec.method_info(method)
    for bits, bits2, g, role in itertools.product(info["bits"], info.get("bits2", [None]),
                                                  info.get("group_sizes", [None]), ("k", "v")):
        p = spec.Params(method, bits=bits, bits2=bits2, group_size=g, window=0, role=role)
        if g is not None and role in info.get("group_divides_head_dim", ()) and D % g:
            continue
        yield p.resolved()


def test_words_per_row_tell_widths_apart():
    assert len({spec.words_per_row(D, b) for b in range(1, 8)}) == 7


def test_layouts_follow_formats_toml():
    assert set(layouts.KERNEL_IDS) == set(spec.METHODS)
    assert sorted(layouts.KERNEL_IDS.values()) == list(range(len(spec.METHODS)))
    for m in spec.METHODS:
        info, lay = spec.method_info(m), layouts.layout(m)
        for role in ("k", "v"):
            rows = info["record"] if "record" in info else info[f"record_{role}"]
            assert [(f.name, f.dtype, ",".join(f.shape)) for f in lay.record(role)] == [tuple(r) for r in rows]
        assert lay.per_token == info["per_token"] and lay.grouped == ("group_sizes" in info)
        assert lay.tables == tuple(info["tables"]) and lay.signs == tuple(info["signs"])
        assert layouts.by_kernel_id(lay.kernel_id) is lay
        # per_token is what spec.Params counts: whole groups of G tokens otherwise (streaming.md)
        p = next(_params(m))
        g = p.group_size or 1
        assert lay.per_token == (p.encoded_tokens(g + 1) == g + 1)


@pytest.mark.parametrize("method", spec.METHODS)
def test_layout_matches_reference_records(method, monkeypatch):
    """Code widths, field dtypes, grouped rows, tables and sign streams as the reference encodes them."""
    lay = layouts.layout(method)
    drawn, tables = set(), set()
    sign_vector, gaussian, residual = ref_prng.sign_vector, ref_codebooks.gaussian, ref_codebooks.residual

    def spy_signs(seed, layer, head, role_id, purpose, d):
        drawn.add(purpose)
        return sign_vector(seed, layer, head, role_id, purpose, d)

    def spy_gaussian(bits, d):
        tables.add(("gaussian", bits))
        return gaussian(bits, d)

    def spy_residual(bits, bits2, d):
        tables.add(("residual", bits, bits2))
        return residual(bits, bits2, d)

    monkeypatch.setattr(ref_prng, "sign_vector", spy_signs)
    monkeypatch.setattr(ref_codebooks, "gaussian", spy_gaussian)
    monkeypatch.setattr(ref_codebooks, "residual", spy_residual)
    rng = np.random.default_rng(0)
    for p in _params(method):
        g = p.group_size or 1
        q = 2 * g
        drawn.clear()
        tables.clear()
        rec = reference.encode(rng.standard_normal((1, 1, q, D)).astype(np.float32), p, "float32")
        assert list(rec) == list(lay.field_names)
        bits = lay.code_bits(p)
        for i, f in enumerate(lay.codes):
            assert rec[f.name].dtype == np.uint32 and rec[f.name].shape[-1] == spec.words_per_row(D, bits[i]), \
                (p, f.name, rec[f.name].shape, bits)
        for f in lay.side:
            want = np.float32 if lay.side_dtype == "input" else np.dtype(lay.side_dtype)
            assert rec[f.name].dtype == want, (p, f.name)
        for f in lay.record(p.role):
            if f.name != "window":
                assert rec[f.name].shape[2] == (q // g if f.name in lay.group_rows(p.role) else q), (p, f.name)
        assert lay.groups_tokens(p.role) == bool(lay.group_rows(p.role))
        want_tables = set()
        for kind, b in zip(lay.tables, bits):
            if kind == "gaussian":
                want_tables.add(("gaussian", b))
            elif kind == "residual":
                want_tables.add(("residual", p.bits, p.bits2))
        assert tables == want_tables, (p, tables, lay.tables)
        prng = spec.formats()["prng"]
        purposes = {"rotation": prng["purpose_rotation"], "qjl": prng["purpose_qjl"]}
        assert drawn == {purposes[s] for s in lay.signs}, (p, drawn, lay.signs)
        assert lay.levels(p) == ((1 << p.bits) - 1 if lay.affine else 0)
    assert lay.rotation == ("rotation" in lay.signs) and lay.sketch == ("qjl" in lay.signs)


@pytest.mark.parametrize("change, match", [
    (lambda i: i.update(tables=["gaussian", "sign"]), "tables"),                 # one table too many
    (lambda i: i.update(tables=["codebook"]), "tables"),                         # no such table
    (lambda i: i.update(signs=["qjl"]), "signs"),                                # a sketch without a rotation
    (lambda i: i.update(record=[["codes", "uint32", "B,H,Q,d"], *i["record"][1:]]), "W"),   # codes without W(...)
    (lambda i: i.update(record=i["record"][:-1]), "window"),                     # no window field
])
def test_wrong_spec_entry_is_refused(change, match):
    info = {k: (list(v) if isinstance(v, list) else v) for k, v in spec.method_info("turboquant").items()}
    layouts.build("turboquant", info, 0)
    change(info)
    with pytest.raises(ValueError, match=f"spec: .*{match}"):
        layouts.build("turboquant", info, 0)


def test_kernel_ids_number_the_methods(monkeypatch):
    monkeypatch.setattr(layouts, "KERNEL_IDS", {**layouts.KERNEL_IDS, "kivi": 0})
    layouts._all.cache_clear()
    try:
        with pytest.raises(ValueError, match="KERNEL_IDS"):
            layouts.layout("kivi")
    finally:
        monkeypatch.undo()
        layouts._all.cache_clear()
    with pytest.raises(ValueError, match="method"):
        layouts.layout("nope")
    with pytest.raises(ValueError, match="m: "):
        layouts.by_kernel_id(6)
