"""The launch and cache tuning choices of accelerated/, in one frozen object.

Every knob is a field of `Tuning`; code that plans a launch (or builds a cache) reads `current()` at that point,
never at import time, so a benchmark arm or a test changes a knob with

    with tuning.override(fuse_append=False, tokens_per_split=8):
        ...

Overrides nest and are restored on exit. They live in a context variable: each thread (and each asyncio task)
sees its own overrides, and a thread started inside an override sees the defaults. Knobs that change a kernel's
text or launch plan are part of the keys of the caches that hold them (accelerated/kernels/attention.py,
append.py, methods.py), so plans made under one setting are never reused under another. The measurements behind
the defaults are in docs/benchmark-log.md ("Tuning knobs").
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import typing


@dataclasses.dataclass(frozen=True)
class Tuning:
    # attention kernels (accelerated/kernels/attention.py)
    partial_threads: int = 128      # threads per partial threadgroup (the scalar and the tensor-core loop)
    tokens_per_split: int = 256     # encoded tokens per split up to 8k encoded tokens (and the tensor-core loop's)
    long_split: int = 1024          # encoded tokens per split of the scalar loop beyond 8k encoded tokens
    prefetch: int = 1               # 1: the scalar partial loop loads the next iteration's words while scoring one
    max_threadgroups: int = 2048    # partial threadgroups per launch at most (the scalar loop's split cap)
    combine_threads: int = 512      # threads of a combine threadgroup per query row (at least the head dim)
    fuse_combine: bool = False      # CUDA: the combine inside the partial launch instead of a second launch
    fuse_append: bool = True        # CUDA: a cache's decode step runs its append inside the partial launch
    tensor_cores: bool = True       # CUDA sm_80+: the partial's tensor-core loop where it applies
    tc_codes: bool = True           # ... also for rabitq and 1- and 2-bit turboquant codes (else 4-bit turboquant only)
    tc_kivi: bool = True            # ... also KIVI keys and values, 1-, 2- or 4-bit
    tc_affine: bool = True          # ... also mlx_affine keys and values, 2-, 4- or 8-bit
    tc_3bit: bool = True            # ... also 3-bit turboquant codes in either role
    tc_two_stage: bool = True       # ... also turboquant_rvq (two code streams, each 1-, 2- or 4-bit) and
                                    # turboquant_prod (bits 2, 3, 5: mse codes and QJL signs; keys at d = 128)
    tc_prod3: bool = True           # ... also turboquant_prod with 3-bit mse codes (bits 4) or beside a 3-bit role
                                    # (the 3-bit layout beside the QJL signs)
    tc_mixed: bool = True           # ... also turboquant keys (1-4 bits) beside KIVI values (1, 2, 4 bits), a MIXED
                                    # partial's split S - 1 in scalar arithmetic
    tc_mixkv: bool = True           # ... also KIVI keys (1, 2, 4 bits) beside turboquant values (1-4 bits), a MIXED
                                    # partial's split S - 1 in scalar arithmetic (on since its GPU twins passed)
    tc_ragged: bool = True          # ... also a ragged KIVI batch's rows (each its own group phase: tc_kivi's loop;
                                    # docs/ragged-kivi.md: on since its GPU twins passed and the batches measured)
    tc_kpairs: bool = True          # KIVI's loop (ragged rows too): a warp takes two consecutive chunks of one key
                                    # group (G >= 32), so it builds the group's query fragments once, not per chunk
                                    # (docs/decode-step-analysis.md: the partial's GPU time 0.77x at 128k)
    tc_window_prefetch: bool = False  # the tensor-core partial's window split loads a warp's next token while it scores
                                    # one (csrc/tc_window.h, VQ_WPF; the same arithmetic in the same order)
    tc_prefetch: int = 2            # chunks the tensor-core loop loads ahead while it scores one
    tc_mixed_splits: int = 4        # threadgroups of a MIXED tensor-core partial (TC_MIX, TC_MIXK) that share the
                                    # tokens of one role's window beside the other's records, in scalar arithmetic,
                                    # at most (csrc/partial_setup_mixed.h; 1: split S - 1 alone)
    tc_mixed_cost: int = 32         # ... as many as balance a scalar token costed as this many tensor-core tokens
                                    # against the tensor-core splits, per launch (0: always tc_mixed_splits)
    tc_min_blocks: int = 2          # threadgroups per multiprocessor the tensor-core partial is compiled for
    tc_waves: int = 1               # times the tensor-core loop's threadgroups fill the GPU (sets its split count)
    cold_loops: bool = False        # CUDA: loops a threadgroup runs once are not unrolled (VQ_COLD)
    # encode / decode / append kernels (accelerated/kernels/methods.py, append.py)
    specialize_rows: int = 4096     # launches of at least this many rows compile their code constants in
    device_counts: bool = True      # CUDA: counts are views into a device arange instead of host-written arrays
    max_warps: int = 8              # warps of one encode/decode threadgroup at most (255 registers x 256 threads)
    big_warps: int = 8              # warps per threadgroup of a launch of more rows than one threadgroup holds
    block_cap: int = 4096           # threadgroups of an encode/decode launch at most (warps loop over more rows)
    roles_apart: bool = True        # the append's keys and values encode in two halves of the grid, side by side
    whole_windows: bool = False     # a decode step passes each exact window buffer whole with its rows in one small
                                    # input (csrc/window_bind.h), not four views a layer (off: GPU twins not run)
    # caches (accelerated/cache/) and the ops path (accelerated/ops/attention.py)
    split_rows: bool = True         # a batch cache cuts a full chunk into rows with one mx.split (B <= 10)
    shared: bool = True             # VeloxKVCache.merge makes a SharedBatchVeloxKVCache where eligible
    ragged: bool = True             # ... also of KIVI rows not whole groups apart (cache/ragged.py; docs/ragged-kivi.md)
    compact_rows: int = 256         # a rotating cache frees evicted rows past this many (and the held tokens)
    attention_block: int = 2048     # encoded tokens per block of the ops attention (bounds its temporaries)

    def __post_init__(self):
        for f in dataclasses.fields(self):
            _check(f.name, getattr(self, f.name))
        for name in ("partial_threads", "tokens_per_split", "long_split", "max_threadgroups", "combine_threads",
                     "tc_prefetch", "tc_mixed_splits", "tc_min_blocks", "tc_waves", "max_warps", "big_warps",
                     "block_cap", "compact_rows", "attention_block"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be at least 1, got {getattr(self, name)}")
        if self.tc_mixed_cost < 0:
            raise ValueError(f"tc_mixed_cost: must be at least 0, got {self.tc_mixed_cost}")
        if self.prefetch not in (0, 1):
            raise ValueError(f"prefetch: must be 0 or 1, got {self.prefetch}")
        if self.specialize_rows < 0:
            raise ValueError(f"specialize_rows: must be at least 0, got {self.specialize_rows}")
        # launch plans are cached with the tuning in their key: hash it once, not at every lookup
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self))))

    def __hash__(self) -> int:
        return self._hash

    def replace(self, **knobs) -> "Tuning":
        """A copy with `knobs` changed (names and types checked)."""
        for name in knobs:
            if name not in _TYPES:
                raise TypeError(f"{name}: not a tuning knob (knobs: {', '.join(_TYPES)})")
        return dataclasses.replace(self, **knobs)


_TYPES: dict[str, type] = {f.name: typing.get_type_hints(Tuning)[f.name] for f in dataclasses.fields(Tuning)}
NAMES = tuple(_TYPES)


def _check(name: str, value) -> None:
    want = _TYPES[name]
    # bool is an int subclass: an int knob refuses True/False, a bool knob refuses 0/1
    if type(value) is not want:
        raise TypeError(f"{name}: expected {want.__name__}, got {type(value).__name__} {value!r}")


DEFAULT = Tuning()
_CURRENT: contextvars.ContextVar[Tuning] = contextvars.ContextVar("veloxquant_tuning", default=DEFAULT)


def current() -> Tuning:
    """The tuning in effect here (the defaults unless an `override` is active in this context)."""
    return _CURRENT.get()


@contextlib.contextmanager
def override(**knobs) -> typing.Iterator[Tuning]:
    """Knobs changed for the duration of a `with` block (in this thread / context only); yields the tuning in
    effect inside. Unknown names and wrong types raise before anything changes."""
    t = current().replace(**knobs)
    token = _CURRENT.set(t)
    try:
        yield t
    finally:
        _CURRENT.reset(token)


def parse(knobs: typing.Mapping[str, object]) -> dict:
    """Knob settings from text or JSON (a benchmark arm's "FUSE_APPEND=0", a variant's {"TC_PREFETCH": 1}): names
    in either case, bool knobs from bool, 0/1 or "0"/"1", int knobs from int or decimal text; errors name the
    knob."""
    out = {}
    for raw, value in knobs.items():
        name = str(raw).lower()
        if name not in _TYPES:
            raise ValueError(f"{raw}: not a tuning knob (knobs: {', '.join(_TYPES)})")
        text = value.strip() if isinstance(value, str) else None
        if text is not None and text.lstrip("-").isdigit():
            value = int(text)
        if _TYPES[name] is bool and type(value) is int and value in (0, 1):
            value = bool(value)
        _check(name, value)
        out[name] = value
    DEFAULT.replace(**out)          # the ranges, checked now rather than when a benchmark arm starts
    return out
