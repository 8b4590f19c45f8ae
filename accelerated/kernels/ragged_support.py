"""Which ragged calls the decode attention kernels take (cache/ragged.py: rows of their own KIVI group phase), apart
from kernels/attention.py, which asks `takes` for any call with a ragged record: the ragged KIVI partial (KIVI both
roles) and the ragged MIXED partial, per-token keys beside KIVI values (`keyed_mixed`) or KIVI keys beside per-token
values (`kivi_keyed`: VQ_RKEYS). cache/ragged_step.py's in-place plans ask the same two for the pairs they hold.
"""
from __future__ import annotations

import mlx.core as mx

from ... import spec
from .. import layouts
from ..ops.attention import MAX_PACKED_QUERIES, PackedRecord, RaggedRecord, RowStarts


def pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def keyed_mixed(kp: spec.Params) -> bool:
    """Whether a ragged MIXED partial (and cache/ragged_step.py's mixed plans) takes these keys beside KIVI values: a
    per-token method (turboquant, turboquant_rvq, rabitq, turboquant_prod, mlx_affine with coordinate groups of any
    size: the texts take the key method as MK, append.RAGGED_ENCODES gates KIVI scopes only by the group); not KIVI's."""
    return layouts.of(kp).per_token


def kivi_keyed(kp: spec.Params, vp: spec.Params) -> bool:
    """Whether a ragged MIXED partial (and cache/ragged_step.py's RaggedKiviKeysInPlace) takes KIVI keys of each row's
    own phase beside these values: a per-token method, mlx_affine's coordinate groups too (the texts take it as MV;
    VQ_RKEYS; append.RAGGED_ENCODES gates KIVI scopes only by the group)."""
    return kp.method == "kivi" and layouts.of(vp).per_token


def takes(queries: mx.array, k: PackedRecord, v: PackedRecord, mask, mixed: bool, haswin: int) -> bool:
    """Whether the ragged partials take a call with a ragged record in either role (attention.supports past its
    backend check): both roles ragged, with row starts; without `mixed` the ragged KIVI partial (KIVI both roles of
    one group size and window, one encoded count), with it the ragged MIXED partial (keyed_mixed keys beside KIVI
    values, or kivi_keyed; `haswin`: the pair's HASWIN code, attention.mixed_windows, which must be a MIXED one)."""
    b, hq, l, d = queries.shape
    kb, kh = k.window.shape[:2]
    ok = (isinstance(k, RaggedRecord) and isinstance(v, RaggedRecord) and isinstance(mask, RowStarts)
          and l <= MAX_PACKED_QUERIES and tuple(mask.starts.shape) == (b,) and pow2(d) and 16 <= d <= 1024
          and hq % kh == 0 and b == kb)
    if mixed:       # (keys of a per-token method beside KIVI values of their own phase, or the roles swapped)
        return (ok and ((keyed_mixed(k.params) and v.params.method == "kivi") or kivi_keyed(k.params, v.params))
                and haswin > 0 and min(k.encoded, v.encoded) > 0 and k.window.shape[:2] == v.window.shape[:2])
    return (ok and k.params.method == v.params.method == "kivi" and k.params.group_size == v.params.group_size
            and k.params.window == v.params.window and k.encoded == v.encoded > 0
            and k.window.shape == v.window.shape)
