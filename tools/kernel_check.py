"""One-shot GPU check of accelerated.kernels (for a short device session): compile every kernel, the bit-exact
tests against accelerated.ops, the kernel benchmark, the conformance suite through --impl mlx_kernels, and
the existing stream tests (Stream now uses kernels by default). Everything is logged; nothing stops at the
first failure. Results go to --out (a folder).

Usage: PYTHONUNBUFFERED=1 python3 -m tools.kernel_check --out DIR [--skip conformance,bench,...]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time
import traceback

import spec


def step(name: str, log: dict):
    print(f"\n===== {name} =====", flush=True)
    log.setdefault("steps", {})[name] = {"t0": time.time()}
    return log["steps"][name]


def _raw(a) -> "np.ndarray":
    import mlx.core as mx
    import numpy as np
    return np.array(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a).view(np.uint8)


def compile_all(out: pathlib.Path) -> dict:
    """First call of every kernel (method x input dtype for encode, method for decode), timed, vs ops."""
    import mlx.core as mx
    import numpy as np
    from accelerated import kernels, ops
    from accelerated.kernels import backend, source
    res = {}
    rng = np.random.default_rng(0)
    x32 = rng.standard_normal((1, 2, 3, 128)).astype(np.float32)
    for method, kw in [("turboquant", dict(bits=4)), ("turboquant_rvq", dict(bits=2, bits2=3)),
                       ("rabitq", {}), ("turboquant_prod", dict(bits=3))]:
        p = spec.Params(method, **kw)
        for dt in ("float32", "float16", "bfloat16"):
            key = f"encode/{method}/{dt}"
            x = mx.array(x32).astype(getattr(mx, dt))
            t0 = time.perf_counter()
            try:
                got = kernels.encode(x, p)
                mx.eval(list(got.values()))
                dt_s = time.perf_counter() - t0
                want = ops.encode(x, p)
                bad = {k: int(np.count_nonzero(_raw(got[k]) != _raw(want[k]))) for k in want}
                res[key] = {"ok": True, "first_call_s": round(dt_s, 3), "differing_bytes": bad}
            except Exception as e:  # noqa: BLE001 - log and go on
                res[key] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:4000]}
                hdr, src = source.assemble("encode", backend._gpu_backend()[0] or "cuda")
                (out / f"src-encode-{method}-{dt}.txt").write_text(hdr + "\n" + src)
                traceback.print_exc()
            print(key, res[key], flush=True)
        key = f"decode/{method}"
        try:
            rec = ops.encode(mx.array(x32), p)
            t0 = time.perf_counter()
            got = kernels.decode(rec, p)
            mx.eval(got)
            dt_s = time.perf_counter() - t0
            want = ops.decode(rec, p)
            xor = np.array(got).view(np.uint32) ^ np.array(want).view(np.uint32)
            res[key] = {"ok": True, "first_call_s": round(dt_s, 3), "differing": int(np.count_nonzero(xor)),
                        "xor_bits": [hex(v) for v in np.unique(xor)[:8]]}
        except Exception as e:  # noqa: BLE001
            res[key] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:4000]}
            hdr, src = source.assemble("decode", backend._gpu_backend()[0] or "cuda")
            (out / f"src-decode-{method}.txt").write_text(hdr + "\n" + src)
            traceback.print_exc()
        print(key, res[key], flush=True)
    return res


def sh(cmd: list[str], timeout: int) -> dict:
    print("$", " ".join(cmd), flush=True)
    t0 = time.time()
    try:
        r = subprocess.run(cmd, timeout=timeout)
        rc = r.returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    return {"rc": rc, "s": round(time.time() - t0, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=pathlib.Path)
    ap.add_argument("--skip", default="")
    a = ap.parse_args(argv)
    out = a.out
    out.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, a.skip.split(",")))
    import mlx.core as mx
    from accelerated import kernels
    log = {"mlx": mx.__version__, "device": str(mx.default_device()), "available": kernels.available()}
    print(log, flush=True)
    py = sys.executable
    if "compile" not in skip:
        s = step("compile", log)
        s["result"] = compile_all(out)
    if "tests" not in skip:
        s = step("tests", log)
        s.update(sh([py, "-m", "pytest", "tests/test_kernels_gpu.py", "tests/test_kernels_source.py", "-q",
                     "-rfE", "--tb=short", "-p", "no:randomly"], 200))
    if "bench" not in skip:
        s = step("bench", log)
        s.update(sh([py, "-m", "tools.bench_kernels", "--json", str(out / "h200-kernels.json"), "--iters", "50"], 200))
    if "conformance" not in skip:
        s = step("conformance", log)
        s.update(sh([py, "-m", "tools.cli", "conformance", "--impl", "mlx_kernels", "--device", "gpu",
                     "--json", str(out / "h200-cuda-mlx_kernels.json")], 240))
    if "stream" not in skip:
        s = step("stream-tests", log)
        s.update(sh([py, "-m", "pytest", "tests/test_accelerated_stream.py", "-q", "-rfE", "--tb=short"], 90))
    (out / "kernel_check.json").write_text(json.dumps(log, indent=1, default=str))
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "result"} for k, v in log["steps"].items()},
                     default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
