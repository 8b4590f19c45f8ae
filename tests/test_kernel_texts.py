"""tests/_kernel_texts.py, the comparison of kernel texts before and after a change to their composition: its token
hash sees through macro bindings and comments but not through a changed statement, and it enumerates every kind of
kernel the library assembles."""
from __future__ import annotations

import shutil

import pytest

import _kernel_texts as kt

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: no preprocessor")


def test_tokens_see_through_bindings_not_through_changes():
    plain = kt.tokens("", "  f_v[e] = ADD(f_a[e], f_b);\n")
    bound = kt.tokens("// a comment\n", '#define f_IN f_a\n#define VQ_E e\n  f_v[VQ_E] = ADD(f_IN[VQ_E], f_b);  // x\n')
    assert plain == bound
    assert kt.tokens("", "  f_v[e] = ADD(f_b, f_a[e]);\n") != plain
    assert kt.tokens("", "#define ADD(a, b) ((a) + (b))\n  f_v[e] = ADD(f_a[e], f_b);\n") != plain


def test_every_kind_is_enumerated():
    seen = {(kind, be) for (kind, _, be), (header, source) in kt.texts() if source.strip()}
    kinds = {"encode", "decode", "append", "partial", "combine", "commit"}
    assert seen >= {(k, be) for k in kinds for be in kt.BACKENDS} | {("nsmid", "cuda")}, seen


def test_ragged_texts_are_enumerated():
    """The ragged partials (KIVI both roles, the mixed pairs either way round, OWN's texts) and appends are listed
    too: a change to them shows in a before/after compare."""
    texts = [(kind, v, source) for (kind, v, be), (_, source) in kt._ragged("cuda")]
    variants = [(kind, v) for kind, v, _ in texts]
    appends = [source for kind, _, source in texts if kind == "append"]
    assert appends and all("#define VQ_ROW_ENCODES" in a for a in appends), "ragged appends without the rows' encode gate"
    partials = {v.split(" ", 1)[0] for k, v in variants if k == "partial"}
    assert {"44", "04", "40"} <= partials, sorted(partials)
    from veloxquant.accelerated.kernels import attention_source as src
    assert any(v.endswith(f"ragged={src.OWN}") for _, v in variants), variants[:5]
