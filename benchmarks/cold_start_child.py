"""One fresh process's first request, for benchmarks/test_cold_start.py: import, build a small random llama, make
the cache (ours or mlx-lm's fp16), generate a few tokens from a prompt, print the phases' seconds as one JSON line.

    python benchmarks/cold_start_child.py ARM_JSON DEVICE SHAPE LAYERS CONTEXT TOKENS
ARM_JSON: make_prompt_cache's settings, or null for mlx-lm's fp16 KVCache; SHAPE: llama.ModelArgs' shape fields as JSON
(tools/bench/arms.py SHAPES).
"""
import time

T0 = time.perf_counter()
import json  # noqa: E402
import os  # noqa: E402
import pathlib  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(1, str(pathlib.Path(__file__).resolve().parent.parent))


def main(argv):
    arm, device, shape, layers, context, tokens = (json.loads(argv[0]), argv[1], json.loads(argv[2]), int(argv[3]),
                                                   int(argv[4]), int(argv[5]))
    import mlx.core as mx
    mx.set_default_device(mx.gpu if device == "gpu" else mx.cpu)
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache as fp16_cache
    if arm is not None:     # the fp16 process does not import our package's caches
        import veloxquant.accelerated.cache as vc
    t_import = time.perf_counter()
    if arm is not None and os.environ.get("VELOXQUANT_BENCH_SLOW_UPDATE"):    # harness.SLOW_UPDATE_ENV
        import harness      # (not otherwise: it imports the arm table, which the timed process does not need)
        harness.slow_update_mutant()
    # tools/bench/arms.py model()'s llama, built here so that the fp16 process imports nothing of veloxquant
    from mlx_lm.models import llama
    mx.random.seed(0)
    args = llama.ModelArgs(model_type="llama", num_hidden_layers=layers, rms_norm_eps=1e-5, rope_theta=500000.0,
                           tie_word_embeddings=False, **shape)
    model = llama.Model(args)
    model.set_dtype(mx.float16)
    mx.eval(model.parameters())
    prompt = mx.random.randint(0, args.vocab_size, (context,), key=mx.random.key(7))
    mx.eval(prompt)
    t_model = time.perf_counter()
    cache = fp16_cache(model) if arm is None else vc.make_prompt_cache(model, seed=1, **arm)
    first = None
    for n, _ in enumerate(generate_step(prompt, model, max_tokens=tokens, prompt_cache=cache)):
        if n == 0:
            first = time.perf_counter()
    end = time.perf_counter()
    print(json.dumps({"import_s": t_import - T0, "model_s": t_model - t_import, "first_token_s": first - t_model,
                      "request_s": end - t_model}))


if __name__ == "__main__":
    main(sys.argv[1:])
