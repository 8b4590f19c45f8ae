"""Inputs that an encode must reject, shared by the kernel tests (emulated and on a GPU) that compare the
kernels' errors with accelerated.ops's."""
from __future__ import annotations

import numpy as np


def fault_inputs(method: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rule, both) from a clean float32 x (B, H, T, d), T > 4: `rule` breaks the method's rule in token 4 of the
    last batch row and head (mlx_affine: a group range that overflows; kivi: a float16 scale that overflows; the
    rotation family: a norm that overflows), `both` adds a NaN in the last token of batch row 0, head 0 (a window
    token where the caller sets a window; NaN/Inf is reported first)."""
    rule = x.copy()
    if method == "mlx_affine":
        rule[-1, -1, 4, :2] = [-3e38, 3e38]
    elif method == "kivi":
        rule[-1, -1, 4, :2] = 1e6
    else:
        rule[-1, -1, 4, :] = 3e38
    both = rule.copy()
    both[0, 0, -1, 3] = np.nan
    return rule, both
