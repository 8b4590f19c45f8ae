"""One GPU session's check of accelerated.kernels, in the order that keeps a short device budget useful:

1. compile: the first call of every kernel (six methods x three input dtypes for encode, six for decode) at
   each head dim of --dims (128 and spec 1.1's 80, 96, 192 by default: stage B of H and the block fold run
   only at d = m * 2^k with m > 1), each compared with accelerated.ops byte for byte; the source of any
   kernel that fails to compile is kept.
2. in parallel (the host has cores to spare; the GPU work of each job is small): the GPU tests
   (tests/test_kernels_gpu.py, tests/test_accelerated_stream.py; three processes: the power-of-two head
   dims, spec 1.1's head dims, the rest), the conformance suite with
   --impl mlx_kernels (ci profile), one process per method, merged into OUT/h200-cuda-mlx_kernels.json
   (tools/cli/conformance.py merge_reports), and the differential encode/decode tests under the thorough
   profile's fresh randomness, one process per method, capped at --thorough-examples examples per
   (method, bits, dtype) cell (profile "thorough-maxN" in their logs).
3. alone, on a quiet GPU: the kernels benchmark (benchmarks/test_kernels.py: the fused kernels against an fp16 copy
   and mx.quantize, paired) into OUT/h200-kernels.json (pytest-benchmark JSON; tools/bench/render.py renders it).
Everything is logged under --out; nothing stops at the first failure; a summary (rc and seconds per step)
ends the output and kernel_check.json, and the exit status is 1 where any step did not pass (`not_ok`: a job cut by
--parallel-timeout included, since its remaining cells never ran).

Usage: PYTHONUNBUFFERED=1 python3 -m veloxquant.tools.dev.kernel_check --out DIR [--skip compile,parallel,bench]
       [--dims 128,80,96,192] [--thorough-examples 1000] [--parallel-timeout 240]
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time
import traceback

from ... import spec

METHOD_KW = {"turboquant": dict(bits=4), "turboquant_rvq": dict(bits=2, bits2=3), "rabitq": {},
             "turboquant_prod": dict(bits=3), "kivi": dict(bits=3, group_size=32, window=0),
             "mlx_affine": dict(bits=4, group_size=64)}
DIMS = (128, 80, 96, 192)


def method_kw(method: str, d: int) -> dict | None:
    """METHOD_KW at head dim d: mlx_affine with the largest of its group sizes <= 64 that divides d (None
    where none does: d = 80, 112, ...); kivi keys group tokens, so any d."""
    kw = dict(METHOD_KW[method])
    if method == "mlx_affine":
        fits = [g for g in spec.method_info(method)["group_sizes"] if g <= 64 and d % g == 0]
        if not fits:
            return None
        kw["group_size"] = max(fits)
    return kw


def _raw(a):
    import mlx.core as mx
    import numpy as np
    return np.array(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a).view(np.uint8)


def compile_all(out: pathlib.Path, dims=DIMS) -> dict:
    """First call of every kernel (method x input dtype for encode, method for decode) at each head dim of
    `dims`, timed, vs ops (keys: encode/<method>/<dtype>[/d<d>], decode/<method>[/d<d>]; no suffix at 128)."""
    import mlx.core as mx
    import numpy as np
    from ...accelerated import kernels, ops
    from ...accelerated.kernels import methods as km
    from ...accelerated.kernels import source
    res = {}
    for d in dims:
        rng = np.random.default_rng(d)
        x32 = rng.standard_normal((1, 2, 64, d)).astype(np.float32)
        sfx = "" if d == 128 else f"/d{d}"
        for method in METHOD_KW:
            kw = method_kw(method, d)
            if kw is None:
                res[f"encode/{method}{sfx}"] = {"ok": True, "skipped": f"no group size of {method} divides d = {d}"}
                continue
            p = spec.Params(method, **kw)
            for dt in ("float32", "float16", "bfloat16"):
                key = f"encode/{method}/{dt}{sfx}"
                x = mx.array(x32).astype(getattr(mx, dt))
                t0 = time.perf_counter()
                try:
                    km.launch_shape(2 * 64, d)   # kernels.encode falls back to ops where no launch exists
                    got = kernels.encode(x, p)
                    mx.eval(list(got.values()))
                    res[key] = {"ok": True, "first_call_s": round(time.perf_counter() - t0, 3)}
                    want = ops.encode(x, p)
                    res[key]["differing_bytes"] = {k: int(np.count_nonzero(_raw(got[k]) != _raw(want[k])))
                                                   for k in want}
                except Exception as e:  # noqa: BLE001 - log and go on
                    res[key] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:4000]}
                    hdr, src = source.assemble("encode", "cuda")
                    (out / "src-encode.txt").write_text(hdr + "\n" + src)
                    traceback.print_exc()
                print(key, res[key], flush=True)
            key = f"decode/{method}{sfx}"
            try:
                rec = ops.encode(mx.array(x32).astype(mx.bfloat16), p)
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
                hdr, src = source.assemble("decode", "cuda")
                (out / "src-decode.txt").write_text(hdr + "\n" + src)
                traceback.print_exc()
            print(key, res[key], flush=True)
    return res


def start(name: str, cmd: list[str], out: pathlib.Path, env: dict | None = None) -> dict:
    log = out / f"{name}.log"
    print(f"[{name}] $ {' '.join(cmd)}  > {log.name}", flush=True)
    f = open(log, "w")
    p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    return {"name": name, "proc": p, "file": f, "t0": time.time(), "cmd": " ".join(cmd), "env": env or {}}


def finish(jobs: list[dict], timeout: float) -> dict:
    """Wait for every job until `timeout` seconds after the first started; kill the rest (rc 'timeout')."""
    res = {}
    t_end = min(j["t0"] for j in jobs) + timeout
    for j in jobs:
        try:
            rc = j["proc"].wait(timeout=max(1.0, t_end - time.time()))
        except subprocess.TimeoutExpired:
            j["proc"].kill()
            j["proc"].wait()
            rc = "timeout"
        j["file"].close()
        res[j["name"]] = {"rc": rc, "s": round(time.time() - j["t0"], 1), "cmd": j["cmd"], "env": j["env"]}
        print(f"[{j['name']}] rc={rc} after {res[j['name']]['s']} s", flush=True)
    return res


def tail(path: pathlib.Path, n: int = 3) -> list[str]:
    try:
        return [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()][-n:]
    except OSError:
        return []


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=pathlib.Path)
    ap.add_argument("--skip", default="")
    ap.add_argument("--dims", default=",".join(map(str, DIMS)),
                    help="head dims of the compile step (comma-separated)")
    ap.add_argument("--thorough-examples", type=int, default=1000)
    ap.add_argument("--parallel-timeout", type=float, default=240.0)
    a = ap.parse_args(argv)
    out = a.out
    out.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, a.skip.split(",")))
    import mlx.core as mx
    from ...accelerated import kernels
    log = {"mlx": mx.__version__, "device": str(mx.default_device()), "available": kernels.available(),
           "steps": {}}
    print(log, flush=True)
    py = sys.executable
    t0 = time.time()
    if "compile" not in skip:
        print("\n===== compile =====", flush=True)
        s = time.time()
        log["steps"]["compile"] = {"result": compile_all(out, [int(v) for v in a.dims.split(",")])}
        log["steps"]["compile"]["s"] = round(time.time() - s, 1)
    if "parallel" not in skip:
        print("\n===== parallel: GPU tests, conformance (ci), differential (thorough, capped) =====", flush=True)
        # One process per method for the suite too: every process JIT-compiles its own kernels (one per
        # method, head dim and dtype), so splitting by method spreads ~250 compiles over the host's cores.
        pq = [py, "-m", "pytest", "-q", "-rfE", "--tb=short", "-p", "no:randomly"]
        jobs = [start("gpu-tests-dims", pq + ["tests/test_kernels_gpu.py", "-k", "test_head_dims"], out),
                start("gpu-tests-new-dims", pq + ["tests/test_kernels_gpu.py", "-k", "test_new_head_dims"], out),
                start("gpu-tests", pq + ["tests/test_kernels_gpu.py", "-k", "not head_dims",
                                         "tests/test_accelerated_stream.py"], out)]
        for m in spec.METHODS:
            jobs.append(start(f"conformance-{m}", [py, "-m", "veloxquant.tools.cli", "conformance", "--impl", "mlx_kernels",
                                                   "--device", "gpu", "--methods", m, "--json",
                                                   str(out / f"conformance-{m}.json")], out))
        for m in spec.METHODS:
            jobs.append(start(f"thorough-{m}", pq + ["conformance/test_differential.py", "-k", "test_encode_decode",
                                                     "--impl", "mlx_kernels", "--device", "gpu", "--methods", m],
                              out, {"VELOXQUANT_PROFILE": "thorough",
                                    "VELOXQUANT_MAX_EXAMPLES": str(a.thorough_examples)}))
        res = finish(jobs, a.parallel_timeout)
        for name, r in res.items():
            r["tail"] = tail(out / f"{name}.log")
        log["steps"]["parallel"] = res
        parts = [out / f"conformance-{m}.json" for m in spec.METHODS]
        if all(f.exists() for f in parts):
            from ..cli.conformance import merge_reports
            merged = merge_reports([json.loads(f.read_text()) for f in parts], [f.name for f in parts])
            (out / "h200-cuda-mlx_kernels.json").write_text(json.dumps(merged, indent=1, default=str) + "\n")
            log["conformance"] = merged["summary"]
            print(f"conformance (merged): {merged['summary']}", flush=True)
    if "bench" not in skip:
        print("\n===== bench (alone) =====", flush=True)
        s = time.time()
        r = subprocess.run([py, "-m", "pytest", "benchmarks/test_kernels.py", "--device", "gpu", "-q", "-rs",
                            "-p", "no:cacheprovider", "--benchmark-json", str(out / "h200-kernels.json"),
                            "--bench-partial", str(out / "h200-kernels.partial.json")], timeout=300,
                           cwd=pathlib.Path(__file__).resolve().parents[2])
        log["steps"]["bench"] = {"rc": r.returncode, "s": round(time.time() - s, 1)}
    log["total_s"] = round(time.time() - t0, 1)
    (out / "kernel_check.json").write_text(json.dumps(log, indent=1, default=str))
    print("\n===== summary =====", flush=True)
    for name, st in log["steps"].items():
        if name == "parallel":
            for job, r in st.items():
                print(f"{job}: rc={r['rc']} {r['s']} s | " + " / ".join(r["tail"][-2:]), flush=True)
        elif name == "compile":
            bad = _bad_kernels(st)
            print(f"compile: {len(st['result'])} kernels in {st['s']} s, {len(bad)} not ok: {bad}", flush=True)
        else:
            print(f"{name}: {st}", flush=True)
    print(f"total {log['total_s']} s", flush=True)
    bad = not_ok(log)
    print("not ok: " + ", ".join(bad) if bad else "every step ok", flush=True)
    return 1 if bad else 0


def _bad_kernels(step: dict) -> list[str]:
    return [k for k, v in step["result"].items() if not v.get("ok") or any(
        (v.get("differing_bytes") or {}).values()) or v.get("differing")]


def not_ok(log: dict) -> list[str]:
    """The steps of a run that did not pass: a kernel that failed to compile or differed, a job or the benchmark with
    a non-zero exit status or cut by the timeout (its remaining cells never ran), a merged conformance with failures
    or errors. Empty: the run passed (the command's exit status 0)."""
    bad = []
    for name, st in log["steps"].items():
        if name == "compile":
            bad += [f"compile {k}" for k in _bad_kernels(st)]
        elif name == "parallel":
            bad += [f"{job} (rc {r['rc']})" for job, r in st.items() if r["rc"] != 0]
        elif st.get("rc", 0) != 0:
            bad.append(f"{name} (rc {st['rc']})")
    c = log.get("conformance") or {}
    if c.get("failed") or c.get("error"):
        bad.append(f"conformance ({c.get('failed', 0)} failed, {c.get('error', 0)} errors)")
    return bad


if __name__ == "__main__":
    sys.exit(main())
