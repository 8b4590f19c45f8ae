"""The rule index (spec/rules.toml, conformance/rules.py): every `[R-…]` id in spec/ is listed and every listed
id is in spec/; every rule is pinned by a golden case or a conformance test that exists (or says why it is
unpinnable); no selector selects nothing and no golden case names an unknown rule."""
from __future__ import annotations

import copy
import dataclasses
import shutil

from veloxquant.conformance import golden_format as golden, rules


def test_rule_index_is_complete():
    assert rules.problems() == []


def test_every_chapter_carries_rules():
    chapters = {c for cs in rules.spec_ids().values() for c in cs}
    assert {"number-model.md", "rotation.md", "packing.md", "codebooks.md", "streaming.md", "attention.md",
            "methods/kivi.md", "methods/mlx_affine.md", "methods/turboquant.md", "methods/turboquant_rvq.md",
            "methods/turboquant_prod.md", "methods/rabitq.md"} <= chapters


def test_fails_on_an_unpinned_rule():
    rs = copy.deepcopy(rules.load())
    r = next(r for r in rs if r["id"] == "R-affine-rint-exact")
    r["golden"], r["tests"] = [], []
    assert rules.problems(rs) == ["R-affine-rint-exact: pinned by no golden case and no test (and not marked "
                                  "unpinnable)"]


def test_fails_on_a_selector_that_pins_nothing_and_a_missing_test():
    rs = copy.deepcopy(rules.load())
    r = next(r for r in rs if r["id"] == "R-stream-trim")
    r["golden"].append("flag:no-such-flag")
    r["tests"].append("test_golden.py::test_no_such_test")
    assert rules.problems(rs) == ["R-stream-trim: selector 'flag:no-such-flag' selects no golden case",
                                  "R-stream-trim: test 'test_golden.py::test_no_such_test' does not exist"]


def test_fails_on_a_case_naming_an_unknown_rule():
    cases = list(golden.iter_cases())
    i = next(i for i, c in enumerate(cases) if "R-stream-trim" in c.flags)
    cases[i] = dataclasses.replace(cases[i], flags=cases[i].flags + ("R-no-such-rule",))
    assert rules.problems(cases=cases) == [f"{cases[i].id}: flag 'R-no-such-rule' names an unknown rule"]


def test_fails_on_an_id_only_in_the_text_or_only_in_the_index(tmp_path):
    spec_copy = tmp_path / "spec"
    shutil.copytree(rules.SPEC_DIR, spec_copy)
    p = spec_copy / "streaming.md"
    p.write_text(p.read_text().replace("## Save and load `[R-stream-save-load]`", "## Save and load `[R-new]`"))
    got = rules.problems(spec_dir=spec_copy)
    assert got == ["R-new: in spec/streaming.md but not in rules.toml",
                   "R-stream-save-load: in rules.toml but no spec chapter carries it"]


def test_verdicts():
    rs = [{"id": "R-a", "chapter": "x", "section": "y"}, {"id": "R-b", "chapter": "x", "section": "y"},
          {"id": "R-c", "chapter": "x", "section": "y", "unpinnable": "why"}]
    v = rules.verdicts(rs, {"t1": "passed", "t2": "failed", "t3": "skipped"},
                       {"t1": ["R-a", "R-b"], "t2": ["R-b"], "t3": ["R-c"]})
    assert [v[k]["status"] for k in ("R-a", "R-b", "R-c")] == ["passed", "failed", "not exercised"]
