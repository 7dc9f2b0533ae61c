"""Memory store speed: top-2 hybrid query latency at 1e3, 1e5 and 1e6 items, insertion rate, approximate-index recall,
and the same query done naively (every item re-scored in Python) at 1e5.

Data: random unit vectors (384-d, MiniLM's size) with topic structure (each is 0.6 x one of n/100 random topic
directions + 0.8 x a random direction, renormalised, so items of a topic are mildly similar as real embeddings are;
uniform random vectors are also measured at 1e5 as the approximate index's worst case) and synthetic short texts (8-12 words drawn from a 30,000-word
vocabulary with a Zipf-like law, so a few words are common and most are rare). A query is a stored item's vector plus
noise (cosine ~0.9 to it) and half of its words plus two random ones, as a real question is near some memories.
Embedding time is excluded (vectors are passed in): this measures the store, not the model.

Lexical candidates at 1e6: bm25s builds a token -> documents matrix of precomputed term scores; a query reads only the
posting lists of its own terms (cost ~ postings touched, not store size), then takes the top `pool` of those documents.
Dense candidates at 1e6 come from the store's `ivfpq` index (inverted lists of 4-bit PQ codes scanned with FAISS fast
scan, best candidates re-ranked on the exact vectors); plain `ivf` (uncompressed lists) is measured beside it for the
comparison (HNSW takes minutes per 1e5 vectors to build on 2 cores).
Recall@2 = overlap of the approximate store's top-2 with the top-2 from exact dense scanning of the same store.
At approximate sizes the number of IVF lists scanned (nprobe) is swept to show the latency/recall trade-off.
Queries run with one FAISS thread (single-query latency); building uses all cores.

Usage: python benchmarks/bench_memory.py [--sizes 1000,100000,1000000] [--queries 200]
Ends with one JSON line.
"""
import argparse
import gc
import json
import math
import re
import time
from collections import Counter

import faiss
import numpy as np

from uaqmem.memory import HashEmbedder, MemoryItem, MemoryStore

DIM = 384
BUILD_THREADS = faiss.omp_get_max_threads()
VOCAB = 30000


def make_texts(rng, n):
    ranks = np.arange(VOCAB)
    p = 1.0 / (ranks + 50.0)
    p /= p.sum()
    words = np.array([f"tok{r}" for r in ranks])
    lens = rng.integers(8, 13, size=n)
    draws = rng.choice(VOCAB, size=(n, 12), p=p)
    return [" ".join(words[draws[i, :lens[i]]]) for i in range(n)], words


def make_vectors(rng, n, clustered=True, chunk=100_000):
    "Unit vectors; clustered: a random unit topic direction (one per ~100 items) mixed with a random unit direction."
    V = np.empty((n, DIM), dtype=np.float32)
    n_topics = max(1, n // 100)
    topics = rng.standard_normal((n_topics, DIM), dtype=np.float32)
    topics /= np.linalg.norm(topics, axis=1, keepdims=True)
    for s in range(0, n, chunk):
        x = rng.standard_normal((min(chunk, n - s), DIM), dtype=np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        if clustered:  # topic mates have cosine ~0.36 with each other
            x = 0.6 * topics[rng.integers(0, n_topics, len(x))] + 0.8 * x
        V[s:s + len(x)] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return V


def make_queries(rng, texts, V, words, nq):
    js = rng.choice(len(texts), nq, replace=False)
    qs = []
    for j in js:
        w = texts[j].split()
        keep = list(rng.choice(w, size=max(1, len(w) // 2), replace=False)) + list(rng.choice(words, 2))
        v = V[j] + rng.standard_normal(DIM).astype(np.float32) * (0.5 / math.sqrt(DIM))
        qs.append((" ".join(keep), v / np.linalg.norm(v)))
    return qs


def timed_queries(store, queries, **kw):
    out, lat = [], []
    for text, v in queries:
        t = time.perf_counter()
        out.append(store.search(text, k=2, query_vector=v, **kw))
        lat.append(time.perf_counter() - t)
    return out, lat


def naive_search(items, V, token_lists, df, avgdl, query, qv, k=2, k1=1.5, b=0.75):
    "Every item re-scored in a Python loop: cosine and BM25 per item, min-max over all, fuse, distinct sources."
    n = len(items)
    qtoks = [t for t in re.findall(r"\w\w+", query.lower()) if t in df]
    dense, lex = [], []
    for i in range(n):
        dense.append(float(np.dot(V[i], qv)))
        tf = token_lists[i]
        dl = sum(tf.values())
        s = 0.0
        for t in qtoks:
            f = tf.get(t, 0)
            if f:
                idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
                s += idf * f / (f + k1 * (1 - b + b * dl / avgdl))
        lex.append(s)
    def mm(x):
        lo, hi = min(x), max(x)
        return [0.0] * len(x) if hi - lo <= 1e-12 else [(v - lo) / (hi - lo) for v in x]
    dn, ln = mm(dense), mm(lex)
    fused = sorted(((0.7 * a + 0.3 * c, i) for i, (a, c) in enumerate(zip(dn, ln))), key=lambda t: (-t[0], t[1]))
    chosen, used = [], set()
    for s, i in fused:
        if items[i].source_id not in used:
            chosen.append((items[i], s)); used.add(items[i].source_id)
        if len(chosen) == k:
            break
    return chosen


def p50_ms(lat):
    return float(np.median(lat) * 1e3)


def run_size(n, nq, rng, results, naive=False, clustered=True):
    print(f"\n== {n:,} items" + ("" if clustered else " (uniform random vectors: worst case for the approximate index)"))
    t = time.perf_counter()
    texts, words = make_texts(rng, n)
    V = make_vectors(rng, n, clustered)
    # source ids: ~3 items per training sample, as memory methods write a few items per episode
    items = [MemoryItem(f"m{i}", texts[i], "insight" if i % 2 else "workflow", source_id=f"s{i // 3}") for i in range(n)]
    print(f"  data: {time.perf_counter() - t:.1f}s")
    queries = make_queries(rng, texts, V, words, nq)
    kinds = ["exact"] if n <= 1000 else (["exact", "ivf", "ivfpq"] if n <= 100_000 and clustered else ["ivf", "ivfpq"])
    row = {}
    for kind in kinds:
        store = MemoryStore(HashEmbedder(DIM), index=kind)
        faiss.omp_set_num_threads(BUILD_THREADS)
        t = time.perf_counter()
        added = store.add_many(items, vectors=V)
        t_add = time.perf_counter() - t
        t = time.perf_counter()
        store.build_indexes()
        t_build = time.perf_counter() - t
        faiss.omp_set_num_threads(1)
        store.search(queries[0][0], query_vector=queries[0][1])  # warm-up
        res, lat = timed_queries(store, queries)
        r = {"insert_items_per_s": round(added / t_add), "index_build_s": round(t_build, 1),
             "query_p50_ms": round(p50_ms(lat), 3), "query_p95_ms": round(float(np.percentile(lat, 95) * 1e3), 3)}
        if kind != "exact":
            nr = min(nq, 200)
            ref, lat_ex = timed_queries(store, queries[:nr], exact=True)
            def recall(got):
                return round(sum(len({a[0].id for a in x} & {b[0].id for b in y}) for x, y in zip(got, ref)) / (2 * nr), 4)
            r["recall_at_2_vs_exact"] = recall(res[:nr])
            r["exact_scan_p50_ms"] = round(p50_ms(lat_ex), 3)
            index = store._dense_index()
            if index is not None:  # latency/recall trade-off of the IVF lists scanned
                index = faiss.extract_index_ivf(index)
                default, sweep = index.nprobe, {}
                for nprobe in ((16, 32, 64, 128) if kind == "ivf" else (64, 128, 256, 512)):
                    if nprobe > index.nlist:
                        continue
                    index.nprobe = nprobe
                    got, lat_s = timed_queries(store, queries[:nr])
                    sweep[str(nprobe)] = {"query_p50_ms": round(p50_ms(lat_s), 3), "recall_at_2_vs_exact": recall(got)}
                    print(f"    nprobe {nprobe}: p50 {sweep[str(nprobe)]['query_p50_ms']:.2f} ms, recall@2 {sweep[str(nprobe)]['recall_at_2_vs_exact']:.3f}")
                index.nprobe = default
                r["nprobe_default"], r["nprobe_sweep"] = default, sweep
                ok = [int(k) for k, v in sweep.items() if v["recall_at_2_vs_exact"] >= 0.95]
                r["smallest_nprobe_with_recall_0.95"] = min(ok) if ok else None
        print(f"  {kind}: insert {r['insert_items_per_s']:,}/s, index build {t_build:.1f}s, "
              f"query p50 {r['query_p50_ms']:.2f} ms p95 {r['query_p95_ms']:.2f} ms"
              + (f", recall@2 {r['recall_at_2_vs_exact']:.3f} (exact scan p50 {r['exact_scan_p50_ms']:.1f} ms)" if kind != "exact" else ""))
        row[kind] = r
        if naive and kind == "exact":
            token_lists = [Counter(re.findall(r"\w\w+", s.lower())) for s in texts]
            df = Counter(t for c in token_lists for t in c)
            avgdl = sum(sum(c.values()) for c in token_lists) / n
            nlat, agree = [], 0
            for (text, v), fast in zip(queries[:5], res[:5]):
                t = time.perf_counter()
                slow = naive_search(items, V, token_lists, df, avgdl, text, v)
                nlat.append(time.perf_counter() - t)
                agree += slow[0][0].id == fast[0][0].id
            row["naive_python_p50_ms"] = round(p50_ms(nlat), 1)
            row["naive_over_store_ratio"] = round(p50_ms(nlat) / r["query_p50_ms"], 1)
            row["naive_top1_agrees"] = f"{agree}/5"
            print(f"  naive Python re-scoring: p50 {row['naive_python_p50_ms']:.0f} ms "
                  f"= {row['naive_over_store_ratio']:.0f}x the store (top-1 agrees {agree}/5)")
        del store
        gc.collect()
    results[str(n) if clustered else f"{n}_uniform"] = row
    del V, items, texts
    gc.collect()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,100000,1000000")
    ap.add_argument("--queries", type=int, default=200)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    results = {}
    t0 = time.perf_counter()
    for n in [int(float(s)) for s in a.sizes.split(",")]:
        run_size(n, a.queries, rng, results, naive=(n == 100_000))
        if n == 100_000:
            run_size(n, a.queries, rng, results, clustered=False)
    big = results.get("1000000", {}).get("ivfpq")
    headline = None if big is None else {"items": 1_000_000, "index": "ivfpq", "query_p50_ms": big["query_p50_ms"],
                                         "recall_at_2_vs_exact": big["recall_at_2_vs_exact"],
                                         "meets_target": big["query_p50_ms"] <= 5.0 and big["recall_at_2_vs_exact"] >= 0.95}
    summary = {"bench": "memory", "dim": DIM, "queries": a.queries, "headline": headline, "sizes": results,
               "target": {"query_p50_ms_max": 5.0, "recall_at_2_min": 0.95}, "total_s": round(time.perf_counter() - t0, 1)}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
