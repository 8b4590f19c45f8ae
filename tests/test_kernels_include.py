"""accelerated.kernels.backend.cuda_kernel: the CUDA launches' text in included files, templates written into
the short source. What MLX compiles must be the text it compiled before (checked here by expanding the
#include lines of what reaches a recording stand-in for mx.fast.cuda_kernel); that NVRTC compiles it to the
same bits is tests/test_kernels_gpu.py's and the conformance suite's on a GPU."""
from __future__ import annotations

import os
import re

import mlx.core as mx
import pytest

from veloxquant.accelerated.kernels import append, attention_source, backend, commit, source


@pytest.fixture
def recorded(monkeypatch, tmp_path):
    calls = []

    def fake(**kw):
        calls.append(kw)

        def launch(**call):
            calls.append(call)
            return []
        return launch
    monkeypatch.setattr(mx.fast, "cuda_kernel", fake)
    monkeypatch.setenv("VELOXQUANT_KERNEL_DIR", str(tmp_path))
    backend.kernel_dir.cache_clear()
    yield calls
    getattr(backend.kernel_dir, "cache_clear", lambda: None)()    # a test may have replaced it


def _expand(text: str) -> str:
    return re.sub(r'#include "(/[^"]+)"\n', lambda m: open(m.group(1)).read(), text)


# the texts of the kernels the CUDA path launches (one of each kind)
_TEXTS = {
    "append turboquant/kivi": append.assemble("cuda", "turboquant", "kivi"),
    "partial turboquant_prod/rabitq fused": attention_source.assemble("partial", "cuda", 3, 2, True, True),
    "combine": attention_source.assemble("combine", "cuda"),
    "encode": source.assemble("encode", "cuda"),
    "decode": source.assemble("decode", "cuda"),
}


@pytest.mark.parametrize("which", sorted(_TEXTS))
def test_included_text_is_the_text(recorded, which):
    header, text = _TEXTS[which]
    ins = ["x", "kc1", "q"]
    k = backend.cuda_kernel("vq_t", ins, ["out"], text, header)
    tmpl = [("MK", 3), ("FUSED", True), ("OT", mx.float16), ("D", 128)]
    k(inputs=[], output_shapes=[(1,)], output_dtypes=[mx.float32], grid=(1, 1, 1), threadgroup=(1, 1, 1),
      template=tmpl)
    made, call = recorded
    assert "template" not in call, f"{which}: templates must be written into the source, got {call.get('template')}"
    assert len(made["source"]) < 1024 and len(made["header"]) < 1024, \
        f"{which}: launch text {len(made['source'])} + {len(made['header'])} characters, expected an #include"
    # what MLX's build_kernel would have put before the body for these template arguments, then the body
    want = ("  constexpr int MK = 3;\n  constexpr bool FUSED = true;\n  using OT = __half;\n"
            "  constexpr int D = 128;\n")
    body = re.sub(r"  // uses [^\n]*\n", "", made["source"])
    assert _expand(body) == want + text, f"{which}: included source differs from the kernel text"
    assert _expand(made["header"]) == header, f"{which}: included header differs"
    # MLX passes shapes / strides of the inputs whose name + suffix occurs in its source: still the same set
    for n in ins:
        for x in ("_shape", "_strides", "_ndim"):
            assert (f"{n}{x}" in made["source"]) == (f"{n}{x}" in text), f"{which}: {n}{x} mention lost"


def test_one_kernel_object_per_template(recorded):
    k = backend.cuda_kernel("vq_t", ["x"], ["out"], "out[0] = x[0];\n")
    for t in ([("A", 1)], [("A", 2)], [("A", 1)]):
        k(inputs=[], output_shapes=[(1,)], output_dtypes=[mx.float32], grid=(1, 1, 1), threadgroup=(1, 1, 1),
          template=t)
    names = [c["name"] for c in recorded if "name" in c]
    assert len(names) == 2 and len(set(names)) == 2, f"kernel objects made: {names}"


def test_file_name_follows_content(tmp_path, monkeypatch):
    monkeypatch.setenv("VELOXQUANT_KERNEL_DIR", str(tmp_path))
    backend.kernel_dir.cache_clear()
    try:
        a, b, a2 = backend.stash("int a;\n"), backend.stash("int b;\n"), backend.stash("int a;\n")
    finally:
        backend.kernel_dir.cache_clear()
    assert a == a2 != b, (a, b, a2)
    assert open(a).read() == "int a;\n" and os.path.dirname(a) == str(tmp_path)


def test_shape_mention_survives(recorded):
    text = "out[0] = x[x_shape[0] - 1];\n"
    backend.cuda_kernel("vq_t", ["x", "y"], ["out"], text)(
        inputs=[], output_shapes=[(1,)], output_dtypes=[mx.float32], grid=(1, 1, 1), threadgroup=(1, 1, 1))
    src = recorded[0]["source"]
    assert "x_shape" in src and "y_shape" not in src and "#include" in src, src


def test_inline_when_no_folder(recorded, monkeypatch):
    monkeypatch.setattr(backend, "kernel_dir", lambda: None)
    text = "out[0] = 1.0f;\n"
    backend.cuda_kernel("vq_t", [], ["out"], text, "// h\n")(
        inputs=[], output_shapes=[(1,)], output_dtypes=[mx.float32], grid=(1, 1, 1), threadgroup=(1, 1, 1),
        template=[("N", 4)])
    assert recorded[0]["source"] == "  constexpr int N = 4;\n" + text and recorded[0]["header"] == "// h\n"


def test_launch_modules_use_it():
    # every CUDA launch goes through backend.cuda_kernel (a direct mx.fast.cuda_kernel would hash its text
    # at every launch again)
    import inspect
    for mod in (append, commit, backend, attention_source):
        code = inspect.getsource(mod)
        assert "mx.fast.cuda_kernel(name=" not in code.replace("k = mx.fast.cuda_kernel(name=", ""), mod.__name__
    from veloxquant.accelerated.kernels import attention
    assert "mx.fast.cuda_kernel(" not in inspect.getsource(attention)


def test_missing_file_written_again(recorded, tmp_path):
    # a cache folder cleaned while a process runs: the next kernel object made writes the file again
    k = backend.cuda_kernel("vq_t", ["x"], ["out"], "out[0] = x[0];\n")
    call = dict(inputs=[], output_shapes=[(1,)], output_dtypes=[mx.float32], grid=(1, 1, 1),
                threadgroup=(1, 1, 1))
    k(template=[("A", 1)], **call)
    path = re.search(r'#include "([^"]+)"', recorded[0]["source"]).group(1)
    os.remove(path)
    k(template=[("A", 2)], **call)
    assert os.path.exists(path) and open(path).read() == "out[0] = x[0];\n"
    assert oct(os.stat(path).st_mode & 0o777) == "0o644", oct(os.stat(path).st_mode)
