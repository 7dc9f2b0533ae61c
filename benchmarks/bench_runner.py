"""Runner throughput and table regeneration.

1. Episodes per minute for 64 episodes whose model is a stub OpenAI-compatible server on 127.0.0.1 answering scripted
   ReAct steps after 200 ms, at concurrency 1 and 16 (target ratio >= 12).
2. Time to regenerate Table 1 (papermill, the real notebook) from finished runs: the second execution must make zero
   model calls.
Prints one JSON line last.
"""
import dataclasses
import gzip
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_runner import PAGES, scripted_reply  # the same scripted ReAct model as the reliability test

from uaqmem.stubs import StubOpenAIServer


def main():
    tmp = Path(tempfile.mkdtemp(prefix="bench-runner-"))
    os.environ["UAQMEM_CACHE"] = str(tmp / "cache")
    os.environ["UAQMEM_STUB_KEY"] = "stub-key"
    corpus = tmp / "pages.jsonl.gz"
    with gzip.open(corpus, "wt") as f:
        for p in PAGES:
            f.write(json.dumps(p) + "\n")
    from uaqmem.runner import ExperimentConfig, run_experiment
    from uaqmem.llm import get_llm

    out = {}
    with StubOpenAIServer(scripted_reply, latency_s=0.2) as stub:
        prof = {"backend": "openai", "name": "stub", "model": "stub-model", "base_url": stub.url + "/v1",
                "api_key_env": "UAQMEM_STUB_KEY", "max_concurrency": 32, "timeout_s": 10}
        for conc in (1, 16):
            cfg = ExperimentConfig(dataset="kuq_test", agent_profile=prof, judge_profile=prof, wiki=f"offline:{corpus}",
                                   n_questions=64, runs=1, concurrency=conc, runs_dir=str(tmp / f"runs-c{conc}"))
            calls0 = stub.calls
            t0 = time.perf_counter()
            run_experiment(cfg, agent_llm=get_llm(prof, cache=False), judge_llm=get_llm(prof, cache=False), progress=False)
            dt = time.perf_counter() - t0
            out[f"episodes_per_min_c{conc}"] = round(64 / dt * 60, 1)
            out[f"model_calls_c{conc}"] = stub.calls - calls0
            print(f"concurrency {conc}: {dt:.1f} s for 64 episodes ({stub.calls - calls0} model calls)", file=sys.stderr)
        out["ratio_c16_vs_c1"] = round(out["episodes_per_min_c16"] / out["episodes_per_min_c1"], 2)

        import papermill as pm
        params = dict(agent_profiles=[prof], judge_profile=prof, wiki=f"offline:{corpus}", n_questions=8, runs=1,
                      concurrency=8, runs_dir=str(tmp / "runs-table1"), figures_dir=str(tmp / "figures"),
                      params_set="bench-stub", methods=[])  # the No-memory and Human Hint rows
        timings = []
        for attempt in range(2):
            calls0 = stub.calls
            t0 = time.perf_counter()
            pm.execute_notebook(str(ROOT / "nbs/experiments/table1.ipynb"), str(tmp / f"table1-{attempt}.ipynb"),
                                parameters=params, cwd=str(ROOT), progress_bar=False)
            timings.append((time.perf_counter() - t0, stub.calls - calls0))
        out["table1_first_s"] = round(timings[0][0], 2)
        out["table1_first_model_calls"] = timings[0][1]
        out["table1_regenerate_s"] = round(timings[1][0], 2)
        out["table1_regenerate_model_calls"] = timings[1][1]
    out["targets"] = {"ratio_c16_vs_c1": ">= 12", "table1_regenerate_model_calls": 0}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
