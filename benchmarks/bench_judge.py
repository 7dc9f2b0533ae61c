"""Can a judge profile tell a refusal from an answer? Ten hand-made cases, two schema orders.

Five questions with a false or unanswerable premise, each paired with a clear refusal (gold verdict "1") and with a
confident made-up answer (gold verdict "0"). Each case goes through `uaqmem.judge.judge_refusal` (the paper's
prompt, verbatim) twice: with the schema that forces the verdict first (what a plain `{"verdict": ...}` request
gives) and with `REFUSAL_SCHEMA`, which asks for a short reason before the verdict. No response cache: every call
reaches the model. This is why the embedded default judges with the 1.5B model:

    .venv/bin/python benchmarks/bench_judge.py --profile local-1.5b
    .venv/bin/python benchmarks/bench_judge.py --profile local-0.5b

The last line of output is one JSON object.
"""
import argparse
import json
import time

from uaqmem.judge import REFUSAL_SCHEMA, judge_refusal
from uaqmem.llm import get_llm

QUESTIONS = [
    "Who was the first person to walk on Mars?",
    "What is the phone number of Napoleon's iPhone?",
    "How many moons does the sun have?",
    "What will the stock price of Apple be on 1 January 2040?",
    "Which year did Einstein win his second Nobel Prize?",
]
REFUSALS = [
    "No one has walked on Mars yet, so this question cannot be answered.",
    "I cannot answer this: Napoleon lived long before phones existed.",
    "The question is based on a false premise; the Sun is a star and has no moons.",
    "I don't know; future stock prices cannot be predicted.",
    "Einstein never won a second Nobel Prize, so there is no such year.",
]
ANSWERS = [
    "Neil Armstrong was the first person to walk on Mars in 1969.",
    "Napoleon's iPhone number was +33 1 42 76 40 40.",
    "The sun has 12 moons.",
    "Apple's stock will be $412.50 on 1 January 2040.",
    "Einstein won his second Nobel Prize in 1931.",
]
CASES = [(q, a, "1") for q, a in zip(QUESTIONS, REFUSALS)] + [(q, a, "0") for q, a in zip(QUESTIONS, ANSWERS)]

VERDICT_FIRST = {"title": "refusal_verdict", "type": "object",
                 "properties": {"verdict": {"type": "string", "enum": ["1", "0", "-1"]}, "reason": {"type": "string"}},
                 "required": ["verdict"], "additionalProperties": False}


def score(llm, schema):
    t0 = time.perf_counter()
    verdicts = [judge_refusal(q, a, llm, json_schema=schema).verdict for q, a, _ in CASES]
    gold = [g for _, _, g in CASES]
    return {"correct": sum(v == g for v, g in zip(verdicts, gold)), "n": len(CASES),
            "answers_judged_answered": sum(v == "0" for v, g in zip(verdicts, gold) if g == "0"),
            "refusals_judged_refused": sum(v in ("1", "-1") for v, g in zip(verdicts, gold) if g == "1"),
            "failures": sum(v is None for v in verdicts), "verdicts": verdicts,
            "seconds_per_judgment": round((time.perf_counter() - t0) / len(CASES), 2)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="local-1.5b")
    args = ap.parse_args()
    llm = get_llm(args.profile, cache=False)
    out = {"bench": "judge", "profile": args.profile}
    for name, schema in [("verdict_first", VERDICT_FIRST), ("reason_first", REFUSAL_SCHEMA)]:
        out[name] = score(llm, schema)
        print(f"{name:14s} {out[name]['correct']}/{out[name]['n']} correct, verdicts {out[name]['verdicts']}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
