"""Fused decode attention over packed records (work in progress: not selected yet)."""
from __future__ import annotations


def supports(queries, k, v, mask) -> bool:
    return False
