"""The benchmark tools' shared harness (a leaf: imports no other tools module, so bench, kernels, sweep, decode,
decode_report and plots all stand on it without importing each other in a circle)."""
from __future__ import annotations

import json
import pathlib
import platform
import re
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
POOL = 10                  # distinct inputs per group (policy: >= 10)
B, HQ, HKV, D = 1, 32, 8, 128   # the decode benchmarks' attention shape (Llama-3-8B)
PIPE = 4                   # decode steps per pipelined sample (generate_step builds step n + 1 while n runs)



def use_device(device: str | None, prog: str) -> bool:
    """Make `device` ("cpu", "gpu", or None: MLX's default) the default device of this process; False, after one
    line on stderr naming `prog`, where --device gpu was asked of an MLX build without a GPU."""
    import mlx.core as mx
    if device == "gpu":
        if not mx.is_available(mx.gpu):
            print(f"{prog}: --device gpu, but this MLX build has no GPU", file=sys.stderr)
            return False
        mx.set_default_device(mx.gpu)
    elif device == "cpu":
        mx.set_default_device(mx.cpu)
    return True

def interleaved(arms: dict, warmup: int, iters: int, pool: int = POOL) -> dict[str, list[float]]:
    """Seconds per call of each arm `fn(i)` (i = input index), arms alternating every iteration."""
    import mlx.core as mx

    names = list(arms)
    times = {n: [] for n in names}
    for it in range(warmup + iters):
        k = it % len(names)
        for name in names[k:] + names[:k]:  # rotate the order: no arm always follows the same one
            mx.synchronize()
            t0 = time.perf_counter()
            mx.eval(arms[name](it % pool))
            mx.synchronize()
            if it >= warmup:
                times[name].append(time.perf_counter() - t0)
    return times


def fmt_s(s: float) -> str:
    return f"{s * 1e3:.3f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} µs"


def device_info() -> dict:
    """The default device and, where MLX (or nvidia-smi) says, its name; absent pieces are left out."""
    import mlx.core as mx

    d = mx.default_device()
    info = {"default_device": str(d), "type": "gpu" if d.type == mx.gpu else "cpu"}
    backends = [name for name in ("metal", "cuda")
                if getattr(getattr(mx, name, None), "is_available", lambda: False)()]
    info["backend"] = backends[0] if backends and info["type"] == "gpu" else "cpu"
    for get in (getattr(mx, "device_info", None), getattr(getattr(mx, "metal", None), "device_info", None)):
        try:
            info["info"] = {k: (v if isinstance(v, (int, float, str)) else str(v)) for k, v in get().items()}
            break
        except Exception:  # missing function or backend without device info
            continue
    if info["backend"] == "cuda":
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20, check=True).stdout
            info["nvidia_smi"] = out.strip().splitlines()
        except (OSError, subprocess.SubprocessError):
            pass
    info["name"] = (info.get("info", {}).get("device_name") or (info.get("nvidia_smi") or [None])[0]
                    or platform.processor() or "unknown")
    info["cpu_count"] = __import__("os").cpu_count()
    return info


# ---- reading results ----------------------------------------------------------------------------------
ARM_KINDS = ("ops", "kernels", "kernel only")


def arm_kind(arm: str, label: str) -> str:
    """'fp16 copy', 'mx.quantize ...' (a baseline: the arm itself) or one of ARM_KINDS for `arm` of `label`."""
    for kind in ARM_KINDS:
        if arm == f"{kind} {label}":
            return kind
    return arm


def parse_title(title: str) -> tuple[str, str, list[int] | None]:
    """(op, method label, x shape) from a group title such as 'encode rabitq, x [1, 8, 4096, 128] float16'."""
    m = re.match(r"(\w+) (.+?), x (\[[\d, ]+\])", title)
    if not m:
        return title.split(" ", 1)[0], "", None
    return m.group(1), m.group(2), json.loads(m.group(3))


def case_of(arm: str) -> str | None:
    """The case label of a `kernel <label>` arm, None for a baseline or an api arm."""
    return arm[len("kernel "):] if arm.startswith("kernel ") else None
