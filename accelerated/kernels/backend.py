"""Which GPU backend runs the kernels, and the compiled kernel objects (one per kind, method, input dtype).

Metal on an Apple GPU (mx.metal.is_available()), CUDA where mx.cuda.is_available(); elsewhere, and when the
default device is the CPU, there are no kernels and `available()` says why.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import tempfile

import mlx.core as mx

from . import kernel_cache, source


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
        return cuda_kernel(name=name, input_names=ins, output_names=outs, source=src, header=header,
                           ensure_row_contiguous=contiguous)
    return mx.fast.metal_kernel(name=name, input_names=ins, output_names=outs, source=src, header=header,
                                ensure_row_contiguous=contiguous, compile_options={"math_mode": "safe"})


# ---- CUDA launches with the kernel text in included files ---------------------------------------------------
# MLX's CUDA custom kernel copies its whole text (header + source) into every launch's primitive and hashes it
# in every evaluation (mlx/backend/cuda/custom_kernel.cpp: build_kernel per call, std::hash of the source per
# eval_gpu): a launch's host cost grows with its source's length (docs/decode-step-analysis.md: our 30-55 KB
# kernels cost several times a one-line source's). So on CUDA the text goes into files named by their content's
# hash and the launch's source is a few lines that #include them (NVRTC reads absolute paths): the compiled code
# is the same, the module name (MLX's compile cache key) still changes with the content because the file name
# does. Template arguments are written into that short source as the constexpr lines MLX would emit, one kernel
# object per combination, so a call does not format them either.
INCLUDE_TEXT = True
_SAFE_PATH = re.compile(r"^[A-Za-z0-9_./-]+$")
_CUDA_TYPES = {mx.float16: "__half", mx.bfloat16: "__nv_bfloat16", mx.float32: "float", mx.bool_: "bool",
               mx.int8: "int8_t", mx.int16: "int16_t", mx.int32: "int32_t", mx.int64: "int64_t",
               mx.uint8: "uint8_t", mx.uint16: "uint16_t", mx.uint32: "uint32_t", mx.uint64: "uint64_t"}


@functools.lru_cache(maxsize=None)
def kernel_dir() -> str | None:
    """Folder of the included kernel texts ($VELOXQUANT_KERNEL_DIR, else the user's cache folder, else the
    temporary folder), or None when none is writable or its path is not plain ASCII (then texts go inline)."""
    env = os.environ.get("VELOXQUANT_KERNEL_DIR")
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    tries = [env] if env else [os.path.join(cache, "veloxquant", "kernels"),
                               os.path.join(tempfile.gettempdir(), f"veloxquant-kernels-{os.getuid()}")]
    for d in tries:
        d = os.path.abspath(d)
        try:
            os.makedirs(d, exist_ok=True)
            if os.access(d, os.W_OK) and _SAFE_PATH.match(d):
                return d
        except OSError:
            continue
    return None


def stash(text: str) -> str | None:
    """Absolute path of a file holding `text`, named by its hash (written once, atomically); None if it
    cannot be written."""
    d = kernel_dir()
    if d is None:
        return None
    path = os.path.join(d, f"vq_{hashlib.sha256(text.encode()).hexdigest()[:24]}.cuh")
    try:
        if not os.path.exists(path):
            fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.chmod(tmp, 0o644)        # mkstemp's 0600 would hide it from others sharing the folder
            os.replace(tmp, path)
    except OSError:
        return None
    return path


def template_lines(template) -> str:
    """The constexpr lines MLX's build_kernel writes for template arguments (int, bool, dtype)."""
    out = []
    for name, v in template:
        if isinstance(v, bool):
            out.append(f"  constexpr bool {name} = {'true' if v else 'false'};")
        elif isinstance(v, int):
            out.append(f"  constexpr int {name} = {v};")
        else:
            out.append(f"  using {name} = {_CUDA_TYPES[v]};")
    return "\n".join(out) + ("\n" if out else "")


class CudaKernel:
    """mx.fast.cuda_kernel's callable, with the text included from files (see INCLUDE_TEXT) and templates
    written into the short source; same call signature."""

    def __init__(self, name: str, input_names, output_names, source: str, header: str = "",
                 ensure_row_contiguous: bool = True):
        self.name, self.inputs, self.outputs = name, list(input_names), list(output_names)
        self.contiguous = ensure_row_contiguous
        self.text, self.header_text = source, header
        self._by_template: dict = {}

    def _texts(self) -> tuple[str, str]:
        """(source, header) of a new kernel object; the files are written again if they went missing (a
        cleaned cache folder), since NVRTC reads them when MLX first compiles that object."""
        spath = stash(self.text) if INCLUDE_TEXT else None
        hpath = stash(self.header_text) if INCLUDE_TEXT and self.header_text else None
        # MLX passes an input's shape / strides / ndim when its name + suffix occurs in the source text: name
        # the ones the included text uses
        used = [f"{n}{x}" for n in self.inputs for x in ("_shape", "_strides", "_ndim") if f"{n}{x}" in self.text]
        source = (f"  // uses {' '.join(used)}\n" if used and spath else "") + \
            (f'#include "{spath}"\n' if spath else self.text)
        return source, f'#include "{hpath}"\n' if hpath else self.header_text

    def specialized(self, template=None):
        key = tuple(template) if template else ()
        k = self._by_template.get(key)
        if k is None:
            tag = hashlib.sha256(repr(key).encode()).hexdigest()[:10] if key else "0"
            source, header = self._texts()
            k = Launcher(f"{self.name}_{tag}", self.inputs, self.outputs, template_lines(key) + source, header,
                         self.contiguous)
            self._by_template[key] = k
        return k

    def __call__(self, *, inputs, output_shapes, output_dtypes, grid, threadgroup, template=None, **kw):
        return self.specialized(template)(inputs=inputs, output_shapes=output_shapes, output_dtypes=output_dtypes,
                                          grid=grid, threadgroup=threadgroup, **kw)


CHECK_EVERY_LAUNCH = False     # tests: make sure of the module at every launch, not only a launcher's first


def mlx_kernel(**kw):
    """mx.fast.cuda_kernel (a function of its own so that tests can stand in for MLX's launches)."""
    return mx.fast.cuda_kernel(**kw)


class Launcher:
    """One MLX kernel object (a text with its template constants): before its first launch in this process,
    kernel_cache.CACHE makes sure MLX finds the compiled module on disk (compiled once per machine). Inside
    kernel_cache.CACHE.recording() a launch records its variant and returns zeros instead."""
    __slots__ = ("name", "inputs", "outputs", "source", "header", "kernel", "first")

    def __init__(self, name, inputs, outputs, source, header, contiguous):
        self.name, self.inputs, self.outputs, self.source, self.header = name, inputs, outputs, source, header
        self.kernel = mlx_kernel(name=name, input_names=inputs, output_names=outputs, source=source,
                                 header=header, ensure_row_contiguous=contiguous)
        self.first = True

    def variant(self, inputs, output_dtypes) -> kernel_cache.Variant:
        return kernel_cache.variant(self.name, self.header, self.source, self.inputs, inputs, self.outputs,
                                    output_dtypes)

    def __call__(self, *, inputs, output_shapes, output_dtypes, **kw):
        if self.first or CHECK_EVERY_LAUNCH or kernel_cache.CACHE.recorder is not None:
            kernel_cache.CACHE.ensure(self.variant(inputs, output_dtypes))
            if kernel_cache.CACHE.recorder is not None:
                return [mx.zeros(s, dtype=d) for s, d in zip(output_shapes, output_dtypes)]
            self.first = False
        return self.kernel(inputs=inputs, output_shapes=output_shapes, output_dtypes=output_dtypes, **kw)


def cuda_kernel(name: str, input_names, output_names, source: str, header: str = "",
                ensure_row_contiguous: bool = True) -> CudaKernel:
    return CudaKernel(name, input_names, output_names, source, header, ensure_row_contiguous)
