"""accelerated/kernels/loader.py: csrc files spliced at their #include lines (quoted, or computed and bound by the
caller), parameters as #define lines, errors that name the argument; every csrc file is used by some kernel."""
from __future__ import annotations

import re

import pytest

from veloxquant.accelerated.kernels import loader


def test_includes_are_spliced_recursively():
    text = loader.text("append_serial.h", {"VQ_ENCODE_ARRAYS": "encode_arrays_scoped.h",
                                           "VQ_CHECK_COUNT": "check_count.h", "VQ_CHECK_ROW": "check_row.h"})
    assert "#include" not in text
    assert loader.text("common.h")[:-1] in text and loader.text("encode_shared.h")[:-1] in text
    assert text.count("constexpr int M = VQ_SCOPE(M);") == 2          # the scope, once per role


def test_computed_includes_are_bound_by_the_caller():
    scalar = loader.text("partial.h", {"VQ_PARTIAL_LOOP": "partial_loop.h", "VQ_COMBINE_ROWS": "combine_rows.h"})
    from veloxquant.accelerated.kernels.attention_source import ONE_STREAM, TC_WORDS
    words = {**TC_WORDS, **ONE_STREAM}
    tc = loader.text("partial.h", {"VQ_PARTIAL_LOOP": "tc_loop.cuh", "VQ_COMBINE_ROWS": "combine_rows_strided.h", **words})
    assert loader.text("partial_loop.h")[:-1] in scalar and loader.text("tc_loop.cuh", words)[:-1] not in scalar
    assert loader.text("tc_loop.cuh", words)[:-1] in tc and "#include" not in tc
    with pytest.raises(ValueError, match="files: partial.h includes VQ_PARTIAL_LOOP"):
        loader.text("partial.h")


def test_bad_names_are_named():
    with pytest.raises(ValueError, match="name: no kernel source 'nope.h'"):
        loader.text("nope.h")
    with pytest.raises(ValueError, match="backend: 'vulkan'"):
        loader.backend_file("commit", "vulkan")


def test_defines():
    assert loader.defines({"VQ_A": 3, "VQ_B": "kx_shape", "VQ_C": ""}) == \
        "#define VQ_A 3\n#define VQ_B kx_shape\n#define VQ_C\n"
    h = loader.hadamard()
    assert len(re.findall(r"^#define VQ_HT?(12|20|28) (0x[0-9a-f]{7}u, )+0x[0-9a-f]{7}u$", h, re.M)) == 6


def test_every_csrc_file_is_included_somewhere():
    """No dead source: each file is a kernel's entry (loaded by name from Python) or included by another file."""
    import pathlib
    root = pathlib.Path(loader.__file__).parent
    py = "".join(p.read_text() for p in root.glob("*.py"))
    names = [p.name for p in loader.CSRC.iterdir()]
    included = set(re.findall(r'^#include "([\w.]+)"', "".join(loader._read(n) for n in names), re.M))
    stems = {n: n.rsplit(".", 1)[0].replace("cuda", "{be}").replace("metal", "{be}") for n in names}
    loaded = {n for n in names if f'"{n}"' in py or f'f"{stems[n]}"' in py}      # by name, or per backend
    assert not [n for n in names if n not in included and n not in loaded]
