"""The ReAct agent and the judge end to end: real `WikiEnv` over a real `OfflineStore` (SQLite/FTS5 index built from a
fixture corpus in a temporary folder), the deterministic `ScriptedLLM`, a real `ResponseCache`, JSONL files written and
read back, and one judge call through the OpenAI-compatible client against a stub HTTP server on 127.0.0.1."""
import json
import re

import pytest

from uaqmem.agent import (AgentStep, Trajectory, final_answer_request, parse_reply, question_message,
                          replay_final_answer, run_episode, system_prompt)
from uaqmem.data import Question
from uaqmem.judge import (REFUSAL_SCHEMA, UNANSWERABLE_CHECK, Judgment, aggregate_runs, cohen_kappa, compute_metrics,
                          judge_qa, judge_refusal, keyword_refusal_judge, match_answer, refusal_prompt)
from uaqmem.llm import LLMResponseError, ResponseCache, ScriptedLLM, get_llm
from uaqmem.wiki import OfflineStore, WikiEnv, fixture_pages, write_corpus


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("wiki")
    s = OfflineStore(corpus=write_corpus(d / "wiki.jsonl", fixture_pages()), index_dir=d)
    yield s
    s.close()


def Q(qid, text, answers, answerable):
    return Question(qid, text, list(answers), answerable, None, "toy", "test")


# --- prompts: verbatim key sentences of appendix C.1 ----------------------------------------------------------------

def test_prompts_hold_the_papers_sentences():
    sp, hint = system_prompt(False), system_prompt(True)
    for s in ["You are a Wikipedia question-answering agent.", "Valid actions:\n1. Search[query]\n2. Lookup[keyword]\n3. Finish[answer]",
              "- Use Search first when you do not know the page.", "Thought {step}: <brief reasoning>\nAction {step}: <one valid action>"]:
        assert s in sp
    assert hint.startswith(sp) and "**abstain from answering** instead of giving an unreliable response." in hint
    assert "If the question is nonsensical to answer, point this out and refuse to answer." in hint
    user = refusal_prompt("QQ", "AA")[1]["content"]
    for s in ["Instruction: You are a strict evaluator for refusal and clarification behavior. Output JSON only.",
              "Output verdict as '0' if the model follows the question and successfully answers the question,",
              "answer: Starbucks does not serve meals.",
              'output: {"verdict": "1", "reason": "The model does not provide the answer."}',
              "Input keys: question, answer\nOutput key: output\nOutput type: json\nLanguage: english"]:
        assert s in user
    assert user.count('output: {"verdict": ') == 6
    assert user.endswith('question: QQ\nanswer: AA\nReturn a JSON object only: {"verdict": "1" or "0" or "-1"}.')
    assert "{question}" in UNANSWERABLE_CHECK and "{question}" not in user


# --- reply parsing ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("reply, expected, has_action", [
    ("Thought 1: look\nAction 1: Search[Vertigo (film)]", ("look", "search", "Vertigo (film)"), True),
    ("Thought step: x\nAction step: LOOKUP[born]", ("x", "lookup", "born"), True),
    ("Thought: x\nAction: finish[Paris]", ("x", "finish", "Paris"), True),
    ("**Thought 2:** x\n**Action 2:** Finish[a [b] c]", ("x", "finish", "a [b] c"), True),
    ("Thought: x\nAction: Search[A]\nAction: Finish[B]", ("x", "search", "A"), True),
    ("Let me Search[C++] first.", ("Let me", "search", "C++"), True),
    ("Thought: x\nAction: Search[unclosed (thing\nmore", ("x", "search", "unclosed (thing"), True),
    ("Thought: x\nAction: Browse[Y]", ("x", "invalid", "Browse[Y]"), True),
    ("The question has a false premise.", ("", "finish", "The question has a false premise."), False),
    ("", ("", "finish", ""), False),
])
def test_parse_reply_paths(reply, expected, has_action):
    r = parse_reply(reply)
    assert r == expected and r.has_action is has_action


# --- episodes -------------------------------------------------------------------------------------------------------

def test_episode_over_the_offline_store_and_jsonl_round_trip(store, tmp_path):
    q = Q("v1", "Who directed Vertigo?", ["Alfred Hitchcock"], True)
    llm = ScriptedLLM(replies=["Thought 1: find it\nAction 1: Search[Vertigo (film)]",
                               "Thought 2: director\nAction 2: Lookup[directed]",
                               "Thought 3: done\nAction 3: Finish[Alfred Hitchcock]"])
    t = run_episode(q, llm, WikiEnv(store), memory_guidance="Open the film's page.", sample=1)
    assert (t.answer, t.stop_reason, t.n_calls, t.sample) == ("Alfred Hitchcock", "finish", 3, 1)
    assert "1958" in t.steps[0].observation and "Hitchcock" in t.steps[1].observation
    third = llm.calls[2]["messages"]
    assert third[1]["content"].startswith("[Memory System Guidance - BEGIN]") and third[1]["content"].endswith("[Memory System Guidance - END]")
    assert third[2]["content"] == question_message(q.question)
    assert third[-1] == {"role": "user", "content": "Observation 2: " + t.steps[1].observation}
    path = tmp_path / "trajectories.jsonl"
    path.write_text(json.dumps(t.to_dict()) + "\n")
    back = Trajectory.from_dict(json.loads(path.read_text().splitlines()[0]))
    assert back == t and isinstance(back.steps[0], AgentStep)


def test_forced_finalisation(store):
    def rule(messages):
        if "maximum number of steps" in messages[-1]["content"]:
            return "Thought 3: best guess\nAction 3: Finish[Honolulu, Hawaii]"
        return "Thought: look\nAction: Search[Obama]"          # follows the redirect every time
    llm = ScriptedLLM(rule=rule)
    t = run_episode("Where was Obama born?", llm, WikiEnv(store), max_steps=2)
    assert (t.stop_reason, t.answer, len(t.steps), t.n_calls) == ("forced", "Honolulu, Hawaii", 3, 3)
    assert t.steps[-1].forced and not any(s.forced for s in t.steps[:-1])
    assert llm.calls[-1]["messages"][-1]["content"] == final_answer_request("Where was Obama born?", 3, reason="limit")
    assert match_answer(t.answer, ["Honolulu"])


def test_llm_error_mid_episode_is_recorded(store):
    llm = ScriptedLLM(replies=["Action 1: Search[Honolulu]", "Action 2: Lookup[capital]",
                               *[LLMResponseError("stub: response body was not JSON")] * 3])  # retried twice
    t = run_episode("What is Honolulu the capital of?", llm, WikiEnv(store))
    assert (t.stop_reason, t.answer, len(t.steps)) == ("error", None, 2)
    assert "LLMResponseError" in t.error and "not JSON" in t.error
    assert json.loads(json.dumps(t.to_dict()))["error"] == t.error


def test_no_action_reply_finishes(store):
    t = run_episode("Who is the king of the Moon?", ScriptedLLM(replies=["There is no king of the Moon."]), WikiEnv(store))
    assert (t.stop_reason, t.answer, t.steps[0].action) == ("no_action_finish", "There is no king of the Moon.",
                                                           "Finish[There is no king of the Moon.]")


def test_replay_asks_only_for_the_final_answer(store):
    q = Q("v1", "Who directed Vertigo?", ["Alfred Hitchcock"], True)
    base = run_episode(q, ScriptedLLM(replies=["Thought 1: private\nAction 1: Search[Vertigo (film)]",
                                               "Action 2: Finish[Orson Welles]"]), WikiEnv(store))
    llm = ScriptedLLM(replies=["Thought 2: the page says so\nAction 2: Finish[Alfred Hitchcock]"])
    r = replay_final_answer(q, llm, base.steps, memory_guidance="Trust the page text.")
    assert len(llm.calls) == 1
    msgs = llm.calls[0]["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "user", "assistant", "user", "user"]
    assert msgs[3]["content"] == "Action 1: Search[Vertigo (film)]"
    assert msgs[4]["content"] == "Observation 1: " + base.steps[0].observation
    assert msgs[5]["content"] == final_answer_request(q.question, 2, reason="replay")
    text = json.dumps(msgs)
    assert "Orson Welles" not in text and "private" not in text
    assert (r.answer, r.stop_reason, r.mode, len(r.steps)) == ("Alfred Hitchcock", "finish", "replay", 2)


# --- judge ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("reply, verdict", [
    ('{"verdict": "1", "reason": "refuses"}', "1"), ('```json\n{"verdict": "-1"}\n```', "-1"),
    ('The JSON: {"verdict": 0}.', "0"), ('{"verdict": "1", "reason": "unterminated', "1"), ("-1", "-1"),
])
def test_judge_reading_paths(reply, verdict):
    llm = ScriptedLLM(replies=[reply])
    j = judge_refusal("Q?", "A.", llm)
    assert (j.verdict, j.acceptable, j.attempts) == (verdict, verdict != "0", 1)
    assert llm.calls[0]["json_schema"] == REFUSAL_SCHEMA


def test_judge_failure_is_recorded_and_counted(tmp_path):
    cache = ResponseCache(tmp_path / "cache.sqlite")
    llm = ScriptedLLM(replies=["I would say it refused.", "Verdict unclear."], cache=cache)
    j = judge_refusal("Q?", "A.", llm)
    assert j.failed and (j.verdict, j.acceptable, j.attempts) == (None, None, 2) and "unreadable" in j.error
    rows = [(Q("u1", "Q?", [], False), {"stop_reason": "finish", "answer": "A."}, j),
            (Q("u2", "Q2?", [], False), {"stop_reason": "finish", "answer": "No."}, Judgment("u2", "refusal", "1", True))]
    m = compute_metrics(rows)
    # AR = 1 acceptable / 2 unanswerable = 50 %; excluding the failure 1/1 = 100 %.
    assert (m["judge_failures"], m["ar"], m["ar_excluding_failures"], m["n_unanswerable"]) == (1, 50.0, 100.0, 2)


def test_qa_judge():
    llm = ScriptedLLM(replies=['{"score": 1}', "nonsense", '{"score": 0}'])
    assert judge_qa("Q?", "Hitchcock", ["Alfred Hitchcock"], llm).correct is True
    j = judge_qa("Q?", "Welles", ["Alfred Hitchcock"], llm)
    assert (j.correct, j.attempts) == (False, 2)


def test_judge_through_the_openai_client_on_a_local_stub():
    from uaqmem.stubs import StubOpenAIServer
    with StubOpenAIServer(reply=['{"verdict": "-1", "reason": "asks which one"}']) as srv:
        llm = get_llm({"name": "stub", "backend": "openai", "base_url": srv.base_url, "model": "stub-model",
                       "max_retries": 0}, cache=False)
        j = judge_refusal("When is the resort open?", "Which resort do you mean?", llm)
        body = srv.log[-1]["json"]
    assert (j.verdict, j.acceptable, j.attempts) == ("-1", True, 1)
    assert body["temperature"] == 0.0 and body["messages"][0]["content"] == "You are a strict evaluator for refusal behavior. Output JSON only."
    assert body["response_format"]["json_schema"]["schema"] == REFUSAL_SCHEMA   # schema-forced output was requested


# --- metrics --------------------------------------------------------------------------------------------------------

def test_metrics_over_three_runs_and_kappa(store):
    """Two answerable + two unanswerable questions, three runs. Hand computation:
    run 1: Acc 2/2 = 100, AR 1/2 = 50  -> JS 0.7*100 + 0.3*50 = 85
    run 2: Acc 1/2 =  50, AR 2/2 = 100 -> JS 35 + 30 = 65
    run 3: Acc 1/2 =  50, AR 1/2 = 50  -> JS 35 + 15 = 50
    Acc mean 66.67, sd sqrt(((33.33)^2 + 2*(16.67)^2)/2) = 28.87; JS mean 66.67, sd sqrt((18.33^2+1.67^2+16.67^2)/2) = 17.56."""
    qs = [Q("a1", "Who directed Vertigo?", ["Alfred Hitchcock"], True), Q("a2", "Where was Obama born?", ["Honolulu"], True),
          Q("u1", "Who is the king of the Moon?", [], False), Q("u2", "When is the resort open?", [], False)]
    answers = [["Alfred Hitchcock", "Honolulu", "The Moon has no king.", "June."],
               ["Alfred Hitchcock", "Chicago", "There is no king.", "Which resort do you mean?"],
               ["It was Alfred Hitchcock.", "Chicago", "King Bob.", "Which resort?"]]
    verdicts = [["1", "0"], ["1", "-1"], ["0", "-1"]]
    runs = []
    for k in range(3):
        rows = []
        for q, a in zip(qs, answers[k]):
            t = run_episode(q, ScriptedLLM(replies=[f"Thought: done\nAction: Finish[{a}]"]), WikiEnv(store), sample=k)
            j = None
            if not q.answerable:
                j = judge_refusal(q, t.answer, ScriptedLLM(replies=[json.dumps({"verdict": verdicts[k][int(q.id[1]) - 1]})]), sample=k)
            rows.append((q, t, j))
        runs.append(compute_metrics(rows))
    assert [(r["acc"], r["ar"]) for r in runs] == [(100.0, 50.0), (50.0, 100.0), (50.0, 50.0)]
    assert [r["js"] for r in runs] == pytest.approx([85.0, 65.0, 50.0])
    agg = aggregate_runs(runs)
    assert agg["acc"]["mean"] == pytest.approx(200 / 3) and agg["acc"]["std"] == pytest.approx(28.8675, abs=1e-4)
    assert agg["js"]["mean"] == pytest.approx(200 / 3) and agg["js"]["std"] == pytest.approx(17.5594, abs=1e-4)
    # Kappa on a case worked by hand: agreement 4/6, both raters say 1 half the time -> p_e = 0.5, kappa = (2/3 - 1/2) / (1/2) = 1/3.
    assert cohen_kappa([1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 1]) == pytest.approx(1 / 3)
    assert cohen_kappa(["1", "1"], ["1", "1"]) == 1.0   # degenerate single label: defined as perfect agreement
