"""The runner end to end over real sockets: a stub OpenAI-compatible server that fails 10% of calls, a runner process
killed with SIGKILL twice and resumed, compared with a clean run."""
import gzip
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from uaqmem.stubs import StubOpenAIServer

PAGES = [
    {"title": "Alpha", "text": "Alpha is the first letter of the Greek alphabet. It was derived from the Phoenician letter aleph."},
    {"title": "Beta", "text": "Beta is the second letter of the Greek alphabet."},
]


def scripted_reply(body: dict) -> str:
    "Deterministic by content: ReAct steps for the agent, a verdict for the judge."
    msgs = body["messages"]
    system = msgs[0]["content"] if msgs and msgs[0]["role"] == "system" else ""
    if "strict evaluator" in system:
        prompt = msgs[-1]["content"]
        # refuse-ish answers are judged acceptable
        answer = prompt.rsplit("answer:", 1)[-1].lower()
        return json.dumps({"verdict": "1" if "cannot" in answer else "0", "reason": "stub"})
    n_assistant = sum(m["role"] == "assistant" for m in msgs)
    question = next((m["content"] for m in msgs if m["role"] == "user" and "Question" in m["content"]), None)
    if question is None:      # not an agent prompt (e.g. a memory extraction prompt)
        return "Search the exact title first."
    h = sum(map(ord, question))
    if n_assistant == 0:
        return "Thought step: I should look it up.\nAction step: Search[Alpha]"
    if n_assistant == 1 and h % 3 == 0:
        return "Thought step: check the letter.\nAction step: Lookup[Phoenician]"
    return "Thought step: done.\nAction step: Finish[" + ("I cannot answer this." if h % 2 else "Alpha") + "]"


def _write_params(tmp, base_url, runs_dir, corpus):
    prof = {"backend": "openai", "name": "stub", "model": "stub-model", "base_url": base_url,
            "api_key_env": "UAQMEM_STUB_KEY", "timeout_s": 1.0, "max_retries": 8, "max_concurrency": 4}
    p = tmp / f"params-{runs_dir.name}.yaml"
    p.write_text(yaml.safe_dump({"dataset": "kuq_test", "agent_profile": prof, "judge_profile": prof,
                                 "wiki": f"offline:{corpus}", "n_questions": 24, "runs": 1, "concurrency": 4,
                                 "runs_dir": str(runs_dir)}))
    return p


def _env(cache):
    return os.environ | {"UAQMEM_STUB_KEY": "stub-key-not-secret", "UAQMEM_CACHE": str(cache)}


def _run_dir(runs_dir):
    dirs = list(runs_dir.glob("*/run1"))
    return dirs[0] if dirs else None


def _lines(path):
    return path.read_text().splitlines() if path.exists() else []


def _essential(traj):
    return (traj["qid"], traj["answer"], traj["stop_reason"],
            [(s["action_type"], s["argument"], s["observation"]) for s in traj["steps"]])


def test_resume_after_sigkill_matches_clean_run(tmp_path):
    corpus = tmp_path / "pages.jsonl.gz"
    with gzip.open(corpus, "wt") as f:
        for p in PAGES:
            f.write(json.dumps(p | {"source": "fixture", "truncated": False}) + "\n")
    cmd = [sys.executable, "-m", "uaqmem", "run", "--quiet", "--params"]

    with StubOpenAIServer(scripted_reply) as clean_stub:
        clean_dir = tmp_path / "clean"
        r = subprocess.run(cmd + [str(_write_params(tmp_path, clean_stub.url + "/v1", clean_dir, corpus))],
                           env=_env(tmp_path / "cache-clean"), capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]

    faults = {"rate": 0.10, "kinds": ["429:0.05", "500", "timeout", "malformed"]}
    with StubOpenAIServer(scripted_reply, faults=faults, seed=7, hang_s=3.0, latency_s=0.02) as stub:
        flaky_dir = tmp_path / "flaky"
        params = _write_params(tmp_path, stub.url + "/v1", flaky_dir, corpus)
        env = _env(tmp_path / "cache-flaky")
        rng = random.Random(3)
        for kill in range(2):
            proc = subprocess.Popen(cmd + [str(params)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            target = rng.randint(3, 8) + 8 * kill
            deadline = time.time() + 120
            while time.time() < deadline and proc.poll() is None:
                rd = _run_dir(flaky_dir)
                if rd is not None and len(_lines(rd / "judgments.jsonl")) >= target:
                    break
                time.sleep(0.02)
            assert proc.poll() is None, f"runner ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        r = subprocess.run(cmd + [str(params)], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        assert stub.faults > 0, "the stub injected no faults: the test would prove nothing"

    clean, flaky = _run_dir(clean_dir), _run_dir(flaky_dir)
    clean_trajs = [json.loads(l) for l in _lines(clean / "trajectories.jsonl")]
    flaky_trajs = [json.loads(l) for l in _lines(flaky / "trajectories.jsonl")]
    flaky_judg = [json.loads(l) for l in _lines(flaky / "judgments.jsonl")]
    ids = [t["qid"] for t in flaky_trajs]
    assert len(ids) == len(set(ids)) == 24, "a question is missing or was done twice"
    assert sorted(j["qid"] for j in flaky_judg) == sorted(ids)
    assert sorted(map(_essential, flaky_trajs), key=str) == sorted(map(_essential, clean_trajs), key=str)
    m_clean = json.loads((clean / "metrics.json").read_text())
    m_flaky = json.loads((flaky / "metrics.json").read_text())
    for k in ("ar", "acc", "js", "n", "judge_failures", "agent_errors"):
        assert m_clean[k] == m_flaky[k], k
    assert "stub-key-not-secret" not in (flaky / "params.json").read_text()


def test_memory_experiment_and_channels(tmp_path, monkeypatch):
    "A memory spec builds one frozen bank from a shared training run; G and T replay the right trajectories."
    from uaqmem import llm as llm_mod
    from uaqmem.methods import TINY_PAGES, scripted_world_rule
    from uaqmem.runner import ExperimentConfig, run_experiment
    monkeypatch.setenv("UAQMEM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(llm_mod.SCRIPT_RULES, "world", scripted_world_rule)
    corpus = tmp_path / "pages.jsonl.gz"
    with gzip.open(corpus, "wt") as f:
        for title, text in TINY_PAGES.items():
            f.write(json.dumps({"title": title, "text": text}) + "\n")
    prof = {"backend": "scripted", "name": "world", "model": "world", "rule": "world"}
    base = dict(dataset="kuq_test", agent_profile=prof, judge_profile=prof, wiki=f"offline:{corpus}", n_questions=8,
                runs=1, concurrency=2, runs_dir=str(tmp_path / "runs"),
                memory={"method": "memevolve", "train_split": "kuq_train", "n_train": 8, "embedder": "hash:64"})
    gt = run_experiment(ExperimentConfig(**base), progress=False)
    banks = list((tmp_path / "runs" / "memory").glob("*/bank.json"))
    assert len(banks) == 1
    train_runs = [p for p in (tmp_path / "runs").glob("kuq_train__*") if p.is_dir()]
    assert len(train_runs) == 1 and len(_lines(train_runs[0] / "run1" / "trajectories.jsonl")) == 8

    g = run_experiment(ExperimentConfig(**base, channel="G"), progress=False)
    t = run_experiment(ExperimentConfig(**base, channel="T"), progress=False)
    assert len(list((tmp_path / "runs" / "memory").glob("*/bank.json"))) == 1, "the bank was built twice"
    read = lambda s: {r["qid"]: r for r in map(json.loads, _lines(Path(s["run_root"]) / "run1" / "trajectories.jsonl"))}
    gt_t, g_t, t_t = read(gt), read(g), read(t)
    nomem = next(p for p in (tmp_path / "runs").glob("kuq_test__*nomem*") if p.is_dir())
    nomem_t = {r["qid"]: r for r in map(json.loads, _lines(nomem / "run1" / "trajectories.jsonl"))}
    for qid, tr in g_t.items():
        assert tr["memory"]["channel"] == "G" and tr["memory"]["guidance"]
        # G replays the no-memory steps (minus the final answer)
        ref = [s["action"] for s in nomem_t[qid]["steps"] if s["action_type"] != "finish"]
        assert [s["action"] for s in tr["steps"] if s["action_type"] != "finish"][:len(ref)] == ref
    for qid, tr in t_t.items():
        assert tr["memory"]["channel"] == "T" and not tr["memory"]["guidance"]
        ref = [s["action"] for s in gt_t[qid]["steps"] if s["action_type"] != "finish"]
        assert [s["action"] for s in tr["steps"] if s["action_type"] != "finish"][:len(ref)] == ref
