"""What the benchmarks and the probes share besides the arms (a leaf: imports no other tools module): the decode
step's attention shape, the device choice of a command (`veloxquant memory`) and the device's description a saved run
records. No timing loop lives here: every timed comparison is a pytest benchmark (benchmarks/harness.py paired)."""
from __future__ import annotations

import platform
import subprocess
import sys

B, HQ, HKV, D = 1, 32, 8, 128   # the decode benchmarks' attention shape (Llama-3-8B)


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
    cpu = _cpu_model()
    if cpu:
        info["cpu"] = cpu
    return info


def _cpu_model() -> str | None:
    """The host CPU's model name (Linux /proc/cpuinfo, else platform.processor()): a GPU run's host-paced ratios
    move with it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return platform.processor() or None
