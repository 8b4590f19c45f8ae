#!/usr/bin/env bash
# docs/quality-retrieval.md from the H200 runs on the committed model (run from the checkout root). The runs and
# the speed sources are tools/quality/retrieval_doc.py's RUNS and SPEED (the outliers run first: its cells, mlx-lm's
# QuantizedKVCache on the dequantizing path, stand in for run 6-a's, where mx.quantized_matmul crashed at 16k).
exec python -m veloxquant.tools.quality.retrieval_doc --committed "$@"
