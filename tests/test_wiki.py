"""uaqmem.wiki against real parts: a SQLite FTS5 index on disk, concurrent builder processes,
and a stub MediaWiki API served by http.server on 127.0.0.1 (redirects, 503s, stalls, outages)."""
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from uaqmem.wiki import (LiveStore, OfflineStore, Page, RecordingStore, ReplayMissError, ReplayStore, WikiEnv, WikiError,
                         collapse_ws, fixture_pages, write_corpus)


# ---------------------------------------------------------------- offline store

@pytest.fixture()
def corpus(tmp_path):
    return write_corpus(tmp_path / "pages.jsonl.gz", fixture_pages())


def test_offline_env_behaviours(corpus, tmp_path):
    store = OfflineStore(corpus, index_dir=tmp_path / "idx")
    env = WikiEnv(store, max_steps=20).reset()
    s = env.step("Lookup[born]")
    assert s.kind == "lookup" and s.observation.startswith("No current page")
    s = env.step("Search[barack_obama]")
    text = collapse_ws(store.get("Barack Obama").text)
    assert s.observation == text[:1200] and env.page.title == "Barack Obama"
    s = env.step("Search[Obama]")  # a redirect row in the corpus
    assert s.observation == text[:1200]
    s = env.step("Search[Hitchcock film]")
    assert s.observation.startswith("Could not find [Hitchcock film]. Similar: [")
    assert set(json.loads(s.observation.split("Similar: ")[1][:-1])) == {"Alfred Hitchcock", "Vertigo (film)"}
    s = env.step("Search[zzqqxx]")
    assert "No page found" in s.observation
    s = env.step("Lookup[hawaii]")
    i = text.lower().find("hawaii")
    assert s.observation == text[max(0, i + 3 - 1000): i + 3 + 1000] and len(s.observation) == 2000
    assert env.step("Lookup[Kenya]").observation == "Keyword [Kenya] not found on page [Barack Obama]."
    s = env.step("Finish[ok")  # no closing bracket: invalid, still a step
    assert (s.kind, s.valid, env.steps) == ("invalid", False, 8)
    for q in ['"', "AND", "a OR b NOT c", "NEAR(x y, 2)", "col:x", "x*", "東京", "\x00", "ß" * 10000]:
        assert env.step(f"Search[{q}]").valid
    assert env.steps == 17
    s = env.step("Finish[Honolulu]")
    assert (s.done, s.answer, s.kind) == (True, "Honolulu", "finish")


def test_step_limit(corpus, tmp_path):
    env = WikiEnv(OfflineStore(corpus, index_dir=tmp_path / "idx"), max_steps=2).reset()
    assert env.step("Search[Honolulu]").valid and env.step("Lookup[capital]").valid
    s = env.step("Search[Honolulu]")  # over max_steps: only Finish is accepted now
    assert (s.kind, s.valid) == ("invalid", False) and "Step limit of 2" in s.observation
    assert env.step("Finish[x]").done and env.steps == 4
    with pytest.raises(RuntimeError, match="reset"):
        env.step("Search[Honolulu]")


def test_lookup_all_windows(corpus, tmp_path):
    store = OfflineStore(corpus, index_dir=tmp_path / "idx")
    env = WikiEnv(store, lookup_all=True, lookup_window=100).reset()
    env.step("Search[Barack Obama]")
    obs = env.step("Lookup[OBAMA]").observation
    assert obs.count("(Occurrence ") == 3 and "(Occurrence 3/3)" in obs
    first = WikiEnv(store, lookup_window=100).reset()
    first.step("Search[Barack Obama]")
    assert first.step("Lookup[OBAMA]").observation in obs


def test_index_reused_until_corpus_changes(corpus, tmp_path):
    idx = tmp_path / "idx"
    a = OfflineStore(corpus, index_dir=idx)
    assert a.built and a.get("Honolulu") is not None
    mtime = a.index_path.stat().st_mtime_ns
    b = OfflineStore(corpus, index_dir=idx)
    assert not b.built and b.index_path.stat().st_mtime_ns == mtime
    time.sleep(0.01)
    write_corpus(corpus, fixture_pages() + [Page("Kona", "Kona is a district on the Big Island.")])
    c = OfflineStore(corpus, index_dir=idx)
    assert c.built and len(c) == 7 and c.get("Kona").text.startswith("Kona is")
    assert a.get("Kona") is None  # an open reader keeps the index it opened
    assert not OfflineStore(corpus, index_dir=idx).built


def test_concurrent_processes_build_once(corpus, tmp_path):
    code = ("import sys, json; from uaqmem.wiki import OfflineStore; "
            "s = OfflineStore(sys.argv[1], index_dir=sys.argv[2]); print(json.dumps([s.built, s.get('Honolulu').title]))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(corpus), str(tmp_path / "idx")], stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert [o[1] for o in outs] == ["Honolulu"] * 3
    assert sum(o[0] for o in outs) == 1


def test_threads_share_a_store(corpus, tmp_path):
    store = OfflineStore(corpus, index_dir=tmp_path / "idx")
    errors, results = [], []
    def work():
        try:
            for _ in range(50):
                results.append((store.get("Zürich").title, tuple(store.search("Hitchcock"))))
        except Exception as e:  # recorded, then asserted on
            errors.append(e)
    threads = [threading.Thread(target=work) for _ in range(4)]
    [t.start() for t in threads]; [t.join() for t in threads]
    assert not errors and len(set(results)) == 1 and len(results) == 200


def test_bad_corpus_names_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"title": "A", "text": "a"}\n{"title": "B"}\n')
    with pytest.raises(WikiError, match=r"bad.jsonl:2"):
        OfflineStore(bad, index_dir=tmp_path / "idx")
    with pytest.raises(WikiError, match="not found"):
        OfflineStore(tmp_path / "missing.jsonl.gz", index_dir=tmp_path / "idx")


# ---------------------------------------------------------------- stub MediaWiki API

class StubWiki:
    "A tiny MediaWiki API: pages, redirects, full-text search and scripted failures per request."
    pages = {"Barack Obama": "Barack Obama was the 44th president.\n\nHe was born in Honolulu.",
             "Honolulu": "Honolulu is the capital of Hawaii."}
    redirects = {"Obama": "Barack Obama"}

    def __init__(self):
        self.requests = []          # (params, user_agent) of every request received
        self.plan = []              # behaviours for the next requests: "503", "stall", "ok"
        self.stall_s = 1.0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                params = {k: v[0] for k, v in parse_qs(urlparse(self.path).query).items()}
                stub.requests.append((params, self.headers.get("User-Agent")))
                step = stub.plan.pop(0) if stub.plan else "ok"
                if step == "stall":
                    time.sleep(stub.stall_s)
                if step == "503":
                    return self._send(503, {"error": "busy"})
                self._send(200, stub.answer(params))

            def _send(self, status, obj):
                body = json.dumps(obj).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up on a stalled reply
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/w/api.php"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, p):
        assert p["action"] == "query" and p["format"] == "json"
        if p.get("list") == "search":
            words = p["srsearch"].lower().split()
            hits = [t for t, text in self.pages.items() if any(w in (t + " " + text).lower() for w in words)]
            return {"query": {"search": [{"ns": 0, "title": t} for t in hits[: int(p["srlimit"])]]}}
        title = p["titles"]
        q = {}
        if p.get("redirects") and title in self.redirects:
            q["redirects"] = [{"from": title, "to": self.redirects[title]}]
            title = self.redirects[title]
        if title in self.pages:
            q["pages"] = [{"pageid": 1, "ns": 0, "title": title, "extract": self.pages[title]}]
        else:
            q["pages"] = [{"ns": 0, "title": title, "missing": True}]
        return {"batchcomplete": True, "query": q}

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def stub():
    s = StubWiki()
    yield s
    s.close()


def _live(stub, tmp_path, **kw):
    kw = {"timeout_s": 0.3, "max_retries": 2, "backoff_s": 0.01, "max_backoff_s": 0.05, **kw}
    return LiveStore(api_url=stub.url, cache_path=tmp_path / "live.sqlite", **kw)


def test_live_redirect_search_and_cache(stub, tmp_path):
    live = _live(stub, tmp_path)
    page = live.get("Obama")
    assert page == Page("Barack Obama", StubWiki.pages["Barack Obama"])
    params, ua = stub.requests[0]
    assert params["prop"] == "extracts" and params["explaintext"] == "1" and params["redirects"] == "1"
    assert ua.startswith("uaqmem/") and "research" in ua
    assert live.get("Kenya") is None
    assert live.search("honolulu", k=5) == ["Barack Obama", "Honolulu"]
    assert stub.requests[-1][0]["list"] == "search" and stub.requests[-1][0]["srlimit"] == "5"
    n = len(stub.requests)
    # the page cache answers repeated calls with no request, also from a fresh client
    again = _live(stub, tmp_path)
    assert again.get("Obama") == page and again.get("Kenya") is None and again.search("honolulu") == ["Barack Obama", "Honolulu"]
    assert len(stub.requests) == n and again.requests == 0


def test_live_retries_503_then_success(stub, tmp_path):
    stub.plan = ["503", "503"]
    live = _live(stub, tmp_path)
    assert live.get("Honolulu").title == "Honolulu"
    assert len(stub.requests) == 3 and live.requests == 3


def test_live_retries_timeout_then_success(stub, tmp_path):
    stub.plan = ["stall"]
    live = _live(stub, tmp_path)
    t0 = time.perf_counter()
    assert live.search("capital") == ["Honolulu"]
    assert live.requests == 2 and time.perf_counter() - t0 < stub.stall_s + 0.5


def test_live_retries_exhausted(stub, tmp_path):
    stub.plan = ["503"] * 10
    live = _live(stub, tmp_path, max_retries=2)
    with pytest.raises(WikiError, match=r"get\('Honolulu'\) failed after 3 attempts.*HTTP 503"):
        live.get("Honolulu")
    assert live.requests == 3
    stub.plan = []
    assert live.get("Honolulu") is not None  # failures are not cached


def test_live_server_down_is_a_clear_error(tmp_path):
    s = StubWiki(); url = s.url; s.close()
    live = LiveStore(api_url=url, cache_path=tmp_path / "c.sqlite", timeout_s=0.3, max_retries=1, backoff_s=0.01)
    with pytest.raises(WikiError, match=r"search\('x', k=5\) failed after 2 attempts against http://127.0.0.1"):
        live.search("x")


def test_replay_reproduces_episode_without_server(stub, tmp_path):
    rec = tmp_path / "rec.jsonl"
    actions = ["Search[Obama]", "Lookup[honolulu]", "Search[capital city]", "Search[Honolulu]", "Lookup[hawaii]",
               "Search[Obama]", "Finish[Honolulu]"]
    env = WikiEnv(RecordingStore(_live(stub, tmp_path), rec)).reset()
    recorded = [env.step(a) for a in actions]
    assert recorded[0].observation.startswith("Barack Obama was the 44th president. He was born")
    stub.close()
    replay = WikiEnv(ReplayStore(rec)).reset()
    replayed = [replay.step(a) for a in actions]
    assert [s.observation.encode() for s in replayed] == [s.observation.encode() for s in recorded]
    assert replayed == recorded
    with pytest.raises(ReplayMissError, match=r"get\(title='Kenya'\) was never recorded in .*rec.jsonl"):
        WikiEnv(ReplayStore(rec)).reset().step("Search[Kenya]")
