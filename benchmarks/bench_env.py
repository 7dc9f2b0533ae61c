"""Offline Wikipedia environment: index build time and Search/Lookup latency on the full corpus.

Builds the index of `<data>/wiki/pages.jsonl.gz` into a fresh temporary folder (the shared cache is untouched), then times
1,000 `Search[...]` steps (half exact page titles, half main-entity guesses from the paper's questions, which mostly fall
through to the full-text candidates) and 1,000 `Lookup[...]` steps (words of the questions, on a page reached by Search).
Also times the raw full-text `search` on whole question texts, the worst case for the candidate query.
Target: Search p50 <= 5 ms. Ends with one JSON line.
"""
import json
import random
import re
import statistics
import tempfile
import time

from uaqmem.data import SPLITS, load_split
from uaqmem.wiki import OfflineStore, WikiEnv, default_corpus, entity_candidates

N = 1000


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def summary(name, secs):
    ms = [s * 1e3 for s in secs]
    out = {f"{name}_p50_ms": round(pct(ms, 0.5), 3), f"{name}_p95_ms": round(pct(ms, 0.95), 3), f"{name}_mean_ms": round(statistics.mean(ms), 3)}
    print(f"{name:>22}: n={len(ms)}  p50 {out[f'{name}_p50_ms']:.3f} ms  p95 {out[f'{name}_p95_ms']:.3f} ms  mean {out[f'{name}_mean_ms']:.3f} ms")
    return out


def main():
    rng = random.Random(0)
    questions = [q.question for n in SPLITS for q in load_split(n)]
    with tempfile.TemporaryDirectory() as td:
        t0 = time.perf_counter()
        store = OfflineStore(default_corpus(), index_dir=td)
        build_s = time.perf_counter() - t0
        assert store.built
        size_mb = store.index_path.stat().st_size / 1e6
        print(f"index build: {build_s:.1f} s for {len(store)} pages ({size_mb:.0f} MB)")
        titles = store.titles()

        guesses = [(entity_candidates(q) or [" ".join(q.split()[:4])])[0] for q in questions]
        queries = rng.sample(titles, N // 2) + [rng.choice(guesses) for _ in range(N // 2)]
        rng.shuffle(queries)
        env = WikiEnv(store)
        search_s, hit_s, miss_s = [], [], []
        for q in queries:
            env.reset()
            t = time.perf_counter()
            step = env.step(f"Search[{q}]")
            dt = time.perf_counter() - t
            search_s.append(dt)
            (miss_s if step.observation.startswith("Could not find") else hit_s).append(dt)

        words = [w for q in questions for w in re.findall(r"[A-Za-z]{4,}", q)]
        lookup_s, lookup_found = [], 0
        for _ in range(N):
            env.reset().step(f"Search[{rng.choice(titles)}]")
            kw = rng.choice(words)
            t = time.perf_counter()
            step = env.step(f"Lookup[{kw}]")
            lookup_s.append(time.perf_counter() - t)
            lookup_found += not step.observation.startswith("Keyword [")

        raw_s = []
        for q in rng.sample(questions, 200):
            t = time.perf_counter()
            store.search(q, k=5)
            raw_s.append(time.perf_counter() - t)

        result = {"bench": "env", "pages": len(store), "index_build_s": round(build_s, 2), "index_mb": round(size_mb, 1)}
        result |= summary("search", search_s)
        result |= summary("search_exact_title", hit_s)
        result |= summary("search_candidates", miss_s)
        result |= summary("lookup", lookup_s)
        result |= summary("fulltext_question", raw_s)
        result |= {"search_hits": len(hit_s), "search_misses": len(miss_s), "lookup_found": lookup_found,
                   "search_p50_target_ms": 5.0, "search_p50_within_target": result["search_p50_ms"] <= 5.0}
        store.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
