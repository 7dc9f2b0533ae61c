"""Every experiment notebook runs end to end with the smoke params (scripted model, three-page corpus) and writes
its table beside the paper's values; finished runs and memory banks are shared between the notebooks."""
import math
import os
from pathlib import Path

import pandas as pd
import pytest

from uaqmem.paper import TABLE1, TABLE2, TABLE3, TABLE3_DELTA, TABLE14, TABLE16, TABLE18, TABLE19, TABLE20, TABLE5
from uaqmem.reproduce import notebook_params

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "params" / "smoke.yaml"
METHODS = ["Expel", "MemEvolve", "AWM", "AgentKB"]
CONTENT = ["Compact trajectory", "Principle", "Insight", "Success trace", "Workflow"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    "Run a notebook with the smoke params into a shared temporary runs/figures folder; returns the figures folder."
    import papermill as pm
    tmp = tmp_path_factory.mktemp("smoke")
    names, params = notebook_params(SMOKE)
    params.update(runs_dir=str(tmp / "runs"), figures_dir=str(tmp / "figures"))
    done = {}

    def run(name, **overrides):
        key = (name, tuple(sorted(overrides.items())))
        if key not in done:
            figs = tmp / "figures" if not overrides else tmp / f"figures-{name}-{len(done)}"
            old = os.environ.get("UAQMEM_CACHE")
            os.environ["UAQMEM_CACHE"] = str(tmp / "cache")
            try:
                pm.execute_notebook(str(ROOT / "nbs" / "experiments" / f"{name}.ipynb"), str(tmp / f"{name}-{len(done)}.ipynb"),
                                    parameters={**params, "figures_dir": str(figs), **overrides}, cwd=str(ROOT),
                                    progress_bar=False, kernel_name="python3")
            finally:
                if old is None:
                    os.environ.pop("UAQMEM_CACHE", None)
                else:
                    os.environ["UAQMEM_CACHE"] = old
            done[key] = figs
        return done[key]

    run.names, run.tmp = names, tmp
    return run


def md_rows(path):
    "{block heading: {row label: {column header: cell text}}} from a written markdown table file."
    blocks, heading, header = {}, "", None
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.startswith("### "):
            heading, header = line[4:], None
        elif line.startswith("|---"):
            continue
        elif line.startswith("| "):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = cells
            else:
                blocks.setdefault(heading, {})[cells[0]] = dict(zip(header[1:], cells[1:]))
    return blocks


def check_paper_columns(csv, lookup, metrics=("AR", "Acc", "JS")):
    "Each per-cell line carries the paper's value for its row and column (NaN only where the paper has none)."
    for _, r in csv.iterrows():
        for i, m in enumerate(metrics):
            expect = lookup(r, i)
            got = r[f"paper_{m}"]
            assert (expect is None and math.isnan(got)) or got == pytest.approx(expect), (r["row"], r["column"], m, got, expect)


def test_smoke_params_name_every_experiment_notebook():
    names, params = notebook_params(SMOKE)
    assert set(names) == {p.stem for p in (ROOT / "nbs" / "experiments").glob("*.ipynb")} - {"uplift_synthetic"}
    assert params["agent_profiles"][0]["backend"] == "scripted" and params["embedder"].startswith("hash:")
    assert (ROOT / params["wiki"].split(":", 1)[1]).exists()


def test_table1(smoke):
    figs = smoke("table1")
    blocks = md_rows(figs / "table1.md")
    check = blocks.pop("Judge check (unanswerable answers: LLM judge vs the offline keyword judge)")
    assert set(next(iter(check.values()))) >= {"n_judged", "kappa", "agreement_pct"}
    (heading, rows), = blocks.items()
    assert heading == "Agent: world (paper: DeepSeek-V3.2)"
    assert list(rows) == ["No-memory", "Human Hint", *METHODS]
    assert rows["Human Hint"]["KUQ AR paper"] == "60.67" and rows["AgentKB"]["UAQFact JS paper"] == "62.65"
    csv = pd.read_csv(figs / "table1.csv")
    assert len(csv) == 12 and set(csv["column"]) == {"KUQ", "UAQFact"}
    check_paper_columns(csv, lambda r, i: TABLE1["DeepSeek-V3.2"][r["row"]][r["column"]][i])
    for _, r in csv.iterrows():   # the markdown shows the CSV's means
        assert rows[r["row"]][f"{r['column']} JS ours"] == f"{r['JS']:.2f}"
        assert r["JS"] == pytest.approx(0.7 * r["Acc"] + 0.3 * r["AR"])
        assert r["n"] == 4 and r["judge_failures"] == 0 and Path(r["run_root"]).is_dir()


def test_table2_reuses_table1_runs(smoke):
    t1 = pd.read_csv(smoke("table1") / "table1.csv")
    figs = smoke("table2")
    rows = md_rows(figs / "table2.md")["Agent: world (paper: DeepSeek-V3.2)"]
    assert list(rows) == ["Human Hint", *METHODS]
    csv = pd.read_csv(figs / "table2.csv")
    check_paper_columns(csv, lambda r, i: TABLE2["DeepSeek-V3.2"][r["row"]][r["column"]][i])
    hint = lambda df: set(df.loc[df["row"] == "Human Hint", "run_root"])
    assert hint(csv) == hint(t1), "the Human Hint runs were not shared with Table 1"
    assert not set(csv.loc[csv["row"] != "Human Hint", "run_root"]) & set(t1["run_root"])   # memory + hint runs are new


def test_table3(smoke):
    figs = smoke("table3")
    rows = md_rows(figs / "table3.md")["Agent: world (paper: DeepSeek-V3.2)"]
    assert list(rows) == ["No-memory", *METHODS]
    assert rows["AgentKB"]["UAQFact→RefuNQ ΔJS paper"] == "2.65"
    csv = pd.read_csv(figs / "table3.csv")
    assert set(csv["column"]) == {"KUQ→UAQFact", "KUQ→RefuNQ", "UAQFact→KUQ", "UAQFact→RefuNQ"} and len(csv) == 20
    check_paper_columns(csv, lambda r, i: TABLE3["DeepSeek-V3.2"][r["row"]][r["column"]][i])
    nomem = csv[csv["row"] == "No-memory"].set_index("column")
    for _, r in csv.iterrows():
        assert r["ΔJS"] == pytest.approx(r["JS"] - nomem.loc[r["column"], "JS"])
        paper_delta = TABLE3_DELTA["DeepSeek-V3.2"].get(r["row"], {}).get(r["column"], 0.0)
        assert r["paper_ΔJS"] == pytest.approx(paper_delta)
    # one No-memory run on RefuNQ serves both RefuNQ columns
    assert nomem.loc["KUQ→RefuNQ", "run_root"] == nomem.loc["UAQFact→RefuNQ", "run_root"]


def test_table4_two_profiles(smoke):
    figs = smoke("table4")
    blocks = md_rows(figs / "table4.md")
    assert len(blocks) == 4
    for agent, other in (("world", "world-b"), ("world-b", "world")):
        head = f"Agent: {agent} using memory built by {other} (paper: DeepSeek-V3.2)"
        t4, t14 = blocks[head + ", Table 4"], blocks[head + ", Table 14"]
        assert list(t4) == METHODS and list(t14) == METHODS
        assert t4["AWM"]["KUQ Δ_C−B paper"] == "1.25" and t14["Expel"]["KUQ AR paper"] == f"{TABLE14['DeepSeek-V3.2']['Expel'][0]:.2f}"
    csv = pd.read_csv(figs / "table4.csv")
    assert len(csv) == 2 * (1 + 2 * len(METHODS))
    cross = csv[csv["column"] == "cross"]
    assert set(zip(cross["agent"], cross["builder"])) == {("world", "world-b"), ("world-b", "world")}


def test_table4_single_profile_is_skipped(smoke):
    figs = smoke("table4", cross_profiles=None)
    text = (figs / "table4.md").read_text()
    assert "**Skipped**" in text and "world" in text
    assert md_rows(figs / "table4.md") == {}


def test_figure2_and_table15(smoke):
    figs = smoke("figure2")
    assert (figs / "figure2.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = md_rows(figs / "table15.md")["Agent: world (paper: DeepSeek-V3.2)"]
    assert list(rows) == METHODS
    for m in METHODS:
        for ds in ("KUQ", "UAQFact"):
            for j, ch in enumerate(("G", "T", "G&T")):
                assert rows[m][f"{ds} {ch} paper"] == f"{TABLE16['DeepSeek-V3.2'][m][ch][ds][2]:.2f}"
    csv = pd.read_csv(figs / "table15.csv", keep_default_na=False)
    assert set(csv["channel"]) == {"", "G", "T", "G&T"} and len(csv) == 2 * (1 + 3 * len(METHODS))
    # G&T is the ordinary memory run: the same directory as Table 1's
    t1 = pd.read_csv(smoke("table1") / "table1.csv")
    gt = set(csv.loc[csv["channel"] == "G&T", "run_root"])
    assert gt <= set(t1["run_root"])


def test_table5(smoke):
    figs = smoke("table5")
    rows = md_rows(figs / "table5.md")["Agent: world (paper: DeepSeek-V3.2)"]
    assert list(rows) == ["No-memory", *CONTENT]
    check_paper_columns(pd.read_csv(figs / "table5.csv"), lambda r, i: TABLE5["DeepSeek-V3.2"][r["row"]][r["column"]][i])


def test_table6(smoke):
    figs = smoke("table6")
    rows = md_rows(figs / "table6.md")["Agent: world (paper: DeepSeek-V3.2)"]
    assert list(rows) == list(TABLE18["DeepSeek-V3.2"])
    assert "Table 6 vs Table 18" in (figs / "table6.md").read_text()
    check_paper_columns(pd.read_csv(figs / "table6.csv"), lambda r, i: TABLE18["DeepSeek-V3.2"][r["row"]][i])


def test_table7_with_balanced_variant(smoke):
    figs = smoke("table7")
    blocks = md_rows(figs / "table7.md")
    assert list(blocks) == ["Agent: world (paper: DeepSeek-V3.2)",
                            "Agent: world (paper: DeepSeek-V3.2), quantity-balanced (paper: Table 20)"]
    for rows in blocks.values():
        assert list(rows) == ["No-memory", "Compact trajectory", "Principle", "Insight"]
    csv = pd.read_csv(figs / "table7.csv")
    assert len(csv) == 2 * (1 + 3 * 3)

    def lookup(r, i):
        table = TABLE20 if r["balanced"] else TABLE19
        return table["DeepSeek-V3.2"][r["row"]].get(r["column"], (None,) * 3)[i]
    check_paper_columns(csv, lookup)
    # the "Both" column is Table 5's KUQ run of the same content type
    t5 = pd.read_csv(smoke("table5") / "table5.csv")
    both = csv[(csv["column"] == "Both") & ~csv["balanced"]]
    assert set(both["run_root"]) <= set(t5["run_root"])


def test_runs_and_banks_are_shared_across_tables(smoke):
    for name in smoke.names:
        smoke(name)
    runs = smoke.tmp / "runs"
    assert len(list(runs.glob("kuq_test__world__nomem__nohint__*/summary.json"))) == 1
    assert len(list(runs.glob("kuq_train__world__nomem__*/summary.json"))) == 1
    banks = [p for p in (runs / "memory").iterdir() if (p / "bank.json").exists()]
    # 4 methods x 2 splits + world-b's 4 + 5 types x 2 splits + 8 pairs + (3 types x 2 one-sided sources) + 3 x 3 balanced
    assert len(banks) == 8 + 4 + 10 + 8 + 6 + 9
    assert not list((runs / "memory").glob("*.partial"))
