"""Manifest hygiene and coverage of golden/ (every method x bits x dtype, head dims, edge-case flags),
plus the spec's own published vectors checked against the golden component files."""
from __future__ import annotations

import numpy as np

import spec
from tools import golden

MAN = golden.load_manifest()
CASES = MAN["case"]


def test_versions():
    assert MAN["spec_version"] == spec.SPEC_VERSION
    assert MAN["generator_version"] == golden.GENERATOR_VERSION


def test_every_case_has_id_comment_flags_and_ids_are_unique():
    ids = []
    for c in CASES:
        assert c["id"] and c["comment"].strip() and c["flags"], c
        assert c["kind"] in ("encode", "stream", "error"), c["id"]
        assert c["method"] in spec.METHODS and c["id"].startswith(c["method"] + "-"), c["id"]
        assert ("error" in c) == (c["kind"] == "error") == ("error" in c["flags"]), c["id"]
        assert ("ops" in c) == (c["kind"] == "stream"), c["id"]
        ids.append(c["id"])
    for name in golden.COMPONENT_FILES:
        for entries in golden.iter_vectors(name).values():
            for e in entries:
                assert e["id"] and e["comment"].strip(), e
                ids.append(e["id"])
    assert len(ids) == len(set(ids))


def test_coverage_methods_bits_dtypes_dims():
    methods = golden.available_methods()
    assert set(methods) >= {"turboquant", "turboquant_rvq", "turboquant_prod", "kivi", "rabitq"}
    ok = [c for c in CASES if c["kind"] != "error"]
    for m in methods:
        info = spec.method_info(m)
        mine = [c for c in ok if c["method"] == m]
        for b in info["bits"]:
            for dt in ("float16", "bfloat16", "float32"):
                dims = {c["shape"][3] for c in mine if c["params"]["bits"] == b and c["dtype"] == dt}
                want = {64, 128} | ({16} if m != "mlx_affine" else {32})
                assert want <= dims and dims & {256, 512, 1024}, (m, b, dt, dims)
        if m == "turboquant_rvq":
            combos = {(c["params"]["bits"], c["params"]["bits2"]) for c in mine}
            assert combos == {(b, b2) for b in info["bits"] for b2 in info["bits2"]}
        if m == "kivi":
            assert {c["params"]["role"] for c in mine} == {"k", "v"}
            assert {c["params"]["group_size"] for c in mine} == set(info["group_sizes"])
        assert {c["shape"][3] for c in mine} >= set(spec.HEAD_DIMS) - ({16} if m == "mlx_affine" else set())


def test_edge_case_flags_present():
    flags = {f for c in CASES for f in c["flags"]}
    assert flags >= {"tie", "zero-vector", "subnormal", "max-fp16", "bf16-overflow", "chunked", "window",
                     "error", "random", "trim", "negative-zero"}
    per_method = {}
    for c in CASES:
        per_method.setdefault(c["method"], set()).update(c["flags"])
    for m, fl in per_method.items():
        assert {"zero-vector", "subnormal", "chunked", "window", "trim", "error", "random"} <= fl, m


def test_prng_matches_the_spec_text():
    """spec/rotation.md: state 0, first three words."""
    seq = {e["state"]: e["words"] for e in golden.iter_vectors("prng")["sequence"]}
    assert seq["0x0000000000000000"][:3] == ["0xE220A8397B1DCDAF", "0x6E789E6AA1B965F4", "0x06C45D188009454F"]


def test_packing_matches_the_spec_text():
    """spec/packing.md example, b = 3."""
    ex = next(e for e in golden.iter_vectors("packing")["pack"] if e["id"] == "packing-b3-spec-example")
    assert ex["codes"] == [1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3] and ex["words"] == ["0x111F58D1", "0x00000003"]


def test_packing_vectors_unpack_to_their_codes():
    """Independent of the reference: unpack by the spec formula and compare with the stored codes."""
    for e in golden.iter_vectors("packing")["pack"]:
        b, codes = e["bits"], e["codes"]
        k = 32 // b
        words = [int(w, 16) for w in e["words"]]
        assert len(words) == -(-len(codes) // k)
        assert [(words[j // k] >> (b * (j % k))) & ((1 << b) - 1) for j in range(len(codes))] == codes
        used = sum(1 << (b * (j % k) + i) for j in range(len(codes)) if j // k == len(words) - 1 for i in range(b))
        assert words[-1] & ~used == 0, e["id"]   # padding bits are zero


def test_codebook_vectors_are_scaled_tables():
    for e in golden.iter_vectors("codebooks")["table"]:
        book = spec.gaussian(e["bits"]) if e["kind"] == "gaussian" else spec.residual(e["bits"], e["bits2"])
        s = spec.scale(e["d"])
        c = np.array([int(h, 16) for h in e["centroids"]], np.uint32).view(np.float32)
        assert np.array_equal(c, book.centroids * s), e["id"]
