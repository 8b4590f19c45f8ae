"""Golden expected values, only from the numpy reference: case definitions run through reference and
reference.stream, the component vectors of the shared building blocks, and the files rendered."""
from __future__ import annotations

import numpy as np

from ...conformance.golden_format import GoldenCase, hexarr as _hexarr, hx as _hx, replay

from . import attention, exact_trim, head_dims, rules, stream_rules, wide
from .cases import (V1_HEAD_DIMS, CaseDef, GenerationError, _edge_cases, _random_cases,
                                           _reference_reload, _window_and_stream_cases, available_methods)
from .ties import verify_tie
from .inputs import InputRng
from .write import render

def _run_reference(cd: CaseDef) -> GoldenCase:
    from ... import reference
    from ...reference import stream as _reference_stream
    case = GoldenCase(cd.id, cd.kind, cd.method, cd.params, cd.dtype, tuple(np.shape(cd.x)), cd.flags,
                      cd.comment, cd.file, x=cd.x, ops=cd.ops, error=cd.error)
    if cd.kind == "error":
        try:
            reference.encode(cd.x.copy(), cd.params, cd.dtype)
        except Exception as e:  # noqa: BLE001 - any type is compared against the expectation
            if not case.expected_error_matches(e):
                raise GenerationError(f"{cd.id}: reference raised {type(e).__name__}({e}); expected "
                                      f"{cd.error.type} naming {cd.error.argument!r}") from e
            return case
        raise GenerationError(f"{cd.id}: reference accepted the input; expected {cd.error.type} naming "
                              f"{cd.error.argument!r}")
    if cd.kind == "decode_error":
        case.record = cd.record
        try:
            reference.decode({k: v.copy() for k, v in cd.record.items()}, cd.params, cd.dtype)
        except Exception as e:  # noqa: BLE001 - any type is compared against the expectation
            if not case.expected_error_matches(e):
                raise GenerationError(f"{cd.id}: reference decode raised {type(e).__name__}({e}); expected "
                                      f"{cd.error.type} naming {cd.error.argument!r}") from e
            return case
        raise GenerationError(f"{cd.id}: reference decode accepted the record; expected {cd.error.type}")
    if cd.kind == "encode":
        case.record = reference.encode(cd.x.copy(), cd.params, cd.dtype)
    else:
        s = reference.stream.Stream(cd.params, cd.dtype)
        s, trimmed = replay(s, cd.x, cd.ops, _reference_reload)
        case.record = s.record()
        case.trimmed = np.array(trimmed, dtype=np.int64)
    case.decoded = reference.decode(case.record, cd.params, cd.dtype)
    return case


def case_defs(methods=None) -> list[CaseDef]:
    """Every method case, in manifest order."""
    out = []
    for m in methods or available_methods():
        out += _edge_cases(m) + _random_cases(m) + _window_and_stream_cases(m)
    for m in methods or available_methods():
        out += rules.case_defs(m) + head_dims.case_defs(m) + exact_trim.case_defs(m)
    for m in methods or available_methods():
        out += wide.case_defs(m)               # B >= 4, H >= 8, in their own files
    for m in methods or available_methods():
        out += stream_rules.case_defs(m)       # cases/<method>-rules12.toml
    ids = [c.id for c in out]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise GenerationError(f"duplicate case ids: {sorted(dup)}")
    return out


def _check_ties(defs: list[CaseDef]) -> None:
    """Each tie case must really put u on the intended value (checked on the reference's own u)."""
    for cd in defs:
        if "tie" in cd.flags and cd.method not in ("kivi", "mlx_affine"):
            table = cd.id.rsplit("-tie-", 1)[1]
            hits = verify_tie(cd.x, cd.dtype, cd.params, table)
            if hits == 0:
                raise GenerationError(f"{cd.id}: no coordinate of u lands on the {table} value")


def generate_cases(methods=None) -> list[GoldenCase]:
    defs = case_defs(methods)
    _check_ties(defs)
    cases = [_run_reference(cd) for cd in defs]
    rules.check_cases(cases)           # each rule case really exercises its rule (else GenerationError)
    exact_trim.check_cases(cases)
    stream_rules.check_cases(cases)
    return cases


# ----------------------------------------------------------------------------------------------------


def component_vectors() -> dict[str, dict]:
    from ...reference import codebooks as rcb, packing as rpk, prng as rpr, rotation as rrot
    M = (1 << 64) - 1
    prng: dict = {"mix64": [], "sequence": [], "stream_key": [], "signs": []}
    for i, z in enumerate([0, 1, 2, M, rpr.GAMMA, 0x0123456789ABCDEF, 1 << 63]):
        prng["mix64"].append({"id": f"prng-mix64-{i:03d}", "comment": "mix64(input)",
                              "input": _hx(z, 16), "output": _hx(rpr.mix64(z), 16)})
    for i, st in enumerate([0, 1, M, 42, 0x9E3779B97F4A7C15]):
        prng["sequence"].append({"id": f"prng-sequence-{i:03d}", "comment": "first 8 words of next() from state",
                                 "state": _hx(st, 16), "words": [_hx(w, 16) for w in rpr.words(st, 8)]})
    keys = [(0, 0, 0, 0, 0), (0, 0, 0, 0, 1), (0, 0, 0, 1, 0), (0, 0, 0, 1, 1), (0, 0, 1, 0, 0), (0, 1, 0, 0, 0),
            (1, 0, 0, 0, 0), (M, (1 << 32) - 1, (1 << 32) - 1, 1, 1), (0x123456789ABCDEF0, 27, 5, 0, 0),
            (2026, 3, 7, 1, 0)]
    for i, (seed, layer, head, role, purpose) in enumerate(keys):
        k = rpr.stream_key(seed, layer, head, role, purpose)
        prng["stream_key"].append({"id": f"prng-stream-key-{i:03d}",
                                   "comment": "stream_key(seed, layer, head, role, purpose) and its first words",
                                   "seed": _hx(seed, 16), "layer": layer, "head": head, "role": role,
                                   "purpose": purpose, "key": _hx(k, 16),
                                   "words": [_hx(w, 16) for w in rpr.words(k, 4)]})
    for i, d in enumerate(V1_HEAD_DIMS):
        seed, layer, head, role, purpose = 2026, 3, d % 7, i % 2, (i // 2) % 2
        sig = rpr.sign_vector(seed, layer, head, role, purpose, d)
        prng["signs"].append({"id": f"prng-signs-d{d}", "comment": "sign vector: '-' where the bit is 1",
                              "seed": _hx(seed, 16), "layer": layer, "head": head, "role": role,
                              "purpose": purpose, "d": d,
                              "signs": "".join("-" if s < 0 else "+" for s in sig)})
    rot: dict = {"hadamard": [], "rht": []}
    for d in (16, 64):
        x = InputRng(f"hadamard-{d}").normalish((d,)).astype(np.float32)
        rot["hadamard"].append({"id": f"rotation-hadamard-d{d}", "comment": "unnormalized H (no signs, no scale)",
                                "d": d, "x": _hexarr(x, "float32"),
                                "h": _hexarr(rrot.hadamard(x), "float32")})
    for i, d in enumerate(V1_HEAD_DIMS):
        seed, layer, head, role, purpose = 7, 1, d % 5, 0, i % 2
        sig = rpr.sign_vector(seed, layer, head, role, purpose, d)
        x = InputRng(f"rht-{d}").normalish((d,)).astype(np.float32)
        y = rrot.rht(x, sig)
        rot["rht"].append({"id": f"rotation-rht-d{d}", "comment": "y = RHT(x); x_back = RHT_inverse(y) (not exactly x)",
                           "seed": _hx(seed, 16), "layer": layer, "head": head, "role": role, "purpose": purpose,
                           "d": d, "x": _hexarr(x, "float32"), "y": _hexarr(y, "float32"),
                           "x_back": _hexarr(rrot.rht_inverse(y, sig), "float32")})
    pack: dict = {"pack": []}
    ex = np.array([1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3], dtype=np.uint32)
    pack["pack"].append({"id": "packing-b3-spec-example", "comment": "spec/packing.md example", "bits": 3,
                         "codes": [int(c) for c in ex], "words": _hexarr(rpk.pack(ex, 3), "uint32")})
    for b in range(1, 9):
        for n in (1, 11, 16, 64):
            rng = InputRng(f"pack-{b}-{n}")
            c = rng.ints(n, 0, (1 << b) - 1).astype(np.uint32)
            c[0] = (1 << b) - 1          # the largest code in the first slot
            w = rpk.pack(c, b)
            pack["pack"].append({"id": f"packing-b{b}-n{n}", "comment": f"{n} random codes at {b} bits",
                                 "bits": b, "codes": [int(v) for v in c], "words": _hexarr(w, "uint32")})
    cb: dict = {"table": []}
    for d in V1_HEAD_DIMS:
        for b in (1, 2, 3, 4):
            c, bb = rcb.gaussian(b, d)
            cb["table"].append({"id": f"codebooks-gaussian{b}-d{d}", "comment": "C_d, B_d = table x s_d",
                                "kind": "gaussian", "bits": b, "d": d,
                                "centroids": _hexarr(c, "float32"), "boundaries": _hexarr(bb, "float32")})
        for b in (1, 2, 3, 4):
            for b2 in (1, 2, 3, 4):
                c, bb = rcb.residual(b, b2, d)
                cb["table"].append({"id": f"codebooks-residual{b}.{b2}-d{d}", "comment": "C_d, B_d = table x s_d",
                                    "kind": "residual", "bits": b, "bits2": b2, "d": d,
                                    "centroids": _hexarr(c, "float32"), "boundaries": _hexarr(bb, "float32")})
    return {"prng": prng, "rotation": rot, "packing": pack, "codebooks": cb,
            "headdims": head_dims.component_vectors(), "cast": stream_rules.cast_vectors()}


def build(methods=None) -> tuple[list[GoldenCase], dict, dict[str, bytes]]:
    cases = generate_cases(methods)
    comps = component_vectors()
    attention_cases = attention.generate(methods or available_methods())   # spec 1.2, bulk/attention.npz
    return cases, comps, render(cases, comps, attention_cases)


