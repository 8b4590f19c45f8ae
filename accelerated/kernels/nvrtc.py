"""NVRTC through ctypes, with nothing else imported: a compile runs in this process or in a worker process of
its own (kernel_cache compiles many variants at once in separate processes, since one process's NVRTC calls
barely overlap; docs/benchmark-log.md, its cold-start entry)."""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import time


class CompileError(RuntimeError):
    pass


@dataclasses.dataclass(frozen=True)
class Job:
    """What every compile of one machine shares: the library, `--gpu-architecture`, include folders, options."""
    library: str
    arch: str
    includes: tuple
    options: tuple


@functools.lru_cache(maxsize=None)
def _lib(path: str):
    lib = ctypes.CDLL(path)
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


def _check(lib, rc: int, what: str) -> None:
    if rc != 0:
        raise CompileError(f"{what}: {lib.nvrtcGetErrorString(rc).decode()}")


def version(library: str) -> str:
    lib = _lib(library)
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(lib, lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return f"{major.value}.{minor.value}"


def compile(job: Job, text: str, kernel_name: str) -> tuple[bytes, str]:  # noqa: A001 (NVRTC's own word)
    """(cubin, lowered name of mlx::core::cu::<kernel_name>) of `text`."""
    lib, prog = _lib(job.library), ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), b"vq_kernel.cu", 0, None, None),
           "nvrtcCreateProgram")
    try:
        expr = f"mlx::core::cu::{kernel_name}".encode()
        _check(lib, lib.nvrtcAddNameExpression(prog, expr), "nvrtcAddNameExpression")
        opts = [*job.options, f"--gpu-architecture={job.arch}", *(f"--include-path={d}" for d in job.includes)]
        arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        if lib.nvrtcCompileProgram(prog, len(opts), arr) != 0:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value + 1)
            lib.nvrtcGetProgramLog(prog, log)
            raise CompileError(f"NVRTC failed for {kernel_name}:\n{log.value.decode(errors='replace')[:4000]}")
        lowered = ctypes.c_char_p()
        _check(lib, lib.nvrtcGetLoweredName(prog, expr, ctypes.byref(lowered)), "nvrtcGetLoweredName")
        size = ctypes.c_size_t()
        _check(lib, lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
        buf = ctypes.create_string_buffer(size.value)
        _check(lib, lib.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
        return buf.raw, lowered.value.decode()
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def timed_compile(job: Job, text: str, kernel_name: str) -> tuple[bytes, str, float]:
    t0 = time.perf_counter()
    return (*compile(job, text, kernel_name), time.perf_counter() - t0)
