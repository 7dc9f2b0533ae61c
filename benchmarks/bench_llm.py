"""Throughput of uaqmem.llm.

1. Concurrency: N chat calls against the OpenAI stub server with a fixed per-request latency, sequentially and
   from a thread pool, through the real `openai` SDK path (cache off). Target: sequential / pooled time >= 12
   for 64 calls at 200 ms with 16 threads.
2. Overhead on the local model: generated tokens/s through `get_llm("local-0.5b", cache=False)` versus the same
   llama-server driven directly with a raw HTTP POST (no uaqmem code in the request path), same prompt and
   settings, runs interleaved. Target ratio >= 0.9. Skipped with --no-local (reported as null).

Prints figures, then one JSON line.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from uaqmem.llm import get_llm
from uaqmem.stubs import StubOpenAIServer


def bench_concurrency(calls: int, latency_s: float, threads: int) -> dict:
    with StubOpenAIServer(reply="a short stub answer", latency_s=latency_s) as srv:
        llm = get_llm({"name": "bench-stub", "backend": "openai", "model": "stub-model", "base_url": srv.base_url,
                       "max_concurrency": threads, "max_retries": 0}, cache=False)
        llm.chat([{"role": "user", "content": "warm-up"}])  # client construction and connection set-up

        def one(i):
            return llm.chat([{"role": "user", "content": f"question {i}"}])
        t0 = time.perf_counter()
        for i in range(calls):
            one(i)
        seq = time.perf_counter() - t0
        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            results = list(pool.map(one, range(calls)))
        par = time.perf_counter() - t0
        assert len(results) == calls and srv.calls == 2 * calls + 1
    out = {"calls": calls, "latency_s": latency_s, "threads": threads, "sequential_s": round(seq, 3),
           "pooled_s": round(par, 3), "speedup": round(seq / par, 2), "ideal_speedup": min(threads, calls)}
    print(f"stub: {calls} calls at {latency_s * 1000:.0f} ms: sequential {seq:.2f} s, {threads} threads {par:.2f} s, "
          f"speedup {seq / par:.1f}x (target >= 12)")
    return out


def _direct_post(url: str, body: dict) -> tuple[int, float]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        data = json.loads(r.read())
    return int(data["usage"]["completion_tokens"]), time.perf_counter() - t0


def bench_local(reps: int, max_tokens: int) -> dict:
    from uaqmem.local import shared_server
    llm = get_llm("local-0.5b", cache=False)
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Explain in detail, step by step, how a hash table handles collisions."}]
    llm.chat(messages, max_tokens=8)  # starts the server (assembling/building on first use) and warms it
    srv = shared_server(llm.profile["local_model"])
    url = srv.base_url + "/chat/completions"
    body = {"model": llm.model, "messages": messages, "temperature": 0.0, "max_tokens": max_tokens, "cache_prompt": False}
    _direct_post(url, {**body, "max_tokens": 8})
    via_tok = via_s = raw_tok = raw_s = 0.0
    for _ in range(reps):  # interleaved, so drift in machine load hits both sides alike
        n, s = _direct_post(url, body)
        raw_tok, raw_s = raw_tok + n, raw_s + s
        r = llm.chat(messages, max_tokens=max_tokens)
        via_tok, via_s = via_tok + r.completion_tokens, via_s + r.latency_s
    via, raw = via_tok / via_s, raw_tok / raw_s
    print(f"local-0.5b: {via:.1f} tok/s through uaqmem, {raw:.1f} tok/s direct, ratio {via / raw:.3f} (target >= 0.9)")
    return {"reps": reps, "max_tokens": max_tokens, "uaqmem_tok_s": round(via, 2), "direct_tok_s": round(raw, 2),
            "ratio": round(via / raw, 3), "tokens_per_call": via_tok / reps}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=64)
    ap.add_argument("--latency", type=float, default=0.2, help="stub latency per request, seconds")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--no-local", action="store_true", help="skip the local-model comparison")
    ap.add_argument("--local-reps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    conc = bench_concurrency(args.calls, args.latency, args.threads)
    local = None if args.no_local else bench_local(args.local_reps, args.max_tokens)
    print(json.dumps({"bench": "llm", "stub_concurrency": conc, "stub_speedup": conc["speedup"],
                      "local": local, "local_ratio": local["ratio"] if local else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
