"""The papers' stated distortion figures and bounds that `veloxquant distortion` compares against, in one place
for the sweep (tools/quality/distortion_measure.py), its page (tools/quality/distortion_doc.py) and the tests."""
from __future__ import annotations

import math

# TurboQuant (arXiv 2504.19874), Theorem 1: D_mse of a unit vector (total squared error, not per coordinate)
# at b = 1..4, its upper bound sqrt(3) pi / 2 * 4^-b and the lower bound 4^-b (any quantizer).
TQ_PAPER_DMSE = {1: 0.36, 2: 0.117, 3: 0.03, 4: 0.009}
SQRT3_PI_2 = math.sqrt(3) * math.pi / 2
# Theorem 2: TurboQuant-prod is unbiased with d * D_prod <= sqrt(3) pi^2 * 4^-b for unit vectors.
SQRT3_PI2 = math.sqrt(3) * math.pi**2

# A mixed key/value pair must beat the best single configuration by more than the KL sum's own error
# (KL_k + KL_v over-predicts the measured both-roles KL by up to ~15 %) to be recommended.
MIXED_MARGIN = 0.85
