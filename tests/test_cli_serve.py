"""`veloxquant generate` and `veloxquant serve` (mlx-lm's own commands with our caches) on a tiny random llama
saved to a temporary directory (tools/cli/tiny_model.py): the generate command as a subprocess, the server as a
subprocess on loopback with real HTTP requests (sequential requests sharing a prefix, so mlx-lm's
LRUPromptCache hands a stored cache back, and concurrent ones, so its BatchGenerator batches them).

Oracle: the same model run in this process through mlx-lm's generate_step with our caches (tokens and
log-probabilities, which the server returns); mlx-lm's fp16 cache gives other log-probabilities (checked),
so a server that ignored our caches would fail.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import mlx.core as mx
import pytest

import veloxquant.accelerated.cache as vc
from veloxquant.tools.cli.tiny_model import save_tiny_llama

pytest.importorskip("tokenizers", reason="the saved model's tokenizer needs the tokenizers package")

ROOT = Path(__file__).resolve().parents[1]
KV = dict(method="turboquant", bits=4, window=16)
KV_FLAGS = ["--kv-method", "turboquant", "--kv-bits", "4", "--kv-window", "16"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny") / "model", head_dim=64, layers=2, seed=3)


@pytest.fixture(scope="module")
def loaded(model_dir):
    from mlx_lm import load
    return load(str(model_dir))


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def local_run(loaded, prompt: str, n: int, caches=None, kv=KV):
    from mlx_lm.generate import generate_step
    model, tok = loaded
    caches = vc.make_prompt_cache(model, **kv) if caches is None else caches
    out = list(generate_step(mx.array(tok.encode(prompt)), model, max_tokens=n, prompt_cache=caches))
    return [int(t) for t, _ in out], [float(lp[t]) for t, lp in out]


def test_generate_command(model_dir, loaded):
    from mlx_lm.generate import generate
    import veloxquant.accelerated.cache.serve as serve
    prompt = "Quantized caches keep"
    r = subprocess.run([sys.executable, "-m", "veloxquant.tools.cli", "generate", "--model", str(model_dir), *KV_FLAGS,
                        "--kv-fp16-layers", "1", "0", "--prompt", prompt, "--max-tokens", "12"],
                       capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    assert "[veloxquant] KV cache: keys turboquant (4 bits), values turboquant (4 bits), window 16" in r.stderr
    assert "Generation: 12 tokens" in r.stdout and "tokens-per-sec" in r.stdout
    text = r.stdout.split("==========\n")[1]
    with serve.use(**KV, fp16_layers=(1, 0)):
        want = generate(*loaded, prompt, max_tokens=12)
    assert text.rstrip("\n") == want
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("[veloxquant] KV cache at the end: 33 tokens; 1 of 2 layers compressed"), last
    bad = subprocess.run([sys.executable, "-m", "veloxquant.tools.cli", "generate", "--model", str(model_dir),
                          "--kv-bits", "7", "--prompt", "x"], capture_output=True, text=True, cwd=ROOT, env=_env(),
                         timeout=300)
    assert bad.returncode == 2 and "bits: 7 is not supported" in bad.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(model_dir):
    yield from _serve(model_dir, KV_FLAGS, "server.log")


# no exact window: the server's batches go into one B-row cache (accelerated/cache/batch_shared.py)
KV0 = dict(method="turboquant", bits=4, window=0)
KV0_FLAGS = ["--kv-method", "turboquant", "--kv-bits", "4", "--kv-window", "0"]
# log-probabilities of a B-row batch against single runs: the rows' splits differ from a single sequence's, so the
# logits can differ in the last bits; two float16 rounding steps at magnitudes up to 8 (tests/test_batch_shared.py)
LOGPROB_ATOL = 2.0 ** -6


@pytest.fixture(scope="module")
def server_shared(model_dir):
    yield from _serve(model_dir, KV0_FLAGS, "server-shared.log")


def _serve(model_dir, flags, log_name):
    port = _free_port()
    log = open(model_dir.parent / log_name, "w+")
    proc = subprocess.Popen([sys.executable, "-m", "veloxquant.tools.cli", "serve", "--model", str(model_dir), *flags,
                             "--host", "127.0.0.1", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                            cwd=ROOT, env=_env())
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(url + "/v1/models", timeout=5).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    pytest.fail(f"server did not start:\n{log.read()}")
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def complete(url: str, prompt: str, n: int) -> dict:
    body = json.dumps({"prompt": prompt, "max_tokens": n, "temperature": 0, "logprobs": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=300).read())


def tokens_and_logprobs(resp: dict):
    content = resp["choices"][0]["logprobs"]["content"]
    return [c["id"] for c in content], [c["logprob"] for c in content]


def test_server_serves_with_our_caches_and_reuses_prompt_caches(server, loaded):
    from mlx_lm.models import cache as mlx_cache
    first = "The quick brown fox jumps over"
    second = first + " the lazy dog"
    a = complete(server, first, 6)
    assert a["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert tokens_and_logprobs(a) == local_run(loaded, first, 6)
    fp16 = local_run(loaded, first, 6, caches=mlx_cache.make_prompt_cache(loaded[0]))
    assert tokens_and_logprobs(a)[1] != fp16[1], "our cache and fp16 agree: the check cannot tell them apart"
    b = complete(server, second, 6)
    # the first request's cache (prompt + generated tokens) was fetched and trimmed back to the shared prefix
    assert b["usage"]["prompt_tokens_details"]["cached_tokens"] == len(first)
    # the same locally: the first run's cache trimmed to the prefix (a trim past the exact window decodes
    # tokens, so with mlx-lm 0.32's trim this can differ from a fresh run of the whole second prompt)
    caches = vc.make_prompt_cache(loaded[0], **KV)
    local_run(loaded, first, 6, caches)
    mlx_cache.trim_prompt_cache(caches, caches[0].offset - len(first))
    want = local_run(loaded, second[len(first):], 6, caches)
    assert tokens_and_logprobs(b) == want


CONCURRENT = ["Concurrent one", "A second, longer concurrent request", "3"]


def complete_all(url: str, prompts: list[str], n: int) -> list[dict]:
    """The prompts' completions, requested at once from threads (so the server's BatchGenerator batches them)."""
    results = {}

    def go(i, p):
        results[i] = complete(url, p, n)
    threads = [threading.Thread(target=go, args=(i, p)) for i, p in enumerate(prompts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return [results[i] for i in range(len(prompts))]


def test_server_batches_concurrent_requests(server, loaded):
    for p, resp in zip(CONCURRENT, complete_all(server, CONCURRENT, 5)):
        assert tokens_and_logprobs(resp) == local_run(loaded, p, 5), p


def test_server_batches_concurrent_requests_in_one_b_row_cache(server_shared, loaded):
    """Without an exact window the server's batch is one B-row cache: each request's greedy tokens are its local
    single-sequence run's, log-probabilities within LOGPROB_ATOL."""
    for p, resp in zip(CONCURRENT, complete_all(server_shared, CONCURRENT, 5)):
        got, want = tokens_and_logprobs(resp), local_run(loaded, p, 5, kv=KV0)
        assert got[0] == want[0], p
        assert max(abs(a - b) for a, b in zip(got[1], want[1])) <= LOGPROB_ATOL, (p, got[1], want[1])
    # a later request sharing a prefix: the server's LRUPromptCache hands back a cache extracted from the batch
    # (its bytes are the sequence's own: per-token records, no window), trimmed to the prefix
    later = CONCURRENT[1] + " and its continuation"
    resp = complete(server_shared, later, 5)
    assert resp["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, resp["usage"]
    got, want = tokens_and_logprobs(resp), local_run(loaded, later, 5, kv=KV0)
    assert got[0] == want[0] and max(abs(a - b) for a, b in zip(got[1], want[1])) <= LOGPROB_ATOL, (got, want)


def test_server_sequential_path_uses_our_caches(server, loaded):
    """A request with a seed is not batchable in mlx-lm 0.32's server: it is served by stream_generate with a
    cache from the server module's own make_prompt_cache."""
    body = json.dumps({"prompt": "Seeded request", "max_tokens": 5, "temperature": 0, "logprobs": True,
                       "seed": 1}).encode()
    req = urllib.request.Request(server + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    resp = json.loads(urllib.request.urlopen(req, timeout=300).read())
    assert tokens_and_logprobs(resp) == local_run(loaded, "Seeded request", 5)
