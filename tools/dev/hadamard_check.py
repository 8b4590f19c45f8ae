"""Device check of the Hadamard transform (spec/rotation.md) at every head dim, for deciding where
`mx.hadamard_transform` may serve as accelerated.ops' fast path (accelerated/ops/rotation.py
BUILTIN_VERIFIED): `python -m veloxquant.tools.dev.hadamard_check --device gpu --out PATH.json`.

Per head dim, on inputs with mixed exponents, signed zeros, subnormals and (n = 1) the all-(-0)-terms
pattern of stage B: mx.hadamard_transform(v, scale=1.0) on the device, and accelerated.ops' explicit H and
Hᵀ on the device, each against the numpy reference (the oracle). A builtin difference is classified:
only signs of zeros (the stage-B start, rotation.md) or values. Prints one line per d; --out writes JSON.
"""
from __future__ import annotations

import json
import platform
import sys

import numpy as np


def inputs(d: int) -> np.ndarray:
    from ... import spec
    rng = np.random.default_rng(d)
    x = (rng.standard_normal((64, d)) * 2.0 ** rng.integers(-40, 40, (64, d))).astype(np.float32)
    x[0], x[1] = 0.0, -0.0
    x[2] = np.where(rng.random(d) < 0.5, np.float32(0.0), np.float32(-0.0))
    x[3] = (rng.standard_normal(d) * 2.0 ** -140).astype(np.float32)
    m, n = spec.split_head_dim(d)
    if m > 1 and n == 1:
        x[4] = np.where(spec.hadamard_matrix(m)[0] > 0, np.float32(-0.0), np.float32(0.0))
    return x


def compare(got: np.ndarray, want: np.ndarray) -> dict:
    g, w = got.view(np.uint32), want.view(np.uint32)
    bad = g != w
    zero_sign = bad & (got == 0) & (want == 0)
    return {"equal": bool(not bad.any()), "differ": int(bad.sum()), "zero_sign_only": bool(bad.any() and
            (bad == zero_sign).all())}


def run(device: str) -> dict:
    import mlx.core as mx

    from ... import spec
    from ...accelerated.ops import rotation
    from ...reference import rotation as rrot
    dev = mx.gpu if device == "gpu" else mx.cpu
    out = {"mlx": mx.__version__, "device": device, "python": platform.python_version(), "head_dims": {}}
    for d in spec.HEAD_DIMS:
        x = inputs(d)
        want, want_t = rrot.hadamard(x), rrot.hadamard(x, transpose=True)
        with mx.stream(dev):
            try:   # MLX 0.32.4's CUDA hadamard_transform does not compile for some d (seen: d = 20)
                b = np.array(mx.hadamard_transform(mx.array(x), scale=1.0))
                builtin = compare(b, want)
            except RuntimeError as exc:
                builtin = {"equal": False, "differ": -1, "zero_sign_only": False,
                           "error": str(exc).splitlines()[-1][:200]}
            e = np.array(rotation.explicit(mx.array(x)))
            et = np.array(rotation.explicit(mx.array(x), transpose=True))
        r = {"builtin": builtin, "explicit": compare(e, want), "explicit_t": compare(et, want_t)}
        out["head_dims"][str(d)] = r
        m, n = spec.split_head_dim(d)
        state = ("FAILS: " + builtin["error"]) if "error" in builtin else ("equal" if builtin["equal"] else "DIFFERS")
        print(f"d={d:4d} (m={m:2d}, n={n:4d})  builtin H: {state}"
              f" {r['builtin']['differ']:4d}{' (zero signs only)' if r['builtin']['zero_sign_only'] else ''}"
              f"   explicit H: {'equal' if r['explicit']['equal'] else 'DIFFERS'}"
              f"   explicit Hᵀ: {'equal' if r['explicit_t']['equal'] else 'DIFFERS'}", flush=True)
    return out


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m veloxquant.tools.dev.hadamard_check", description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cpu", "gpu"], default="gpu")
    p.add_argument("--out", default=None, help="write the JSON result here")
    a = p.parse_args(argv)
    res = run(a.device)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    explicit_ok = all(v["explicit"]["equal"] and v["explicit_t"]["equal"] for v in res["head_dims"].values())
    return 0 if explicit_ok else 1


if __name__ == "__main__":
    sys.exit(main())
