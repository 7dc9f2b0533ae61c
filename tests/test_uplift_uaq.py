"""The uplift-aware retriever end to end with the scripted world: real runner episodes, a real offline corpus (SQLite),
real memory banks on disk, real JSONL rollout logs and a papermill run of the experiment notebook."""
import json
import os
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from uaqmem.agent import MEMORY_BEGIN
from uaqmem.data import Question
from uaqmem.llm import ScriptedLLM
from uaqmem.memory import HashEmbedder, MemoryItem, MemoryStore
from uaqmem.methods import TINY_PAGES, MemoryBank, make_memory_config, scripted_world_rule
from uaqmem.reproduce import notebook_params
from uaqmem.runner import ExperimentConfig, JsonlLog, memory_bank, run_experiment, select_questions, training_config
from uaqmem.tables import SCRIPTED_WORLD
from uaqmem.uplift import UpliftScorer
from uaqmem.uplift_uaq import (CandidateSource, UpliftRetriever, UpliftSettings, choice_stats, episode_rollout,
                               fit_uplift, fit_uplift_retriever, memory_bank_dir, uplift_config)
from uaqmem.wiki import OfflineStore, WikiEnv, write_corpus

ROOT = Path(__file__).resolve().parents[1]


class CountScorer(UpliftScorer):
    "`value` per item in the set: −1 makes the empty set best, +1 the largest set."
    def __init__(self, value, dim=64):
        super().__init__(dim=dim, hidden=8)
        self.value = value

    def forward(self, task, memories, sets):
        return self.value * (sets >= 0).sum(1).float()


@pytest.fixture()
def world(tmp_path, monkeypatch):
    "A scripted-world experiment config with a memory spec, its own runs dir, corpus and LLM cache."
    monkeypatch.setenv("UAQMEM_CACHE", str(tmp_path / "cache"))
    corpus = write_corpus(tmp_path / "pages.jsonl", [{"title": t, "text": x} for t, x in TINY_PAGES.items()])
    return ExperimentConfig(dataset="kuq_test", agent_profile=SCRIPTED_WORLD, judge_profile=SCRIPTED_WORLD,
                            wiki=f"offline:{corpus}", n_questions=4, runs=1, concurrency=1, max_steps=4,
                            runs_dir=str(tmp_path / "runs"),
                            memory={"method": "expel", "train_split": "kuq_train", "n_train": 6, "embedder": "hash:64"})


def agent_messages(llm):
    return [m["content"] for call in llm.calls for m in call["messages"]]


def test_empty_set_means_no_guidance(world):
    bank = memory_bank(world, progress=False)
    assert len(bank) > 0
    shown = {}
    for value in (-1.0, 1.0):
        r = UpliftRetriever(bank, CountScorer(value), name=f"expel-fixed{value:+.0f}")
        agent = ScriptedLLM(profile=SCRIPTED_WORLD)
        cfg = uplift_config(world, r)
        run_experiment(cfg, agent_llm=agent, memory=r, progress=False)
        trajs = JsonlLog(cfg.run_root() / "run1" / "trajectories.jsonl").read()
        shown[value] = (any(MEMORY_BEGIN in c for c in agent_messages(agent)), choice_stats(cfg), trajs)
    injected, stats, trajs = shown[-1.0]
    assert not injected and stats["empty_set_pct"] == 100.0
    assert all(t["memory"]["guidance"] is None and t["memory"]["items"] == [] for t in trajs)
    injected, stats, trajs = shown[1.0]   # the same path with a non-empty choice does inject guidance
    assert injected and stats["empty_set_pct"] == 0.0
    assert all(len(t["memory"]["items"]) == 2 and "uplift" in t["memory"]["items"][0] for t in trajs)


def test_leave_one_out_and_resumable_rollouts(world):
    bank = memory_bank(world, progress=False)
    src = CandidateSource(bank)
    train = select_questions(training_config(world))
    sources = {it.source_id for it in bank.store.items}
    own_first = 0
    for q in train:
        own_first += bool(src.candidates(q, 6)) and src.candidates(q, 6)[0]["source_id"] == str(q.id)
        for it in src.candidates(q, 6, exclude_source=q.id) + src.similarity(q, exclude_source=q.id):
            assert it["source_id"] != str(q.id)
    assert own_first > 0 and sources & {str(q.id) for q in train}   # without the exclusion the leak is real

    def fit(budget=4):
        agent, judge = ScriptedLLM(profile=SCRIPTED_WORLD), ScriptedLLM(profile=SCRIPTED_WORLD)
        r = fit_uplift_retriever(world, budget, "evsi", progress=False, agent_llm=agent, judge_llm=judge)
        return r, len(agent.calls)

    r1, calls1 = fit()
    assert calls1 > 0 and r1.report["probes"] > 0
    log = memory_bank_dir(world) / "uplift" / "rollouts.jsonl"
    lines = log.read_text().splitlines()
    rows = [json.loads(l) for l in lines]
    keys = {(r["qid"], tuple(r["set"])) for r in rows}
    assert len(keys) == len(rows)
    source_of = {it.id: it.source_id for it in bank.store.items}
    assert all(source_of.get(i) != r["qid"] for r in rows for i in r["set"])   # leave-one-out in the training data

    # A kill mid-fit: half the log survives plus a torn line; the scorer was never saved.
    shutil.rmtree(next((memory_bank_dir(world) / "uplift").glob("evsi-b4-*")))
    log.write_text("\n".join(lines[:len(lines) // 2]) + "\n" + lines[len(lines) // 2][:25])
    r2, calls2 = fit()
    rows2 = [json.loads(l) for l in log.read_text().splitlines()]
    assert {(r["qid"], tuple(r["set"])) for r in rows2} == keys and len(rows2) == len(rows)
    assert 0 < calls2 < calls1
    # Nothing missing any more: refitting from the log makes no agent call at all, and loading the saved scorer neither.
    shutil.rmtree(next((memory_bank_dir(world) / "uplift").glob("evsi-b4-*")))
    r3, calls3 = fit()
    assert calls3 == 0 and r3.report["new_rollouts"] == 0 and r3.report["probes"] == r1.report["probes"]
    r4, calls4 = fit()
    assert calls4 == 0 and r4.report == r3.report


def _helpful_harmful_rule(messages):
    "The scripted world, except that the agent's final answer depends on the memory it is shown."
    if "Wikipedia question-answering agent" not in messages[0]["content"]:
        return scripted_world_rule(messages)
    guidance = " ".join(m["content"] for m in messages if m["content"].startswith(MEMORY_BEGIN))
    q = re.search(r"Question: (.*)", [m for m in messages if m["content"].startswith("Question:")][-1]["content"]).group(1)
    country = re.search(r"country (\w+)\?", q).group(1)
    n = sum(m["role"] == "assistant" for m in messages) + 1
    if "HARMFUL" in guidance:
        answer = "Nowhere"
    elif "HELPFUL" in guidance or "famous" in q:
        answer = f"{country}ville"
    else:
        answer = "unknown"
    return f"Thought {n}: Done.\nAction {n}: Finish[{answer}]"


def test_scorer_learns_helpful_from_harmful(tmp_path, monkeypatch):
    monkeypatch.setenv("UAQMEM_CACHE", str(tmp_path / "cache"))
    bank = MemoryBank(make_memory_config("awm"), MemoryStore(HashEmbedder(64)))
    texts = {"help": "HELPFUL: the capital is the country name followed by ville.",
             "harm": "HARMFUL: the capital of every country is Nowhere.",
             "n1": "Search the country page before answering.", "n2": "Lookup the word capital on the country page."}
    for i, (key, text) in enumerate(texts.items()):
        bank.add(MemoryItem(id=key, content=f"Workflow: capital\n1. {text}\n2. Answer.", type="workflow",
                            source_id=f"s{i}", success=True, method="awm"))
    bank.freeze()
    def question(i, kind):
        return Question(id=f"{kind}{i}", question=f"What is the capital of the {kind} country C{i}x?", answers=[f"C{i}xville"],
                        answerable=True, category=None, dataset="kuq", split="train")
    train = [question(i, "famous" if i % 2 else "remote") for i in range(12)]
    corpus = write_corpus(tmp_path / "pages.jsonl", [{"title": t, "text": x} for t, x in TINY_PAGES.items()])
    store = OfflineStore(corpus=str(corpus))
    agent = ScriptedLLM(rule=_helpful_harmful_rule)
    rollout = episode_rollout(bank, agent, ScriptedLLM(rule=scripted_world_rule), lambda: WikiEnv(store, max_steps=4),
                              ExperimentConfig(max_steps=4), sample=1)
    r = fit_uplift(bank, train, rollout, tmp_path / "rollouts.jsonl", budget=24, strategy="evsi",
                   settings=UpliftSettings(n_candidates=4, warmup_steps=200, steps_per_round=80))
    rows = JsonlLog(tmp_path / "rollouts.jsonl").read()
    observed = {tuple(row["set"]) for row in rows}
    assert ("help",) in observed or any("help" in s for s in observed)
    # real episodes: with HARMFUL shown a famous question fails, with HELPFUL a remote one succeeds
    assert any(row["utility"] == 0.0 and "harm" in row["set"] and row["qid"].startswith("famous") for row in rows)
    for i in range(40, 44):
        remote = {it["id"] for it in r.choose(question(i, "remote"))["items"]}
        famous = {it["id"] for it in r.choose(question(i, "famous"))["items"]}
        assert "help" in remote and "harm" not in remote, remote
        assert "harm" not in famous, famous


def test_experiment_notebook_runs_on_smoke_params(tmp_path, monkeypatch):
    import papermill as pm
    monkeypatch.setenv("UAQMEM_CACHE", str(tmp_path / "cache"))
    names, params = notebook_params(ROOT / "params" / "smoke.yaml")
    assert "uplift_uaq" in names
    figs = tmp_path / "figures"
    pm.execute_notebook(str(ROOT / "nbs" / "experiments" / "uplift_uaq.ipynb"), str(tmp_path / "out.ipynb"),
                        parameters={**params, "runs_dir": str(tmp_path / "runs"), "figures_dir": str(figs),
                                    "methods": ["expel", "awm"], "probe_budget": 4},
                        cwd=str(ROOT), progress_bar=False, kernel_name="python3")
    csv = pd.read_csv(figs / "uplift_uaq.csv")
    md = (figs / "uplift_uaq.md").read_text()
    for col in ("KUQ", "UAQFact"):
        sub = csv[csv["column"] == col]
        assert list(sub["retrieval"]) == ["none", "similarity", "similarity", "uplift-evsi", "uplift-evsi"]
        up = sub[sub["retrieval"] == "uplift-evsi"]
        assert up["empty_set_pct"].between(0, 100).all() and up["run_root"].str.contains("uplift-evsi-b4").all()
        assert (sub[["AR", "Acc", "JS"]].notna()).all().all()
        assert f"### Agent: world, {col}" in md
    assert "similarity top-2" in md and "uplift (evsi, budget 4)" in md
