"Behaviour of uaqmem.uplift: the exact-zero empty set, beam search, probe budgets, training, memory admission."
import numpy as np
import pytest
import torch

from uaqmem.uplift import (PROBE_STRATEGIES, TrainConfig, UpliftScorer, admit_memory, beam_search_sets, build_probe_pool,
                           decision_metrics, local_family, make_synthetic_bench, pad_sets, predict_uplift, retrieve_learned,
                           retrieve_similarity, scorer_set_fn, select_probes, train_uplift, warm_up)


@pytest.fixture(scope="module")
def small():
    return make_synthetic_bench(n_topics=4, tasks_per_topic=20, no_help_topics=1, dim=32, seed=3)


def test_bench_is_seeded_and_has_the_advertised_structure(small):
    again = make_synthetic_bench(n_topics=4, tasks_per_topic=20, no_help_topics=1, dim=32, seed=3)
    np.testing.assert_array_equal(small.task_emb, again.task_emb)
    np.testing.assert_array_equal(small.candidates, again.candidates)
    other = make_synthetic_bench(n_topics=4, tasks_per_topic=20, no_help_topics=1, dim=32, seed=4)
    assert not np.allclose(small.task_emb, other.task_emb)
    kinds = set(small.kind)
    assert {"positive", "neutral", "harmful", "complement"} <= kinds
    for t in small.train_tasks[:10]:
        assert small.uplift(t, []) == 0.0
        topic_harm = [m for m in np.flatnonzero(small.kind == "harmful") if small.mem_topic[m] == small.task_topic[t]]
        assert all(small.uplift(t, [m]) < 0 for m in topic_harm)
    # the noise-free best decision is sometimes "no memory" (a no-help topic), sometimes a set
    best = [small.best_uplift(t) for t in small.test_tasks]
    assert min(best) <= 1e-12 < max(best)


def test_empty_set_scores_exactly_zero_in_every_mode(small):
    torch.manual_seed(0)
    sc = UpliftScorer(dim=32, hidden=16, dropout=0.5)
    with torch.no_grad():
        sc.bias.fill_(3.0)  # a large calibration offset must not leak into the empty set
    tasks = [0, 1, 2, 3]
    sets = [[], [1], [], [1, 2]]
    for n in (0, 8):
        p = predict_uplift(sc, small.task_emb, small.mem_emb, tasks, sets, n_samples=n)
        p = p.reshape(-1, 4)
        assert (p[:, [0, 2]] == 0).all() and (p[:, [1, 3]] != 0).all()
    sc.train()
    out = sc(torch.as_tensor(small.task_emb[:3]), torch.as_tensor(small.mem_emb), pad_sets([[], [], []], 2))
    assert out.eq(0).all()
    out.sum().backward()  # the masked output still participates in autograd without NaNs


def _table_scorer(values):
    asked = []
    def score(task, sets):
        asked.extend(sets)
        return [values[s] for s in sets]
    return score, asked


def test_beam_search_keeps_negative_intermediates_and_dedups():
    f = frozenset
    values = {f(): 0.0, f("a"): -0.1, f("b"): -0.1, f("c"): 0.05, f("d"): -0.3,
              f("ab"): 0.8, f("ac"): -0.2, f("bc"): -0.2, f("ad"): -0.5, f("bd"): -0.5, f("cd"): -0.4}
    score, asked = _table_scorer(values)
    r = beam_search_sets(score, None, ["a", "b", "c", "d"], width=2, max_size=2)
    assert r.best == f("ab") and r.value == pytest.approx(0.8)
    assert len(asked) == len(set(asked))  # {a, b} reached via a and via b is scored once
    ranked_sets = [s for s, _ in r.ranked]
    assert len(ranked_sets) == len(set(ranked_sets)) and f() in ranked_sets
    assert [v for _, v in r.ranked] == sorted((v for _, v in r.ranked), reverse=True)
    assert beam_search_sets(score, None, ["a", "b", "c", "d"], width=1).best == f("c")


def test_beam_search_returns_empty_set_when_every_gain_is_negative():
    r = beam_search_sets(lambda t, ss: [-0.1 * len(s) - 0.05 for s in ss], None, list("abcde"), width=2, max_size=3)
    assert r.best == frozenset() and r.value == 0.0


def test_beam_search_masks_used_and_excluded_items():
    seen = []
    def score(task, sets):
        seen.extend(sets)
        return [sum(ord(c) for c in s) / 100 for s in sets]  # always rewards more items
    r = beam_search_sets(score, None, list("abcda"), width=3, max_size=3, exclude={"d"})
    assert all("d" not in s for s in seen)
    assert all(len(s) <= 3 for s in seen)
    assert r.best == frozenset("abc")
    with pytest.raises(ValueError, match="width"):
        beam_search_sets(score, None, ["a"], width=0)


def test_beam_search_with_the_torch_scorer(small):
    torch.manual_seed(1)
    sc = UpliftScorer(dim=32, hidden=16)
    t = int(small.test_tasks[0])
    r = beam_search_sets(scorer_set_fn(sc, small.task_emb, small.mem_emb), t, list(small.candidates[t]))
    assert len(r.best) <= 2 and r.best <= set(small.candidates[t].tolist())


def test_probe_selection_respects_budget_on_a_real_pool(small):
    cfg = TrainConfig(hidden=16, warmup_steps=30, mc_samples=8)
    scorer, _ = warm_up(small, cfg, seed=0)
    pool = build_probe_pool(scorer, small, small.train_tasks[:15], n_samples=8)
    assert len(pool.sets) > 20 and all(len(s) > 0 for s in pool.sets)  # the empty set is never a probe
    assert (pool.evsi >= 0).all() and np.isfinite(pool.log_evsi[pool.evsi > 0]).all()
    rng = np.random.default_rng(0)
    costs = rng.integers(1, 4, size=len(pool.sets)).astype(float)
    for strategy in PROBE_STRATEGIES:
        for budget in (0, 1, 7, 20):
            idx = select_probes(strategy, budget, pool, np.random.default_rng(1))
            assert len(idx) == min(budget, len(pool.sets)) and len(set(idx.tolist())) == len(idx)
            idx = select_probes(strategy, budget, pool, np.random.default_rng(1), costs=costs)
            assert costs[idx].sum() <= budget
    idx = select_probes("evsi", 5, pool)
    top = np.sort(pool.evsi)[::-1][:5]
    np.testing.assert_allclose(np.sort(pool.evsi[idx])[::-1], top)
    with pytest.raises(ValueError, match="budget"):
        select_probes("random", -1, pool)


def test_local_family_covers_extend_replace_stop():
    fam = local_family({1, 2}, [1, 2, 3, 4], max_size=3)
    kinds = {k for k, _, _ in fam}
    assert kinds == {"extend", "replace", "stop"}
    rivals = [b for _, _, b in fam]
    assert len(rivals) == len(set(rivals)) and frozenset({1, 2}) not in rivals
    assert frozenset({1, 2, 3}) in rivals and frozenset({1, 4}) in rivals and frozenset({2}) in rivals


def test_training_reduces_loss_and_beats_similarity_top2(small):
    cfg = TrainConfig(hidden=32, warmup_steps=150, rounds=2, steps_per_round=40, probes_per_round=10, mc_samples=8)
    res = train_uplift(small, cfg, seed=0)
    w = res.history["warmup"]
    assert np.mean(w[-10:]) < 0.7 * np.mean(w[:10])
    assert res.rollouts["probe"] == 20 and sum(o.source == "probe" for o in res.observations) == 20
    tasks = small.test_tasks
    learned = decision_metrics(small, tasks, retrieve_learned(res.scorer, small, tasks))
    similar = decision_metrics(small, tasks, retrieve_similarity(small, tasks, 2))
    assert learned["decision_accuracy"] > similar["decision_accuracy"] + 0.2, (learned, similar)
    assert learned["mean_uplift"] > similar["mean_uplift"]


def test_admit_memory_admits_revises_rejects():
    uplift = {"a": 0.2, "b": -0.3, "b'": -0.1, "b''": 0.4, "c": -0.5, "c'": -0.2, "c''": -0.6, "c'''": -0.3, "c''''": 0.9}
    calls = []
    def validate(m):
        calls.append(m)
        return uplift[m]
    revise = lambda m, u: m + "'"
    r = admit_memory("a", validate, revise)
    assert (r.admitted, r.memory, calls) == (True, "a", ["a"])
    calls.clear()
    r = admit_memory("b", validate, revise)
    assert (r.admitted, r.memory, r.uplift) == (True, "b''", 0.4) and calls == ["b", "b'", "b''"]
    calls.clear()
    r = admit_memory("c", validate, revise)  # three revisions are not enough: c'''' is never tried
    assert (r.admitted, r.memory, r.uplift) == (False, "c'", -0.2)
    assert calls == ["c", "c'", "c''", "c'''"] and len(r.versions) == 4
    zero = admit_memory("x", lambda m: 0.0, revise, max_revisions=1)
    assert not zero.admitted  # admission needs strictly positive singleton uplift
    with pytest.raises(ValueError, match="non-finite"):
        admit_memory("x", lambda m: float("nan"), revise)
