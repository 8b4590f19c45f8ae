"""Compiled CUDA kernels kept on disk: each variant compiled once per machine, never once per process.

How MLX runs a custom kernel (mlx/backend/cuda/custom_kernel.cpp, jit_module.cpp): at a launch's first
evaluation in a process it writes the kernel's full text (`mlx_text`), names the module
`custom_kernel_<name>_<std::hash(text):x>` and looks for `<module>.ptx` (+ `.txt`, the kernels' mangled
names) in its PTX cache folder; only if that file is missing does it run NVRTC. It reads that folder for every
module but writes it only for its own kernels, so until now every process compiled ours again (~1-3 s per
variant). Here, before a variant's first launch in a process (`ensure`), the module's binary is put in MLX's
folder: from our per-user store if it was ever compiled on this machine, else compiled now with the NVRTC MLX
itself loads, for this GPU's architecture, and kept in the store.

Why this and not mx.fast.precompiled_cuda_kernel: that launch passes no shapes or strides (our kernels read
record buffers and views through their strides, which change as buffers grow), copies the binary into every
call and hashes it at every evaluation; MLX's own launch path with a warm module costs what it cost before.

The store: $VELOXQUANT_KERNEL_CACHE, else $XDG_CACHE_HOME/veloxquant/cubin (~/.cache/...). An entry's file
name is the sha256 of everything that changes the binary: the compiled text (whose #include lines name their
files by content hash), the architecture, the NVRTC and MLX versions and this module's compile options.
Writers go through a temporary file and a rename, so concurrent processes never see a partial file.

No GPU is needed to test this: `compiler` can be a stand-in (tests count compiles with one), and
`recording()` collects the variants a run would launch without launching them (`veloxquant kernels warmup`
compiles those it finds missing, several at once).
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import sys
import tempfile
import threading
import time

import mlx.core as mx

from . import loader, nvrtc

# MLX's build_kernel (custom_kernel.cpp) around a kernel's header and body, byte for byte, and the header we
# compile in place of MLX's default one (csrc/cuda_mlx_*.cuh)
_MLX_DEFAULT_HEADER = loader.text("cuda_mlx_default_header.cuh")
_OWN_HEADER = loader.text("cuda_mlx_types.cuh")
_OPEN = loader.text("cuda_mlx_open.cuh")
_CLOSE = loader.text("cuda_mlx_close.cuh")
_OPTIONS = ("--device-as-default-execution-space",)        # MLX's own NVRTC options (besides arch and includes)
_CUDA_TYPES = {mx.float16: "__half", mx.bfloat16: "__nv_bfloat16", mx.float32: "float", mx.bool_: "bool",
               mx.int8: "int8_t", mx.int16: "int16_t", mx.int32: "int32_t", mx.int64: "int64_t",
               mx.uint8: "uint8_t", mx.uint16: "uint16_t", mx.uint32: "uint32_t", mx.uint64: "uint64_t"}


# ---- MLX's names ------------------------------------------------------------------------------------------
def std_hash(data: bytes) -> int:
    """libstdc++'s std::hash<std::string> on 64-bit (std::_Hash_bytes, seed 0xc70f6907): MLX's module name."""
    m = 0xC6A4A7935BD1E995
    mask = (1 << 64) - 1
    n = len(data)
    h = (0xC70F6907 ^ (n * m)) & mask
    aligned = n & ~7
    for i in range(0, aligned, 8):
        k = int.from_bytes(data[i:i + 8], "little")
        k = ((k * m) & mask)
        k ^= k >> 47
        h ^= (k * m) & mask
        h = (h * m) & mask
    if n & 7:
        h ^= int.from_bytes(data[aligned:], "little")
        h = (h * m) & mask
    h ^= h >> 47
    h = (h * m) & mask
    h ^= h >> 47
    return h


def mlx_text(name: str, header: str, source: str, input_names, inputs, output_names, output_dtypes,
             own: bool = False) -> str:
    """The text MLX's cuda_kernel builds for one launch (build_kernel, no template arguments: ours are written
    into `source`); `own`: the same with our header in place of MLX's, the text we compile."""
    parts = [_OWN_HEADER if own else _MLX_DEFAULT_HEADER, header, _OPEN, name, "(\n"]
    for n, a in zip(input_names, inputs):
        parts.append(f"    const {_CUDA_TYPES[a.dtype]}* {n},\n")
        if a.ndim > 0:
            if f"{n}_shape" in source:
                parts.append(f"    const __grid_constant__ Shape {n}_shape,\n")
            if f"{n}_strides" in source:
                parts.append(f"    const __grid_constant__ Strides {n}_strides,\n")
            if f"{n}_ndim" in source:
                parts.append(f"    const __grid_constant__ int {n}_ndim,\n")
    for i, (n, dt) in enumerate(zip(output_names, output_dtypes)):
        parts.append(f"    {_CUDA_TYPES[dt]}* {n}" + (",\n" if i < len(output_names) - 1 else ") {\n"))
    parts += [source, _CLOSE]
    return "".join(parts)


class Variant:
    """One kernel as one launch needs it: MLX's module name and the text we compile for it."""
    __slots__ = ("kernel_name", "module", "text")

    def __init__(self, kernel_name: str, module: str, text: str):
        self.kernel_name, self.module, self.text = kernel_name, module, text

    def __repr__(self):
        return f"Variant({self.module})"


def variant(name: str, header: str, source: str, input_names, inputs, output_names, output_dtypes) -> Variant:
    kname = "custom_kernel_" + name
    args = (kname, header, source, input_names, inputs, output_names, output_dtypes)
    module = f"{kname}_{std_hash(mlx_text(*args).encode()):x}"
    return Variant(kname, module, mlx_text(*args, own=True))


# ---- where things live ------------------------------------------------------------------------------------
def mlx_ptx_dir() -> str:
    """MLX's PTX cache folder (jit_module.cpp ptx_cache_dir): $MLX_PTX_CACHE_DIR, else
    std::filesystem::temp_directory_path()/mlx/<version>/ptx."""
    d = os.environ.get("MLX_PTX_CACHE_DIR")
    if not d:
        tmp = next((os.environ[v] for v in ("TMPDIR", "TMP", "TEMP", "TEMPDIR") if os.environ.get(v)), "/tmp")
        d = os.path.join(tmp, "mlx", mx.__version__, "ptx")
    return os.path.abspath(d)


def mlx_ptx_path(module: str) -> str:
    """jit_module.cpp get_ptx_path: names over 245 characters are split into folders."""
    parts, off, limit = [], 0, 245
    while len(module) - off > limit:
        parts.append(module[off:off + limit])
        off += limit
    return os.path.join(mlx_ptx_dir(), *parts, module[off:] + ".ptx")


def store_dir() -> str:
    d = os.environ.get("VELOXQUANT_KERNEL_CACHE")
    if not d:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(cache, "veloxquant", "cubin")
    return os.path.abspath(d)


def _write(path: str, data: bytes) -> None:
    """Atomically: another process sees the old file, no file, or the whole new one."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ---- the compiler -----------------------------------------------------------------------------------------
CompileError = nvrtc.CompileError


class Nvrtc:
    """NVRTC through ctypes (kernels/nvrtc.py): the library MLX's CUDA build loads (found in this process's
    mappings, else next to the nvidia wheels or CUDA_HOME), the include folders MLX gives it, the GPU's
    architecture."""

    def __init__(self):
        self.job = nvrtc.Job(_find_nvrtc(), _architecture(), tuple(_include_dirs()), _OPTIONS)
        self.version = nvrtc.version(self.job.library)

    def identity(self) -> str:
        return f"nvrtc {self.version} {self.job.arch} mlx {mx.__version__} {' '.join(_OPTIONS)}"

    def compile(self, text: str, kernel_name: str) -> tuple[bytes, str]:
        """(cubin, lowered name of mlx::core::cu::<kernel_name>)."""
        return nvrtc.compile(self.job, text, kernel_name)


def _find_nvrtc() -> str:
    with contextlib.suppress(OSError):
        with open("/proc/self/maps") as f:
            for line in f:
                if "libnvrtc.so" in line and "builtins" not in line:
                    return line.split()[-1]
    roots = [os.path.dirname(os.path.dirname(mx.__file__)), *sys.path]
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    pats = [os.path.join(r, "nvidia", sub, "lib", "libnvrtc.so*") for r in roots if r
            for sub in ("cu13", "cuda_nvrtc", "cu12")] + [os.path.join(home, "lib64", "libnvrtc.so*")]
    for p in pats:
        hits = sorted(h for h in glob.glob(p) if "builtins" not in h and "alt" not in h)
        if hits:
            return hits[0]
    return "libnvrtc.so"        # the loader's search path; CDLL says clearly if it is not there


def _include_dirs() -> list[str]:
    """jit_module.cpp include_path_args: MLX's bundled headers (and CCCL), then the CUDA runtime headers."""
    mlx_dir = os.path.dirname(mx.__file__)            # the mlx package: its include/ holds the headers
    inc = os.path.join(mlx_dir, "include")
    out = [d for d in (inc, os.path.join(inc, "cccl")) if os.path.isdir(d)]
    roots = [os.path.dirname(mlx_dir), *sys.path]
    for r in roots:
        d = os.path.join(r, "nvidia", "cu13", "include")
        if os.path.isdir(d):
            return out + [d]
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    return out + [os.path.join(home, "include")]


def _architecture() -> str:
    """sm_XYa for this GPU as MLX compiles (the 'a' features from compute capability 9)."""
    arch = str(mx.device_info().get("architecture", ""))
    if not (arch.startswith("sm_") and arch[3:].isdigit()):
        raise nvrtc.CompileError(f"unknown GPU architecture {arch!r}")
    return arch + ("a" if int(arch[3:]) >= 90 else "")


# ---- the cache --------------------------------------------------------------------------------------------
class KernelCache:
    """Makes sure MLX finds a variant's module on disk before its first launch in this process."""

    def __init__(self, compiler=None):
        self._compiler = compiler          # None: Nvrtc(), made at the first compile
        self._lock = threading.Lock()
        self.ready: set[str] = set()       # modules this process made sure of
        self.compiled = 0                  # compiles in this process
        self.loaded = 0                    # modules copied from the store into MLX's folder
        self.failed: dict[str, str] = {}   # module -> why it could not be compiled (MLX compiles it then)
        self.seconds: dict[str, float] = {}  # module -> seconds its compile took
        self.recorder: dict[str, Variant] | None = None

    @property
    def compiler(self):
        if self._compiler is None:
            self._compiler = Nvrtc()
        return self._compiler

    def store_path(self, v: Variant) -> str:
        key = hashlib.sha256(f"{self.compiler.identity()}\n{v.kernel_name}\n{v.text}".encode()).hexdigest()
        return os.path.join(store_dir(), key[:2], key + ".cubin")

    def ensure(self, v: Variant) -> None:
        if self.recorder is not None:
            self.recorder[v.module] = v
            return
        if v.module in self.ready:
            return
        try:
            self._ensure(v)
        except (CompileError, OSError) as e:       # MLX compiles it in-process, as it always did
            self.failed[v.module] = str(e)
        self.ready.add(v.module)

    def _ensure(self, v: Variant) -> None:
        if self._on_disk(v):
            return
        sp = self.store_path(v)
        if os.path.exists(sp):
            with open(sp, "rb") as f:
                binary, lowered = _unpack(f.read())
            self.loaded += 1
            self._to_mlx(v, binary, lowered)
            return
        t0 = time.perf_counter()
        binary, lowered = self.compiler.compile(v.text, v.kernel_name)
        self._install(v, binary, lowered, time.perf_counter() - t0)

    @staticmethod
    def _on_disk(v: Variant) -> bool:
        p = mlx_ptx_path(v.module)
        return os.path.exists(p) and os.path.exists(p[:-4] + ".txt")

    def _install(self, v: Variant, binary: bytes, lowered: str, seconds: float) -> None:
        _write(self.store_path(v), _pack(binary, lowered))
        with self._lock:
            self.compiled += 1
            self.seconds[v.module] = seconds
        self._to_mlx(v, binary, lowered)

    @staticmethod
    def _to_mlx(v: Variant, binary: bytes, lowered: str) -> None:
        ptx = mlx_ptx_path(v.module)
        _write(ptx[:-4] + ".txt", f"mlx::core::cu::{v.kernel_name}\t{lowered}\n".encode())
        _write(ptx, binary)

    def ensure_all(self, variants, workers: int | None = None, progress=None) -> None:
        """ensure() each; the ones to compile `workers` at a time: in processes of their own with NVRTC (one
        process's compiles barely overlap), in threads with a stand-in compiler. progress(done, total)."""
        variants = list({v.module: v for v in variants}.values())
        todo = [v for v in variants if not self._on_disk(v) and not os.path.exists(self.store_path(v))]
        for v in variants:
            if v not in todo:
                self.ensure(v)
        done, total = len(variants) - len(todo), len(variants)
        if progress:
            progress(done, total)
        workers = max(1, min(workers or os.cpu_count() or 1, 16, len(todo)))
        for v, result in self._compile_many(todo, workers):
            if isinstance(result, Exception):
                self.failed[v.module] = str(result)
            else:
                self._install(v, *result)
            self.ready.add(v.module)
            done += 1
            if progress:
                progress(done, total)

    def _compile_many(self, todo: list, workers: int):
        """(variant, (binary, lowered, seconds) or the exception) for each, as they finish."""
        from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
        if isinstance(self.compiler, Nvrtc) and workers > 1:
            import multiprocessing
            pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
            submit = lambda v: pool.submit(nvrtc.timed_compile, self.compiler.job, v.text, v.kernel_name)  # noqa
        else:
            pool = ThreadPoolExecutor(workers)

            def timed(v):
                t0 = time.perf_counter()
                return (*self.compiler.compile(v.text, v.kernel_name), time.perf_counter() - t0)
            submit = lambda v: pool.submit(timed, v)  # noqa: E731
        with pool:
            futures = {submit(v): v for v in todo}
            for f in as_completed(futures):
                try:
                    yield futures[f], f.result()
                except (nvrtc.CompileError, OSError) as e:
                    yield futures[f], e

    @contextlib.contextmanager
    def recording(self):
        """Collects the variants launched inside the block (launches return zeros, nothing is compiled)."""
        self.recorder = rec = {}
        try:
            yield rec
        finally:
            self.recorder = None


def _pack(binary: bytes, lowered: str) -> bytes:
    name = lowered.encode()
    return len(name).to_bytes(4, "little") + name + binary


def _unpack(data: bytes) -> tuple[bytes, str]:
    n = int.from_bytes(data[:4], "little")
    return data[4 + n:], data[4:4 + n].decode()


def clear() -> tuple[int, int]:
    """Removes the store (and our modules from MLX's folder): (files, bytes) removed."""
    files = nbytes = 0
    for root in (store_dir(), mlx_ptx_dir()):
        for dirpath, _, names in os.walk(root):
            for n in names:
                if root == mlx_ptx_dir() and not n.startswith("custom_kernel_vq_"):
                    continue
                p = os.path.join(dirpath, n)
                with contextlib.suppress(OSError):
                    nbytes += os.path.getsize(p)
                    os.unlink(p)
                    files += 1
    return files, nbytes


def usage() -> tuple[int, int]:
    """(entries, bytes) of the store."""
    n = size = 0
    for dirpath, _, names in os.walk(store_dir()):
        for f in names:
            if f.endswith(".cubin"):
                n += 1
                size += os.path.getsize(os.path.join(dirpath, f))
    return n, size


CACHE = KernelCache()
