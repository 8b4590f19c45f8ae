"""Manifest hygiene and coverage of golden/ (every method x bits x dtype, head dims, edge-case flags),
plus the spec's own published vectors checked against the golden component files."""
from __future__ import annotations

import numpy as np

from veloxquant import spec
from veloxquant.tools import golden

MAN = golden.load_manifest()
CASES = MAN["case"]


def test_versions():
    assert MAN["spec_version"] == spec.SPEC_VERSION
    assert MAN["generator_version"] == golden.GENERATOR_VERSION


def test_every_case_has_id_comment_flags_and_ids_are_unique():
    ids = []
    for c in CASES:
        assert c["id"] and c["comment"].strip() and c["flags"], c
        assert c["kind"] in ("encode", "stream", "error", "decode_error"), c["id"]
        assert c["method"] in spec.METHODS and c["id"].startswith(c["method"] + "-"), c["id"]
        assert ("error" in c) == (c["kind"] in ("error", "decode_error")) == ("error" in c["flags"]), c["id"]
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
    ok = [c for c in CASES if c["kind"] not in ("error", "decode_error")]
    for m in methods:
        info = spec.method_info(m)
        mine = [c for c in ok if c["method"] == m]
        for b in info["bits"]:
            for dt in ("float16", "bfloat16", "float32"):
                dims = {c["shape"][3] for c in mine if c["params"]["bits"] == b and c["dtype"] == dt}
                want = {64, 128} | ({16} if m != "mlx_affine" else {32})
                assert want <= dims and dims & {256, 512, 1024}, (m, b, dt, dims)
        if m == "turboquant_rvq":
            combos = {(c["params"]["bits"], c["params"].get("bits2", c["params"]["bits"])) for c in mine}
            assert combos == {(b, b2) for b in info["bits"] for b2 in info["bits2"]}
        if m == "kivi":
            assert {c["params"]["role"] for c in mine} == {"k", "v"}
            assert {c["params"]["group_size"] for c in mine} == set(info["group_sizes"])
        dims = set(spec.HEAD_DIMS)
        if m == "mlx_affine":   # G in (32, 64, 128) must divide d
            dims = {d for d in dims if d % 32 == 0}
        assert {c["shape"][3] for c in mine} >= dims, (m, dims - {c["shape"][3] for c in mine})


def test_new_head_dims_every_bits_and_dtype():
    """spec 1.1: every method, every bits setting and every dtype at one of d = 80, 96, 192 (mlx_affine:
    96, 160, 192), and every dtype at each of them at the default bits."""
    from veloxquant.tools.golden import head_dims as g11
    ok = [c for c in CASES if c["kind"] not in ("error", "decode_error") and "head-dim" in c["flags"]]
    for m in golden.available_methods():
        info = spec.method_info(m)
        main = set(g11.AFFINE_DIMS if m == "mlx_affine" else g11.MAIN_DIMS)
        mine = [c for c in ok if c["method"] == m]
        for b in info["bits"]:
            for dt in ("float16", "bfloat16", "float32"):
                assert any(c["params"]["bits"] == b and c["dtype"] == dt and c["shape"][3] in main for c in mine), \
                    (m, b, dt)
        for d in main:
            assert {c["dtype"] for c in mine if c["shape"][3] == d and c["params"]["bits"] == info["default_bits"]} \
                == {"float16", "bfloat16", "float32"}, (m, d)
        assert any(c["kind"] == "stream" for c in mine), m


RULE_FLAGS = {  # flag -> methods that must have a case pinning it (issue 9's list of unpinned rules)
    "kivi-trim": ("kivi",),
    "head-index-64": spec.METHODS,
    "short-window": spec.METHODS,
    "reject": spec.METHODS,
    "flush-reject": spec.METHODS,
    "save-load": spec.METHODS,
    "group-divides": ("kivi", "mlx_affine"),
    "bits2-default": ("turboquant_rvq",),
    "precedence": spec.METHODS,
    "stage-b-zero": ("turboquant_prod",),
    # spec 1.2 (issue 30), cases/<method>-rules12.toml
    "trim-state": spec.METHODS,
    "chunk-mismatch": spec.METHODS,
    "trim-edge": spec.METHODS,
    "param-error": spec.METHODS,
    "decode-error": spec.METHODS,
    "affine-rint-large": ("mlx_affine",),
    "affine-all-negative": ("mlx_affine",),
}


def test_rule_cases_present_with_comments():
    for flag, methods in RULE_FLAGS.items():
        for m in methods:
            mine = [c for c in CASES if c["method"] == m and flag in c["flags"]]
            assert mine, (flag, m)
            for c in mine:
                assert c["comment"].startswith("pins "), c["id"]   # which rule it pins
    # the "mlx_affine with G > d"
    assert any(c["method"] == "mlx_affine" and "group-divides" in c["flags"] and
               c["params"]["group_size"] > c["shape"][3] for c in CASES)
    # ops of the new kinds appear, and a bits2-default case leaves bits2 out of its params
    ops = {o["op"] for c in CASES for o in c.get("ops", [])}
    assert ops == set(golden.STREAM_OPS)      # every op of golden_format.replay is used by some case
    assert all("bits2" not in c["params"] for c in CASES if "bits2-default" in c["flags"])


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
    tables = golden.iter_vectors("codebooks")["table"] + golden.iter_vectors("headdims")["table"]
    assert {e["d"] for e in tables} == set(spec.HEAD_DIMS)
    for e in tables:
        book = spec.gaussian(e["bits"]) if e["kind"] == "gaussian" else spec.residual(e["bits"], e["bits2"])
        s = spec.scale(e["d"])
        c = np.array([int(h, 16) for h in e["centroids"]], np.uint32).view(np.float32)
        assert np.array_equal(c, book.centroids * s), e["id"]


def test_signed_zero_hadamard_vectors_match_the_spec_text():
    """rotation.md: stage B starts from +0, so an output whose terms are all -0 is +0 (bits 0x00000000)."""
    vecs = {e["id"]: e for e in golden.iter_vectors("headdims")["hadamard"]}
    for d in (20, 28):
        e = vecs[f"headdims-hadamard-d{d}-signed-zero"]
        h = spec.hadamard_matrix(d)
        x = np.array([int(v, 16) for v in e["x"]], np.uint32).view(np.float32)
        assert np.all(x == 0) and np.array_equal(np.signbit(x), h[0] > 0)   # every term of output 0 is -0
        assert e["h"][0] == "0x00000000"
