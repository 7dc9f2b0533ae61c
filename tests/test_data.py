"""uaqmem.data: real splits and originals, the sampler, malformed-input errors, and the downloader
against a real HTTP server on 127.0.0.1 serving a copy laid out like the upstream repositories."""
from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import random
import threading
from collections import Counter
from pathlib import Path

import pytest

from uaqmem import config
from uaqmem.data import (FULL_COUNTS, KNOWN_CATEGORIES, MANIFEST, SOURCES, SPLITS, ChecksumError, DataError,
                         DownloadError, Question, describe, download, largest_remainder, load_full, load_kuq_full,
                         load_split, normalize_text, read_kuq_file, read_refunq_file, read_split_file,
                         read_uaqfact_file, select_files, sha256_file, stratified_sample, verify_files)


def _shared_data() -> Path | None:
    try:
        d = config.data_dir()
    except config.ConfigError:
        return None
    return d if (d / "memuaq" / "kuq_test.json").exists() else None


DATA = _shared_data()
needs_data = pytest.mark.skipif(DATA is None, reason="no data folder ($UAQMEM_DATA, ./data or ../shared/data)")


# ---------------------------------------------------------------- real splits and originals

@needs_data
@pytest.mark.parametrize("name", list(SPLITS))
def test_split_counts_balance_and_categories(name):
    dataset, split = SPLITS[name]
    qs = load_split(name, DATA)
    expected = 200 if split == "train" else 400
    print(name, describe(qs))
    assert len(qs) == expected
    assert sum(q.answerable for q in qs) == expected // 2
    assert {q.category for q in qs if not q.answerable} == set(KNOWN_CATEGORIES[dataset])
    assert all(q.category is None and q.answers for q in qs if q.answerable)
    assert all(q.answers == [] for q in qs if not q.answerable)
    assert len({q.id for q in qs}) == len(qs)
    assert all(q.dataset == dataset and q.split == split for q in qs)


@needs_data
def test_split_keeps_answers_as_given():
    raw = json.loads((DATA / "memuaq" / "refunq_test.json").read_text())
    qs = {q.id: q for q in load_split("refunq_test", DATA)}
    for row in raw:
        assert qs[str(row["id"])].answers == row["answers"]
        assert qs[str(row["id"])].question == row["question"].strip()


@needs_data
@pytest.mark.parametrize("dataset", list(FULL_COUNTS))
def test_full_counts(dataset):
    qs = load_full(dataset, DATA)
    n_ab, n_ua = FULL_COUNTS[dataset]
    c = Counter(q.answerable for q in qs)
    print(dataset, describe(qs))
    assert (c[True], c[False]) == (n_ab, n_ua)
    assert {q.category for q in qs if not q.answerable} == set(KNOWN_CATEGORIES[dataset])
    assert len({q.id for q in qs}) == len(qs)
    assert all(q.answers for q in qs if q.answerable)
    assert all(q.answers == [] for q in qs if not q.answerable)


@needs_data
def test_kuq_unknown_explanations_are_not_answers():
    qs = load_kuq_full(DATA)
    assert len(qs) == 6884
    unknown = [q for q in qs if not q.answerable]
    assert all(q.answers == [] and q.meta["explanations"] for q in unknown)
    # ids are line numbers: stable and traceable to the file
    lines = (DATA / "kuq" / "knowns_unknowns.jsonl").read_text().splitlines()
    q = qs[100]
    assert json.loads(lines[int(q.id.split("L")[1]) - 1])["question"].strip() == q.question


# ---------------------------------------------------------------- sampler

def _synthetic_pool(rng: random.Random) -> list[Question]:
    n_ab = rng.randint(150, 400)
    cats = {f"c{i}": rng.randint(5, 120) for i in range(rng.randint(1, 6))}
    pool = [Question(f"a{i}", f"answerable {i}", ["x"], True, None, "kuq", "full") for i in range(n_ab)]
    for c, n in cats.items():
        pool += [Question(f"{c}-{i}", f"unanswerable {c} {i}", [], False, c, "kuq", "full") for i in range(n)]
    # texts that differ only in case/punctuation must be treated as one question
    pool += [Question(f"dup{i}", f"Answerable {i}?!", ["x"], True, None, "kuq", "full") for i in range(20)]
    return pool


def _check_sample(pool, train, test, n_train, n_test):
    assert len(train) == n_train and len(test) == n_test
    for part, n in ((train, n_train), (test, n_test)):
        assert sum(q.answerable for q in part) == n - n // 2
        uaq = [q for q in pool if not q.answerable]
        expected = largest_remainder(Counter(q.category for q in uaq), n // 2)
        got = Counter(q.category for q in part if not q.answerable)
        assert {c: got.get(c, 0) for c in expected} == expected
        # proportions: each category within one seat of its exact share
        for c, k in expected.items():
            share = sum(q.category == c for q in uaq) / len(uaq)
            assert abs(k - share * (n // 2)) < 1
    assert not {q.id for q in train} & {q.id for q in test}
    assert not {normalize_text(q.question) for q in train} & {normalize_text(q.question) for q in test}
    assert len({normalize_text(q.question) for q in train + test}) == n_train + n_test
    assert all(q.split == "train" for q in train) and all(q.split == "test" for q in test)


@pytest.mark.parametrize("case", range(25))
def test_sampler_properties_on_random_pools(case):
    rng = random.Random(case)
    pool = _synthetic_pool(rng)
    n_uaq = sum(not q.answerable for q in pool)
    n_train = rng.randint(0, n_uaq // 3)
    n_test = rng.randint(0, n_uaq // 3)
    try:
        train, test = stratified_sample(pool, n_train, n_test, seed=case)
    except DataError as e:  # a tiny category can legitimately be too small: the error must name it
        assert "category" in str(e) or "answerable" in str(e)
        return
    _check_sample(pool, train, test, n_train, n_test)
    # reproducible, independent of input order
    shuffled = pool[:]
    rng.shuffle(shuffled)
    assert stratified_sample(shuffled, n_train, n_test, seed=case) == (train, test)


@needs_data
def test_sampler_on_full_kuq_and_uaqfact():
    for loader in (load_kuq_full, lambda d: load_full("uaqfact", d)):
        pool = loader(DATA)
        train, test = stratified_sample(pool, 200, 400, seed=0)
        # proportions are those of the de-duplicated pool the sampler draws from
        _check_sample(_dedup_like(pool, seed=0), train, test, 200, 400)
        again = stratified_sample(pool, 200, 400, seed=0)
        assert again == (train, test)
        other = stratified_sample(pool, 200, 400, seed=1)
        assert {q.id for q in other[1]} != {q.id for q in test}


def _dedup_like(pool, seed):
    "The pool as the sampler sees it after de-duplication (same canonical order and shuffle)."
    ordered = sorted(pool, key=lambda q: (q.dataset, q.id))
    random.Random(seed).shuffle(ordered)
    seen, out = set(), []
    for q in ordered:
        t = normalize_text(q.question)
        if t not in seen:
            seen.add(t)
            out.append(q)
    return out


def test_sampler_rejects_duplicate_ids():
    q = Question("1", "a?", ["x"], True, None, "kuq", "full")
    with pytest.raises(DataError, match="duplicate ids"):
        stratified_sample([q, q], 1, 1)


# ---------------------------------------------------------------- malformed input: one test per kind

GOOD = {"id": 1, "question": "Who?", "answers": ["x"], "answerable": True, "question_type": "default"}


def _error_for(tmp_path, content, reader=lambda p: read_split_file(p, "kuq", "test"), name="bad.json"):
    p = tmp_path / name
    p.write_text(content, encoding="utf-8")
    with pytest.raises(DataError) as ei:
        reader(p)
    msg = str(ei.value)
    assert str(p) in msg
    return msg


def test_bad_json_array_names_line(tmp_path):
    msg = _error_for(tmp_path, '[\n{"id": 1, "question": "a?",\n "answers": [}\n]')
    assert "invalid JSON at line 3" in msg


def test_bad_jsonl_names_line(tmp_path):
    good = json.dumps({"question": "a?", "answer": ["x"], "unknown": False, "source": "s"})
    msg = _error_for(tmp_path, good + "\n" + good + "\n{oops\n", read_kuq_file, "k.jsonl")
    assert "line 3" in msg and "invalid JSON" in msg


def test_missing_field_names_row_id_and_field(tmp_path):
    row = dict(GOOD, id=7)
    del row["answerable"]
    msg = _error_for(tmp_path, json.dumps([GOOD, row]))
    assert "row 1" in msg and "id='7'" in msg and "field 'answerable'" in msg and "missing" in msg


def test_empty_question(tmp_path):
    msg = _error_for(tmp_path, json.dumps([dict(GOOD, question=" \n ")]))
    assert "row 0" in msg and "id='1'" in msg and "field 'question'" in msg and "empty question" in msg


def test_duplicate_id(tmp_path):
    msg = _error_for(tmp_path, json.dumps([GOOD, dict(GOOD, id=2), dict(GOOD, question="Other?")]))
    assert "row 2" in msg and "id='1'" in msg and "field 'id'" in msg and "duplicate id" in msg and "row 0" in msg


def test_duplicate_qid_across_uaqfact_files(tmp_path):
    from uaqmem.data import UAQFACT_FILES, load_uaqfact_full
    ab = [{"qid": "q1", "question": "Who?", "answer": [{"label": "X", "id": "Q1"}], "type": "answerable"}]
    ua = [{"qid": "q1", "question": "Who else?", "answer": [{"label": "None", "id": "None"}], "type": "unanswerable"}]
    for rel, (_, answerable) in UAQFACT_FILES.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        rows = ab if answerable else ua
        (tmp_path / rel).write_text(json.dumps([dict(r, qid=f"{r['qid']}-{Path(rel).stem}") for r in rows]))
    first = next(iter(UAQFACT_FILES))
    (tmp_path / "uaqfact/1.0/task1/dilemma_ua_en_v2.json").write_text(json.dumps([dict(ua[0], qid=f"q1-{Path(first).stem}")]))
    with pytest.raises(DataError) as ei:
        load_uaqfact_full(tmp_path)
    msg = str(ei.value)
    assert "dilemma_ua_en_v2.json: row 0" in msg and "duplicate id" in msg and "dilemma_ab_en_v2.json: row 0" in msg


@pytest.mark.parametrize("field,value,expect", [
    ("answerable", "true", "expected a bool"),
    ("answers", "x", "expected a list"),
    ("id", True, "expected an integer or a string"),
    ("question", 5, "expected a string"),
])
def test_wrong_type(tmp_path, field, value, expect):
    msg = _error_for(tmp_path, json.dumps([GOOD, {**GOOD, "id": 2, field: value}]))
    assert "row 1" in msg and f"field '{field}'" in msg and expect in msg


def test_wrong_item_type_in_answers(tmp_path):
    msg = _error_for(tmp_path, json.dumps([dict(GOOD, answers=["ok", 3])]))
    assert "field 'answers'" in msg and "item 1" in msg


def test_not_an_object_and_not_an_array(tmp_path):
    assert "expected a JSON object" in _error_for(tmp_path, json.dumps([GOOD, "row"]))
    assert "expected a JSON array" in _error_for(tmp_path, json.dumps({"rows": []}), name="obj.json")


def test_contradictions(tmp_path):
    assert "contradicts answerable" in _error_for(tmp_path, json.dumps([dict(GOOD, question_type="unanswerable")]))
    uaq = dict(GOOD, answers=[], answerable=False, question_type="unanswerable", reason="nothing")
    assert "field 'reason'" in _error_for(tmp_path, json.dumps([uaq]), name="r.json")
    assert "field 'type'" in _error_for(
        tmp_path, json.dumps([{"qid": "a", "question": "Who?", "answer": [{"label": "X"}], "type": "unanswerable"}]),
        lambda p: read_uaqfact_file(p, "inter", True), "u.json")
    assert "field 'label'" in _error_for(tmp_path, json.dumps({"prompt": "who?", "label": "NEC"}) + "\n",
                                         lambda p: read_refunq_file(p, True), "rq.json")


def test_missing_file_and_unknown_split(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        load_split("kuq_test", tmp_path)
    with pytest.raises(DataError, match="Unknown split"):
        load_split("kuq_dev", tmp_path)


# ---------------------------------------------------------------- downloader against a real local server

class _Handler(http.server.SimpleHTTPRequestHandler):
    requests: list[str]

    def log_message(self, *args):  # keep test output quiet
        pass

    def do_GET(self):
        self.server.requests.append(self.path)
        super().do_GET()


@pytest.fixture
def mirror(tmp_path):
    "A real HTTP server on 127.0.0.1 serving `root/<owner>/<repo>/<commit>/<path>`; yields (root, url, server)."
    root = tmp_path / "mirror"
    root.mkdir()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, directory=str(root)))
    srv.requests = []
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield root, f"http://127.0.0.1:{srv.server_address[1]}", srv
    finally:
        srv.shutdown()
        srv.server_close()


def _publish(root: Path, only, sources=None):
    "Link the shared files into the mirror at their upstream locations (only the given sources if named)."
    for e in select_files(only):
        for src_name, rel in e.locations:
            if sources is not None and src_name not in sources:
                continue
            s = SOURCES[src_name]
            p = root / s.repo / s.commit / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.symlink_to(DATA / e.path)


SMALL = ["memuaq", "refunq"]


@needs_data
def test_download_verifies_and_rerun_skips(tmp_path, mirror):
    root, url, srv = mirror
    _publish(root, SMALL)
    dest = tmp_path / "data"
    res = download(dest, base_urls=url, only=SMALL, log=None)
    wanted = select_files(SMALL)
    assert [r["path"] for r in res] == [e.path for e in wanted]
    assert all(r["status"] == "downloaded" for r in res)
    for e in wanted:
        assert sha256_file(dest / e.path) == e.sha256
    assert not list(dest.rglob("*.part"))
    assert len(load_split("refunq_test", dest)) == 400
    assert set(verify_files(dest, SMALL).values()) == {"ok"}
    n_requests = len(srv.requests)
    assert n_requests == len(wanted)

    again = download(dest, base_urls=url, only=SMALL, log=None)
    assert all(r["status"] == "present" for r in again)
    assert len(srv.requests) == n_requests  # nothing fetched on the rerun


@needs_data
def test_download_rejects_corrupted_file_naming_both_hashes(tmp_path, mirror):
    root, url, _ = mirror
    entry = select_files("memuaq/kuq_test.json")[0]
    src = SOURCES["memuaq"]
    p = root / src.repo / src.commit / "data/kuq_test.json"
    p.parent.mkdir(parents=True)
    data = bytearray((DATA / entry.path).read_bytes())
    data[100] ^= 0x01
    p.write_bytes(bytes(data))
    bad_hash = hashlib.sha256(bytes(data)).hexdigest()
    dest = tmp_path / "data"
    with pytest.raises(ChecksumError) as ei:
        download(dest, base_urls=url, only=entry.path, log=None)
    msg = str(ei.value)
    assert entry.path in msg and entry.sha256 in msg and bad_hash in msg
    assert not (dest / entry.path).exists()
    assert not list(dest.rglob("*.part"))


@needs_data
def test_download_replaces_a_corrupted_local_copy(tmp_path, mirror):
    root, url, _ = mirror
    _publish(root, "memuaq/uaqfact_train.json")
    dest = tmp_path / "data"
    target = dest / "memuaq/uaqfact_train.json"
    target.parent.mkdir(parents=True)
    target.write_text("[]")
    res = download(dest, base_urls=url, only="memuaq/uaqfact_train.json", log=None)
    assert res[0]["status"] == "downloaded"
    assert sha256_file(target) == select_files("memuaq/uaqfact_train.json")[0].sha256


@needs_data
def test_download_falls_back_to_mirror_and_reports_failures(tmp_path, mirror):
    root, url, srv = mirror
    _publish(root, "kuq", sources={"kuq_mirror"})  # the hub copy is missing: 404, then the GitHub mirror
    res = download(tmp_path / "data", base_urls=url, only="kuq", log=None)
    assert res[0]["status"] == "downloaded" and "Epistemic-Humility-Research" in res[0]["url"]
    assert any("amayuelas/KUQ" in r for r in srv.requests)
    # a per-source dict override works too; a file nowhere to be found names the file and the URLs tried
    with pytest.raises(DownloadError) as ei:
        download(tmp_path / "other", base_urls={"refunq": f"{url}/nothing-here"}, only="refunq/RefuNQ_answerable.json",
                 log=None, retries=0)
    assert "refunq/RefuNQ_answerable.json" in str(ei.value) and "HTTP 404" in str(ei.value)
    assert not isinstance(ei.value, ChecksumError)


def test_wiki_corpus_is_not_downloadable(tmp_path):
    with pytest.raises(DataError, match="README"):
        download(tmp_path, only="wiki/pages.jsonl.gz", log=None)


@needs_data
def test_manifest_matches_shared_data():
    assert set(verify_files(DATA).values()) == {"ok"}
    assert all(len(e.sha256) == 64 for e in MANIFEST)
