"""The kernel cache against MLX's real CUDA backend (skipped elsewhere): the module name we compute is the one MLX
looks for, and a fresh process's first launch loads the binary instead of compiling it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from veloxquant.accelerated.kernels import backend

pytestmark = pytest.mark.skipif(backend.backend() != "cuda", reason="needs MLX's CUDA backend (an NVIDIA GPU)")

PROBE = textwrap.dedent("""
    import json, os, sys, time
    import mlx.core as mx
    from veloxquant.accelerated.kernels import backend, kernel_cache
    k = backend.cuda_kernel(name="vq_probe", input_names=["x"], output_names=["y"],
                            source="  unsigned int i = threadIdx.x;\\n  y[i] = x[i * x_strides[0]] * 2.0f;\\n")
    x = mx.arange(64, dtype=mx.float32)[::2]
    mx.eval(x)
    t = time.perf_counter()
    (y,) = k(inputs=[x], output_shapes=[(32,)], output_dtypes=[mx.float32], grid=(32, 1, 1), threadgroup=(32, 1, 1),
             verbose=os.environ.get("PROBE_VERBOSE") == "1")
    mx.eval(y)
    first = time.perf_counter() - t
    c = kernel_cache.CACHE
    print(json.dumps({"first_launch_s": first, "ok": y.tolist() == [4.0 * i for i in range(32)],
                      "compiled": c.compiled, "loaded": c.loaded, "failed": c.failed,
                      "modules": sorted(c.ready)}))
""")


def _probe(env, verbose=False):
    env = dict(env, PROBE_VERBOSE="1" if verbose else "0")
    r = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout, json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture
def env(tmp_path):
    return dict(os.environ, MLX_PTX_CACHE_DIR=str(tmp_path / "ptx"), VELOXQUANT_KERNEL_CACHE=str(tmp_path / "store"),
                VELOXQUANT_KERNEL_DIR=str(tmp_path / "texts"))


def test_first_process_compiles_the_next_loads(env, tmp_path):
    _, first = _probe(env)
    assert first["ok"] and first["compiled"] == 1 and not first["failed"], first
    _, second = _probe(env)
    assert second["ok"] and second["compiled"] == 0 and second["modules"] == first["modules"], second
    # MLX found the module under the name we computed: its file is the one we wrote, and the launch loaded it
    # (an NVRTC compile of even this kernel takes far longer than loading a cubin)
    assert os.path.exists(os.path.join(str(tmp_path / "ptx"), first["modules"][0] + ".ptx"))
    assert second["first_launch_s"] < 0.25, second


def test_module_name_is_mlx_own(env, tmp_path):
    """MLX's printed source (verbose) hashes to the module name we wrote the file under."""
    from veloxquant.accelerated.kernels import kernel_cache
    out, res = _probe(env, verbose=True)
    text = out.split("```\n", 1)[1].rsplit("\n```", 1)[0]
    assert f"{text.split('__global__ void ')[1].split('(')[0]}_{kernel_cache.std_hash(text.encode()):x}" \
        == res["modules"][0]
