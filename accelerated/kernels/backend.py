"""Which GPU backend runs the kernels, and the compiled kernel objects (one per kind, method, input dtype).

Metal on an Apple GPU (mx.metal.is_available()), CUDA where mx.cuda.is_available(); elsewhere, and when the
default device is the CPU, there are no kernels and `available()` says why.
"""
from __future__ import annotations

import functools

import mlx.core as mx

from veloxquant.accelerated.kernels import source


@functools.lru_cache(maxsize=None)
def _gpu_backend() -> tuple[str | None, str]:
    try:
        if mx.metal.is_available():
            return "metal", "Metal (Apple GPU)"
    except AttributeError:
        pass
    cuda = getattr(mx, "cuda", None)
    if cuda is not None and cuda.is_available():
        return "cuda", "CUDA"
    return None, f"no GPU backend in this mlx build ({mx.__version__}): kernels need Metal or CUDA"


def backend() -> str | None:
    """"cuda", "metal", or None when kernels cannot run now."""
    ok, _ = available()
    return _gpu_backend()[0] if ok else None


def available() -> tuple[bool, str]:
    """(True, backend description) or (False, the reason the kernels cannot run)."""
    name, why = _gpu_backend()
    if name is None:
        return False, why
    if mx.default_device().type != mx.DeviceType.gpu:
        return False, f"default device is {mx.default_device()}: the {why} kernels run on the GPU only"
    return True, why


@functools.lru_cache(maxsize=None)
def kernel(kind: str, method: str, dtype_name: str):
    """The compiled-on-first-call kernel `kind` ("encode" | "decode") for one method and input dtype.

    The dtype is part of the name so that each signature has its own cache entry on both backends."""
    be = _gpu_backend()[0]
    if be is None:
        raise RuntimeError(_gpu_backend()[1])
    header, src = source.assemble(kind, be)
    ins = source.ENCODE_INPUTS if kind == "encode" else source.DECODE_INPUTS
    outs = source.ENCODE_OUTPUTS if kind == "encode" else source.DECODE_OUTPUTS
    name = f"vq_{kind}_{method}_{dtype_name}"
    # encode reads x through its strides (no copy of a window-sliced or strided view); decode's inputs
    # are record fields, made contiguous by MLX where needed.
    contiguous = kind == "decode"
    if be == "cuda":
        return mx.fast.cuda_kernel(name=name, input_names=ins, output_names=outs, source=src, header=header,
                                   ensure_row_contiguous=contiguous)
    return mx.fast.metal_kernel(name=name, input_names=ins, output_names=outs, source=src, header=header,
                                ensure_row_contiguous=contiguous, compile_options={"math_mode": "safe"})
