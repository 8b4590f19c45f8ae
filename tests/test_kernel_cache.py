"""The on-disk kernel cache (accelerated/kernels/kernel_cache.py) and the warm-up (accelerated/cache/warmup.py),
without a GPU: a stand-in CUDA backend whose launches return zeros and a stand-in compiler that counts.

The main check: after `warmup.warm` for a configuration, a generation whose context crosses 4k, 8k, 16k, 32k and
64k, a continuous batch whose size goes 1 -> 4 -> 8 -> 2, and speculative verify chunks compile nothing
(every launch made sure of its module: backend.CHECK_EVERY_LAUNCH). Shown to catch a compiled-in split count.
"""
from __future__ import annotations

import hashlib
import os
import threading

import mlx.core as mx
import pytest

from veloxquant.accelerated.kernels import attention as katt
from veloxquant.accelerated.kernels import backend, kernel_cache
from veloxquant.accelerated.kernels import commit as kcommit

pytest.importorskip("mlx_lm")


class CountingCompiler:
    """Stands in for NVRTC: a 'binary' derived from the text, and a count of compiles per kernel name."""

    def __init__(self):
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def identity(self) -> str:
        return "stand-in compiler sm_90a"

    def compile(self, text: str, kernel_name: str):
        with self.lock:
            self.calls.append(kernel_name)
        return b"CUBIN" + hashlib.sha256(text.encode()).digest(), f"_Z{len(kernel_name)}{kernel_name}"


@pytest.fixture
def gpu_stand_in(monkeypatch, tmp_path):
    """A "CUDA" backend on the CPU: kernels are made and planned as on the GPU, launches return zeros, each
    launch notes whether MLX would have found its module on disk (misses) or compiled it in-process."""
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path / "mlx-ptx"))
    monkeypatch.setenv("VELOXQUANT_KERNEL_CACHE", str(tmp_path / "store"))
    monkeypatch.setenv("VELOXQUANT_KERNEL_DIR", str(tmp_path / "texts"))
    backend.kernel_dir.cache_clear()
    compiler = CountingCompiler()
    monkeypatch.setattr(kernel_cache, "CACHE", kernel_cache.KernelCache(compiler))
    misses: list[str] = []

    def mlx_kernel(**kw):
        def launch(*, inputs, output_shapes, output_dtypes, **_):
            v = kernel_cache.variant(kw["name"], kw["header"], kw["source"], kw["input_names"], inputs,
                                     kw["output_names"], output_dtypes)
            if not os.path.exists(kernel_cache.mlx_ptx_path(v.module)):
                misses.append(v.module)          # MLX would run NVRTC here, in the middle of a request
            return [mx.zeros(s, dtype=d) for s, d in zip(output_shapes, output_dtypes)]
        return launch

    monkeypatch.setattr(backend, "mlx_kernel", mlx_kernel)
    monkeypatch.setattr(backend, "_gpu_backend", lambda: ("cuda", "stand-in CUDA"))
    from veloxquant.accelerated import kernels as kpkg
    monkeypatch.setattr(backend, "available", lambda: (True, "stand-in CUDA"))
    monkeypatch.setattr(kpkg, "available", lambda: (True, "stand-in CUDA"))
    monkeypatch.setattr(katt, "_mma_available", lambda: True)
    monkeypatch.setattr(katt, "_sm_count", lambda: 132)
    monkeypatch.setattr(backend, "CHECK_EVERY_LAUNCH", True)
    # attention over decoded tokens (a prefill chunk's path) is MLX's own SDPA, no kernel of ours: skipped here, so
    # that contexts of 64k tokens cost seconds on a CPU
    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention", lambda q, k, v, **kw: q)
    for f in (katt._compiled, katt._static, kcommit._kernel):
        f.cache_clear()
    yield compiler, misses
    for f in (katt._compiled, katt._static, kcommit._kernel):
        getattr(f, "cache_clear", lambda: None)()
    backend.kernel_dir.cache_clear()


# ---- MLX's names ----------------------------------------------------------------------------------------------
def test_std_hash_is_libstdcxx():
    """Values printed by std::hash<std::string> (g++ 12, x86-64) for these texts."""
    assert kernel_cache.std_hash(b"") == 0x553E93901E462A6E
    assert kernel_cache.std_hash(b"hello world, a kernel text of odd length!") == 0xA75815E879048705


def test_ptx_path_splits_long_names(monkeypatch, tmp_path):
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path))
    name = "m" * 300
    assert kernel_cache.mlx_ptx_path(name) == os.path.join(str(tmp_path), "m" * 245, "m" * 55 + ".ptx")
    assert kernel_cache.mlx_ptx_path("short") == os.path.join(str(tmp_path), "short.ptx")


def test_text_is_mlx_build_kernel():
    """The text whose hash names the module, as custom_kernel.cpp's build_kernel writes it for these inputs."""
    a16, a32 = mx.zeros((2, 3), mx.float16), mx.zeros((4,), mx.uint32)
    t = kernel_cache.mlx_text("custom_kernel_k", "// h\n", "  y[0] = x_strides[1] + w[0];\n", ["x", "w"], [a16, a32],
                              ["y"], [mx.float32])
    assert t == ('\n#include "mlx/backend/cuda/device/utils.cuh"\n\n#include <cooperative_groups.h>\n\n// h\n'
                 "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n__global__ void custom_kernel_k(\n"
                 "    const __half* x,\n    const __grid_constant__ Strides x_strides,\n    const uint32_t* w,\n"
                 "    float* y) {\n  y[0] = x_strides[1] + w[0];\n\n}\n\n} // namespace mlx::core::cu\n")


# ---- the store ------------------------------------------------------------------------------------------------
def _variant(i=0):
    return kernel_cache.variant(f"vq_t{i}", "", f"  y[0] = {i};\n", ["x"], [mx.zeros((2,), mx.float32)], ["y"],
                                [mx.float32])


def test_compiled_once_per_machine(monkeypatch, tmp_path):
    """A second process (a new KernelCache) finds the store and compiles nothing; with MLX's folder emptied (a
    cleaned /tmp) it restores the module from the store, still without compiling."""
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path / "ptx"))
    monkeypatch.setenv("VELOXQUANT_KERNEL_CACHE", str(tmp_path / "store"))
    comp = CountingCompiler()
    v = _variant()
    kernel_cache.KernelCache(comp).ensure(v)
    ptx = kernel_cache.mlx_ptx_path(v.module)
    assert open(ptx, "rb").read().startswith(b"CUBIN")
    assert open(ptx[:-4] + ".txt").read() == f"mlx::core::cu::{v.kernel_name}\t_Z{len(v.kernel_name)}{v.kernel_name}\n"
    assert comp.calls == [v.kernel_name]
    kernel_cache.KernelCache(comp).ensure(v)
    os.unlink(ptx)
    second = kernel_cache.KernelCache(comp)
    second.ensure(v)
    assert comp.calls == [v.kernel_name] and second.loaded == 1 and os.path.exists(ptx)
    assert kernel_cache.clear()[0] >= 3 and not os.path.exists(ptx) and kernel_cache.usage() == (0, 0)


def test_concurrent_writers_leave_whole_files(monkeypatch, tmp_path):
    """Processes of a server compiling the same variants at once: every file whole, no temporary left over."""
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path / "ptx"))
    monkeypatch.setenv("VELOXQUANT_KERNEL_CACHE", str(tmp_path / "store"))
    variants = [_variant(i) for i in range(6)]
    caches = [kernel_cache.KernelCache(CountingCompiler()) for _ in range(4)]
    threads = [threading.Thread(target=c.ensure_all, args=(variants,), kwargs={"workers": 3}) for c in caches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for v in variants:
        assert open(kernel_cache.mlx_ptx_path(v.module), "rb").read() == \
            b"CUBIN" + hashlib.sha256(v.text.encode()).digest()
    left = [f for _, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".tmp")]
    assert not left and all(not c.failed for c in caches)


def test_a_failed_compile_leaves_it_to_mlx(monkeypatch, tmp_path):
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path / "ptx"))
    monkeypatch.setenv("VELOXQUANT_KERNEL_CACHE", str(tmp_path / "store"))

    class Broken(CountingCompiler):
        def compile(self, text, kernel_name):
            raise kernel_cache.CompileError("no NVRTC here")
    c = kernel_cache.KernelCache(Broken())
    v = _variant()
    c.ensure(v)
    assert v.module in c.failed and not os.path.exists(kernel_cache.mlx_ptx_path(v.module))


# ---- no compile after warm-up -----------------------------------------------------------------------------------
GEOM = dict(layers=2, heads=4, kv_heads=2, head_dim=64)
CONFIG = {"method": "turboquant", "bits": 4}


def _usage(model, contexts=(4100, 8300, 16500, 33000, 65600), config=CONFIG) -> None:
    """What users run after the warm-up: one generation whose context crosses 4k ... 64k (decoding at each, and
    then long enough for the decode step to grow its buffers),
    a server-like batch of 1 -> 4 -> 8 -> 2 sequences, a batch of two decoding past its buffers' growth, speculative
    decoding with 3 and 6 draft tokens."""
    from mlx_lm.generate import BatchGenerator, generate_step, speculative_generate_step

    from veloxquant.accelerated.cache.prompt_cache import make_prompt_cache
    cache = make_prompt_cache(model, **config)
    done = 0
    for ctx in contexts:
        chunk = mx.array([(3 * i) % 251 for i in range(ctx - done)], dtype=mx.uint32)
        for _ in generate_step(chunk, model, prompt_cache=cache, max_tokens=3):
            pass
        done = ctx + 2
    # decode steps past the buffers' growth (stream._Rows.step rows): the decode step grows them itself
    for _ in generate_step(mx.array([7], dtype=mx.uint32), model, prompt_cache=cache, max_tokens=300):
        pass
    gen = BatchGenerator(model, max_tokens=3)
    for size, steps in ((1, 2), (3, 2), (4, 2)):
        gen.insert([[5 + i] * (500 + 97 * i) for i in range(size)], max_tokens=[steps + 2 + i for i in range(size)],
                   caches=[make_prompt_cache(model, **config) for _ in range(size)])
        for _ in range(steps):
            gen.next_generated()
    while gen.next_generated():
        pass
    # two prompts not whole groups apart (KIVI: one ragged B-row cache, tuning's ragged) decoding past the growth of
    # its buffers (cache/ragged_growth.py: the copy launch on the decode step)
    gen.insert([[9] * 530, [9] * 517], max_tokens=[300, 300],
               caches=[make_prompt_cache(model, **config) for _ in range(2)])
    while gen.next_generated():
        pass
    gen.close()
    for k in (3, 6):
        c = make_prompt_cache(model, **config) + make_prompt_cache(model, **config)
        for _ in speculative_generate_step(mx.array(list(range(1, 40)), dtype=mx.uint32), model, model,
                                           num_draft_tokens=k, prompt_cache=c, max_tokens=8):
            pass


def _warm_then_use(compiler, misses, config=CONFIG, **usage):
    from veloxquant.accelerated.cache import warmup
    geom = warmup.Geometry(**GEOM)
    report = warmup.warm(geom, config)
    assert report.variants > 0 and report.compiled == report.variants == len(compiler.calls), report
    assert warmup.is_warm(geom, config) == report.variants
    model = warmup.small_model(geom)
    from veloxquant.accelerated.cache import warm_kernels
    again = warm_kernels(model, **config)        # the Python users' call: warm already, from the manifest
    assert (again.variants, again.compiled) == (report.variants, 0), again
    warm_calls = len(compiler.calls)
    _usage(model, config=config, **usage)
    return compiler.calls[warm_calls:], misses


@pytest.mark.slow
@pytest.mark.parametrize("config", [CONFIG, {**CONFIG, "window": 32}, {"method": "kivi", "bits": 2, "window": 128},
                                    {"key_method": "turboquant", "key_bits": 3, "value_method": "kivi", "value_bits": 2}],
                         ids=["window-0", "window-32", "kivi-window-128", "keys-turboquant3-values-kivi2"])
def test_no_compile_after_warmup(gpu_stand_in, config):
    """(window 32: its batches are one B-row cache too, whose steps attend with the rows' starts and the window; it
    and kivi's default window 128 store chunks on the general path, whose buffers grow with rows in them; kivi's
    keys' per-group fields grow on their own schedule; the mixed pair has a window on the values only, and its
    general-path chunks follow a commit's or a decode step's token wherever a turn puts them: the partial and the
    commit record both token dtypes in the warm-up.)"""
    compiler, misses = gpu_stand_in
    late, missed = _warm_then_use(compiler, misses, config)
    assert late == [], f"compiled after warm-up: {late}"
    assert missed == [], f"launched without a module on disk (MLX compiles mid-request): {missed[:3]}"


@pytest.mark.slow
@pytest.mark.parametrize("config", [{"method": "kivi", "bits": 4, "window": 128},
                                    {"key_method": "turboquant", "key_bits": 3, "value_method": "kivi", "value_bits": 2}],
                         ids=["kivi-window-128", "keys-turboquant3-values-kivi2"])
def test_generation_past_a_buffers_growth_compiles_no_attention_again(gpu_stand_in, config):
    """Without a warm-up (a plain generate_step): once the first tokens are out, a chunk stored later in the
    generation through the general path (a buffer's growth: a commit before the next decode step) compiles no
    attention or append kernel again, at most the store's own (a growth's commit, a KIVI encode): the partial
    compiled for a decode step's token was compiled a second time for a commit's (a multi-second stall of a
    generate round on the GPU), until kernels.methods.order gave the ordering token one dtype."""
    from mlx_lm.generate import generate_step

    from veloxquant.accelerated.cache import warmup
    from veloxquant.accelerated.cache.prompt_cache import make_prompt_cache
    compiler, _ = gpu_stand_in
    model = warmup.small_model(warmup.Geometry(**GEOM))
    cache = make_prompt_cache(model, **config)
    prompt = mx.array([(7 * i) % 251 for i in range(4096)], dtype=mx.uint32)
    for _ in generate_step(prompt, model, prompt_cache=cache, max_tokens=64):
        pass
    first = len(compiler.calls)
    for _ in range(3):              # past the buffers' next growth
        for _ in generate_step(prompt[-1:], model, prompt_cache=cache, max_tokens=64):
            pass
    late = compiler.calls[first:]
    assert not [n for n in late if "attention" in n or "append" in n], late


def test_a_commit_after_either_kind_of_token_is_one_variant(gpu_stand_in):
    """A commit after a decode step's token (bool) and after a commit's (uint32) is one variant (kernels.methods.order
    casts the ordering token to bool): which one a growing buffer's chunk follows depends on where in a turn it
    falls, and a second variant was compiled mid-generation the first time a buffer grew."""
    compiler, misses = gpu_stand_in
    writes = [(mx.zeros((1, 2, 4, 8), mx.uint32), mx.ones((1, 2, 4, 8), mx.uint32))]
    with kernel_cache.CACHE.recording() as rec:
        kcommit.commit(writes, [], after=mx.zeros((2, 1), mx.bool_))
    kernel_cache.CACHE.ensure_all(rec.values())
    warm = len(compiler.calls)
    assert warm == 1, compiler.calls
    kcommit.commit(writes, [], after=mx.zeros((1, 1), mx.uint32))
    kcommit.commit(writes, [], after=mx.zeros((2, 1), mx.bool_))
    assert compiler.calls[warm:] == [] and misses == []


def test_a_partial_after_either_kind_of_token_is_one_variant(gpu_stand_in):
    """The attention partial takes the store's token only to order after it: after a commit (uint32) and after a
    decode step (bool) it is the same kernel, so the first decode step after a buffer grew compiles nothing."""
    from veloxquant.accelerated.kernels import methods as km
    assert km.order(mx.zeros((3, 2), mx.uint32)).dtype == mx.bool_
    assert km.order(None).dtype == mx.bool_
    b = mx.zeros((2, 1), mx.bool_)
    assert km.order(b) is b
    t = mx.array([[0, 5]], dtype=mx.uint32)
    assert km.order(t).tolist() == [[False, True]]      # what a check found stays readable (nonzero: failed)


def test_recorded_first_commit_covers_commits_after_either_token(gpu_stand_in):
    """A write list recorded only as a fresh cache's first store (no previous token) leaves its variant after a
    commit's or a decode step's token warm too: a later turn's chunk may write the same fields after either."""
    compiler, misses = gpu_stand_in
    writes = [(mx.zeros((1, 2, 4, 8), mx.uint32), mx.ones((1, 2, 4, 8), mx.uint32))]
    with kernel_cache.CACHE.recording() as rec:
        kcommit.commit(writes, [])
    kernel_cache.CACHE.ensure_all(rec.values())
    warm = len(compiler.calls)
    assert warm == 2, compiler.calls
    kcommit.commit(writes, [])
    kcommit.commit(writes, [], after=mx.zeros((1, 1), mx.uint32))
    kcommit.commit(writes, [], after=mx.zeros((2, 1), mx.bool_))
    assert compiler.calls[warm:] == [] and misses == []


@pytest.mark.slow
def test_no_compile_check_catches_a_compiled_in_split_count(gpu_stand_in, monkeypatch):
    """The check above has teeth: with the split count compiled into the partial kernel (as a template constant),
    contexts the warm-up did not reach compile new variants."""
    compiler, misses = gpu_stand_in
    real = katt._static.__wrapped__

    def with_splits(*a, **kw):
        st = real(*a, **kw)
        return st._replace(template=st.template + [("NSPLIT", st.splits)])
    monkeypatch.setattr(katt, "_static", with_splits)
    late, _ = _warm_then_use(compiler, misses, contexts=(4100, 8300))
    assert late, "a split count compiled in must make the long contexts compile"
