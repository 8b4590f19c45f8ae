"""accelerated.kernels.methods.count: the one-element counts the append and attention launches read (first row,
encoded tokens). On CUDA they are views into one device-resident arange (no array the host writes per decode
step: MLX's CUDA allocator keeps host-made and <= 8-byte arrays in managed memory, which the GPU then faults
on); elsewhere host-made scalars. Either way count(n) holds exactly n and is made once per value."""
from __future__ import annotations

import mlx.core as mx
import pytest

from veloxquant.accelerated.kernels import backend
from veloxquant.accelerated.kernels import methods as km

VALUES = [0, 1, 2, 255, 4096, 65535, 65536, 131071, 131072, 300001, 5, 4097]


@pytest.fixture
def fresh():
    def clear():
        km._count.cache_clear()
        km._RANGE.clear()
    clear()
    yield
    clear()


@pytest.fixture
def cuda(monkeypatch):
    monkeypatch.setattr(backend, "backend", lambda: "cuda")


@pytest.mark.parametrize("device_counts", [True, False])
def test_count_holds_n_and_is_made_once(monkeypatch, tune, fresh, cuda, device_counts):
    tune(device_counts=device_counts)
    made = [km.count(n) for n in VALUES]             # crosses the range's growth (65536, 131072, 262144)
    for n, a in zip(VALUES, made):
        assert a.shape == (1,) and a.dtype == mx.int32, f"count({n}): shape {a.shape}, dtype {a.dtype}"
        assert a.item() == n, f"count({n}) holds {a.item()} (DEVICE_COUNTS={device_counts})"
        assert km.count(n) is a, f"count({n}) made twice"
    if device_counts:
        assert km._RANGE and km._RANGE[0].shape[0] > max(VALUES), "counts are not views of the range"
    else:
        assert not km._RANGE, "host counts made a range"


def test_count_off_cuda_is_a_host_scalar(monkeypatch, fresh):
    monkeypatch.setattr(backend, "backend", lambda: "metal")
    assert km.count(7).item() == 7 and not km._RANGE


def test_negative_count_is_an_error(fresh, cuda):
    with pytest.raises(ValueError, match=r"count: n must be >= 0, got -1"):
        km.count(-1)
