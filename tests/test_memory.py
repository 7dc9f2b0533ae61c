"""Memory store, embedders and the embedding cache against real parts: SQLite files, an HTTP server on 127.0.0.1, the local MiniLM model."""
import json
import sqlite3

import numpy as np
import pytest

from uaqmem.config import ConfigError
from uaqmem.memory import (BM25Index, EmbeddingCache, EmbeddingError, HashEmbedder, MemoryItem, MemoryStore,
                           MemoryStoreError, MiniLMEmbedder, OpenAIEmbedder, minilm_model_dir)
from uaqmem.stubs import StubOpenAIServer, hash_embedding


def _items(n, types=("insight",), per_source=1):
    return [MemoryItem(f"m{j}", f"note {j} about topic{j % 13} and entity{j % 7}", types[j % len(types)],
                       source_id=f"s{j // per_source}") for j in range(n)]


# ---- hybrid fusion and selection -------------------------------------------------------------

def test_fusion_matches_hand_computation():
    st = MemoryStore(HashEmbedder(3))
    vec = {"A": [0.6, 0.8, 0.0], "B": [0.0, 1.0, 0.0], "C": [1.0, 0.0, 0.0]}
    text = {"A": "apple pie", "B": "apple tart", "C": "cherry jam"}
    for name in "ABC":
        assert st.add(MemoryItem(name, text[name], "insight", source_id=name), vector=vec[name])
    res = st.search("apple", k=3, query_vector=[1, 0, 0])
    # dense norm: A .6, B 0, C 1; lexical norm: A 1, B 1, C 0  ->  .72, .30, .70
    assert [r[0].id for r in res] == ["A", "C", "B"]
    assert np.allclose([r[1] for r in res], [0.72, 0.70, 0.30], atol=1e-6)
    assert np.allclose([r[2]["dense_norm"] for r in res], [0.6, 1.0, 0.0], atol=1e-6)
    assert [r[2]["lexical_norm"] for r in res] == [1.0, 0.0, 1.0]


def test_weights_change_the_ranking():
    vec = {"A": [0.6, 0.8, 0.0], "C": [1.0, 0.0, 0.0], "B": [0.0, 1.0, 0.0]}
    text = {"A": "apple pie", "C": "cherry jam", "B": "banana bread"}
    order = {}
    for wd, wl in [(1.0, 0.0), (0.0, 1.0)]:
        st = MemoryStore(HashEmbedder(3), dense_weight=wd, lexical_weight=wl)
        for name in vec:
            st.add(MemoryItem(name, text[name], "insight", source_id=name), vector=vec[name])
        order[(wd, wl)] = [r[0].id for r in st.search("apple", k=1, query_vector=[1, 0, 0])]
    assert order == {(1.0, 0.0): ["C"], (0.0, 1.0): ["A"]}


def test_top2_distinct_sources_and_no_threshold():
    st = MemoryStore(HashEmbedder(64))
    st.add_many(_items(30, per_source=5))  # six sources, five items each
    res = st.search("note 3 about topic3 and entity3", k=2)
    assert len(res) == 2 and res[0][0].id == "m3"
    assert res[0][0].source_id != res[1][0].source_id
    same = st.search("note 3 about topic3 and entity3", k=2, distinct_sources=False)
    assert same[0][0].id == "m3"
    # a query sharing nothing with the store still gets two items
    assert len(st.search("xylophone quasar", k=2)) == 2


def test_pool_widens_when_one_source_floods_the_candidates():
    st = MemoryStore(HashEmbedder(32), candidate_pool=4)
    st.add_many([MemoryItem(f"a{j}", f"director film {j}", "insight", source_id="s1") for j in range(40)]
                + [MemoryItem("z", "unrelated river text", "insight", source_id="s2")])
    res = st.search("director film", k=2)
    assert {r[0].source_id for r in res} == {"s1", "s2"}


def test_dedup_and_ids():
    st = MemoryStore(HashEmbedder(16))
    assert st.add(MemoryItem("a", "Refuse when the premise is false.", "insight", source_id="1"))
    assert not st.add(MemoryItem("b", "refuse  when the PREMISE is false.", "insight", source_id="2"))
    assert st.add(MemoryItem("c", "Refuse when the premise is false.", "principle", source_id="2"))
    assert st.add_many([MemoryItem("d", "x y", "insight"), MemoryItem("e", "X  y", "insight")]) == 1
    assert len(st) == 3 and [i.id for i in st.items] == ["a", "c", "d"]
    with pytest.raises(MemoryStoreError, match="'a' is already used"):
        st.add(MemoryItem("a", "different", "insight"))


def test_balanced_selector():
    st = MemoryStore(HashEmbedder(64))
    st.add_many([MemoryItem(f"i{j}", f"insight film director {j}", "insight", source_id=f"s{j}") for j in range(5)]
                + [MemoryItem("w", "workflow river search", "workflow", source_id="s0"),
                   MemoryItem("w2", "workflow film director lookup", "workflow", source_id="s7")])
    assert [r[0].type for r in st.search("insight film director", k=2)] == ["insight", "insight"]
    bal = st.select_balanced("insight film director", types=("insight", "workflow"), k=2)
    assert sorted(r[0].type for r in bal) == ["insight", "workflow"]
    assert len({r[0].source_id for r in bal}) == 2
    assert [r[0].type for r in st.select_balanced("film", types=("insight", "success_trace"))] == ["insight", "insight"]
    assert st.select_balanced("film", types=("principle", "success_trace")) == []


def test_type_filter_on_large_store_with_approximate_index():
    rng = np.random.default_rng(1)
    n, d = 6000, 32
    V = rng.standard_normal((n, d)).astype(np.float32)
    items = _items(n, types=("insight", "insight", "insight", "workflow"))
    st = MemoryStore(HashEmbedder(d), index="ivf", min_train=2000, index_options={"nprobe": 16})
    assert st.add_many(items, vectors=V) == n
    for j in (3, 7, 11):  # workflow items
        q = V[j] + 0.05 * rng.standard_normal(d).astype(np.float32)
        res = st.search(items[j].content, k=2, types="workflow", query_vector=q)
        assert res[0][0].id == items[j].id and all(r[0].type == "workflow" for r in res)


def test_ivf_recall_against_exact():
    rng = np.random.default_rng(2)
    n, d = 20000, 32
    topics = rng.standard_normal((200, d)).astype(np.float32)  # embeddings have topic structure; uniform noise is IVF's worst case
    V = topics[rng.integers(0, 200, n)] + 0.7 * rng.standard_normal((n, d)).astype(np.float32)
    items = _items(n)
    ivf = MemoryStore(HashEmbedder(d), index="ivf", min_train=1000)
    ivf.add_many(items, vectors=V)
    hits = 0
    for j in rng.choice(n, 40, replace=False):
        q = V[j] + 0.1 * rng.standard_normal(d).astype(np.float32)
        a = {r[0].id for r in ivf.search(items[j].content, query_vector=q)}
        e = {r[0].id for r in ivf.search(items[j].content, query_vector=q, exact=True)}
        hits += len(a & e)
    assert hits / 80 >= 0.9


def test_bm25_sparse_scores_match_library():
    rng = np.random.default_rng(3)
    words = [f"w{j}" for j in range(60)] + ["the", "of"]
    texts = [" ".join(rng.choice(words, size=rng.integers(1, 9))) for _ in range(500)]
    bi = BM25Index(texts)
    for _ in range(20):
        q = " ".join(rng.choice(words, size=3))
        ids, sc = bi.query(q)
        full = bi.bm25.get_scores_from_ids(bi.token_ids(q)) if bi.token_ids(q) else np.zeros(500)
        assert np.allclose(BM25Index.lookup(ids, sc, np.arange(500)), full, atol=1e-5)


# ---- persistence ------------------------------------------------------------------------------

def test_save_load_round_trip(tmp_path):
    st = MemoryStore(HashEmbedder(32), dense_weight=0.6, lexical_weight=0.4, candidate_pool=16)
    st.add_many(_items(50, types=("insight", "workflow"), per_source=2))
    st.save(tmp_path / "mem")
    assert sorted(p.name for p in (tmp_path / "mem").iterdir()) == ["config.json", "items.jsonl", "vectors.npy"]
    back = MemoryStore.load(tmp_path / "mem", HashEmbedder(32))
    assert back.items == st.items and len(back) == 50
    assert (back.dense_weight, back.lexical_weight, back.candidate_pool) == (0.6, 0.4, 16)
    q = "note 9 about topic9"
    assert [(r[0].id, round(r[1], 6)) for r in back.search(q)] == [(r[0].id, round(r[1], 6)) for r in st.search(q)]
    assert not back.add(st.items[0])  # dedup state is restored too


def test_load_errors_name_the_file(tmp_path):
    st = MemoryStore(HashEmbedder(8))
    st.add_many(_items(3))
    d = st.save(tmp_path / "m")
    with pytest.raises(MemoryStoreError, match="hash-8"):
        MemoryStore.load(d, HashEmbedder(16))
    lines = (d / "items.jsonl").read_text().splitlines()
    (d / "items.jsonl").write_text(lines[0] + "\n" + json.dumps({"id": "x", "content": "c"}) + "\n" + lines[2] + "\n")
    with pytest.raises(MemoryStoreError, match=r"items.jsonl line 2: .*'type'"):
        MemoryStore.load(d, HashEmbedder(8))
    (d / "vectors.npy").unlink()
    with pytest.raises(MemoryStoreError, match="vectors.npy: missing"):
        MemoryStore.load(d, HashEmbedder(8))


# ---- embedders ---------------------------------------------------------------------------------

def test_embedding_cache_sqlite(tmp_path):
    inner = HashEmbedder(16)
    cache = EmbeddingCache(inner, tmp_path / "emb.sqlite")
    a = cache.embed(["one", "two"])
    b = cache.embed(["two", "one", "three"])
    assert inner.calls == 2 and inner.texts_embedded == 3
    assert np.array_equal(b[:2], a[::-1])
    cache.close()
    rows = sqlite3.connect(tmp_path / "emb.sqlite").execute("SELECT model, dim FROM embeddings").fetchall()
    assert rows == [("hash-16", 16)] * 3


def test_openai_embedder_over_http(monkeypatch):
    monkeypatch.setenv("UAQMEM_TEST_EMBED_KEY", "sk-test-embed-123456")
    with StubOpenAIServer(embed_dim=24) as srv:
        emb = OpenAIEmbedder({"name": "stub-embed", "model": "qwen3-embedding-stub", "base_url": srv.base_url,
                              "api_key_env": "UAQMEM_TEST_EMBED_KEY", "batch_size": 2, "max_retries": 0})
        texts = ["a", "bb", "ccc", "dddd", "eeeee"]
        v = emb.embed(texts)
        posts = [e for e in srv.log if e["path"] == "/v1/embeddings"]
    assert v.shape == (5, 24) and v.dtype == np.float32
    expected = np.array([hash_embedding(t, 24) for t in texts], dtype=np.float32)
    assert np.allclose(v, expected, atol=1e-6)
    assert len(posts) == 3 and [p["json"]["input"] for p in posts] == [["a", "bb"], ["ccc", "dddd"], ["eeeee"]]
    assert all(p["json"]["model"] == "qwen3-embedding-stub" for p in posts)
    assert emb.model_id == "openai:qwen3-embedding-stub" and emb.dim == 24


def test_openai_embedder_in_a_store_with_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("UAQMEM_TEST_EMBED_KEY", "sk-test-embed-123456")
    with StubOpenAIServer(embed_dim=16) as srv:
        prof = {"name": "stub-embed", "model": "m", "base_url": srv.base_url, "api_key_env": "UAQMEM_TEST_EMBED_KEY", "max_retries": 0}
        cached = EmbeddingCache(OpenAIEmbedder(prof), tmp_path / "c.sqlite")
        st = MemoryStore(cached)
        st.add_many(_items(10))
        st.search("note 1")
        n_posts = sum(e["path"] == "/v1/embeddings" for e in srv.log)
        st2 = MemoryStore(EmbeddingCache(OpenAIEmbedder(prof), tmp_path / "c.sqlite"))
        st2.add_many(_items(10))
        st2.search("note 1")
        assert sum(e["path"] == "/v1/embeddings" for e in srv.log) == n_posts  # all from SQLite


def test_openai_embedder_missing_key_names_profile_and_variable(monkeypatch):
    monkeypatch.delenv("UAQMEM_NO_SUCH_KEY", raising=False)
    with pytest.raises(ConfigError, match=r"'qwen3-embedding-8b'.*UAQMEM_NO_SUCH_KEY"):
        OpenAIEmbedder({"name": "qwen3-embedding-8b", "model": "Qwen/Qwen3-Embedding-8B",
                        "base_url": "http://127.0.0.1:9/v1", "api_key_env": "UAQMEM_NO_SUCH_KEY"})
    with pytest.raises(ConfigError, match="'model' is required"):
        OpenAIEmbedder({"name": "nomodel", "base_url": "http://127.0.0.1:9/v1"})


def test_openai_embedder_wrong_count_is_an_error(monkeypatch):
    # a server that drops the last embedding: the client must not silently mis-align vectors
    import http.server
    import threading

    class Short(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            data = [{"object": "embedding", "index": i, "embedding": [1.0, 0.0]} for i, _ in enumerate(body["input"][:-1])]
            out = json.dumps({"object": "list", "data": data, "model": "m", "usage": {"prompt_tokens": 1, "total_tokens": 1}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Short)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        emb = OpenAIEmbedder({"name": "short", "model": "m", "base_url": f"http://127.0.0.1:{srv.server_address[1]}/v1", "max_retries": 0})
        with pytest.raises(EmbeddingError, match="asked for 3 embeddings, got 2"):
            emb.embed(["a", "b", "c"])
    finally:
        srv.shutdown()
        srv.server_close()


# ---- the real local model ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def minilm():
    return MiniLMEmbedder()


@pytest.mark.slow
def test_minilm_offline_embeddings(minilm, monkeypatch):
    assert (minilm_model_dir() / "model.safetensors").exists()
    e = minilm.embed(["Who directed the film Jaws?", "Which person was the director of the movie Jaws?",
                      "The recipe needs two cups of flour.", "Bake the bread with flour and yeast."])
    assert e.shape == (4, 384) and np.allclose(np.linalg.norm(e, axis=1), 1, atol=1e-5)
    assert e[0] @ e[1] > e[0] @ e[2] + 0.2
    assert e[2] @ e[3] > e[2] @ e[0]


@pytest.mark.slow
def test_minilm_cache_second_embed_makes_no_model_call(minilm, tmp_path):
    cache = EmbeddingCache(minilm, tmp_path / "emb.sqlite")
    texts = ["Search the film title first.", "Refuse if the premise is false."]
    before = minilm.calls
    a = cache.embed(texts)
    assert minilm.calls == before + 1
    b = cache.embed(texts)
    assert minilm.calls == before + 1 and cache.hits == 2
    assert np.array_equal(a, b)
    fresh = EmbeddingCache(minilm, tmp_path / "emb.sqlite")  # a new handle reads the file
    assert np.array_equal(fresh.embed(texts[::-1]), a[::-1]) and minilm.calls == before + 1


@pytest.mark.slow
def test_minilm_store_retrieves_paraphrase(minilm):
    st = MemoryStore(minilm)
    st.add_many([MemoryItem("film", "To find who directed a film, search the film's title and read its infobox.", "insight", source_id="1"),
                 MemoryItem("cake", "For baking questions, check the ingredient list of the recipe.", "insight", source_id="2"),
                 MemoryItem("uaq", "If the question assumes something false, say the premise is wrong and refuse.", "principle", source_id="3")])
    assert st.search("Which person was the director of this movie?", k=1)[0][0].id == "film"
    assert st.search("The question is built on a false assumption", k=1)[0][0].id == "uaq"
