"""Thorough checks of uaqmem.evsi: 50-digit references, Monte Carlo with a million draws, shape properties, the family bound and batch selection."""
import itertools
import math

import mpmath
import numpy as np
import pytest

from uaqmem.evsi import (aggregate_evsi, evsi, evsi_family_upper_bound, evsi_pair, evsi_threshold, log_evsi,
                         margin_std, preposterior_std, select_probe_batch)

mpmath.mp.dps = 50
SMALLEST_NORMAL = mpmath.mpf(np.finfo(float).tiny)

# From 50-digit arithmetic (shared/PROTOCOL.md); the last one only exists in log space.
REFERENCE = [((0.0, 1.0), 0.39894228040143268), ((0.5, 1.0), 0.19779655740130603), ((-0.5, 1.0), 0.19779655740130603),
             ((1.0, 1.0), 0.083315470587686298), ((0.5, 2.0), 0.57268939644716028), ((3.0, 1.0), 3.821543170477236e-4),
             ((2.0, 0.5), 3.5726292162028334e-6), ((10.0, 1.0), 7.474560254589328e-25)]


def evsi_mp(mu, s):
    "EVSI at 50 digits from the textbook closed form, for the exact doubles given."
    mu, s = mpmath.mpf(float(mu)), mpmath.mpf(float(s))
    z = abs(mu) / s
    return s * mpmath.npdf(z) - abs(mu) * mpmath.ncdf(-z)


@pytest.mark.parametrize("args,want", REFERENCE)
def test_protocol_reference_values(args, want):
    assert abs(evsi(*args) - want) <= 1e-14 * want
    assert abs(log_evsi(*args) - math.log(want)) <= 1e-13


def test_reference_below_double_range():
    # EVSI(40, 1) = 9.1283447229129724e-352: underflows as a double, exact in log space.
    want_log = math.log(9.1283447229129724) - 352 * math.log(10)
    assert evsi(40.0, 1.0) == 0.0
    assert abs(log_evsi(40.0, 1.0) - want_log) <= 1e-12 * abs(want_log)
    assert abs(log_evsi(40.0, 1.0) + 808.30) < 0.01


def _grid():
    zs = np.concatenate([np.linspace(0.0, 40.0, 801), np.linspace(9.9, 10.1, 41),
                         [38.5, 38.6, 38.7, 45.0, 60.0, 100.0, 1e3, 1e4, 1e6, 1e10, 1e50, 1e100, 1e150]])
    return [(z * s, s) for z in zs for s in (1e-3, 1.0, 37.0)]


def test_against_mpmath_grid():
    """Relative error <= 1e-10 for evsi wherever it is a normal double; for log_evsi |error| <= 1e-10 * max(1, |log|)
    (relative error of the log, and of EVSI itself where the log is small)."""
    worst_lin = worst_log = 0.0
    for mu, s in _grid():
        want = evsi_mp(mu, s)
        want_log = mpmath.log(want)
        got_log = log_evsi(mu, s)
        err_log = float(abs(got_log - want_log) / max(1, abs(want_log)))
        assert np.isfinite(got_log), (mu, s)
        assert err_log <= 1e-10, (mu, s, got_log, want_log)
        worst_log = max(worst_log, err_log)
        got = evsi(mu, s)
        if want > SMALLEST_NORMAL:
            err = float(abs(got - want) / want)
            assert err <= 1e-10, (mu, s, got, want)
            worst_lin = max(worst_lin, err)
        else:
            assert 0.0 <= got < 1e-300
    # The implementation is far better than the required bound; a regression to the naive formula is not.
    assert worst_lin < 1e-12 and worst_log < 1e-13


def test_naive_formula_is_measurably_worse():
    "Guard that the checks are demanding: the textbook formula in doubles loses digits with z and then underflows."
    from scipy.stats import norm
    for z in (20.0, 30.0, 37.0):
        naive = norm.pdf(z) - z * norm.cdf(-z)
        want = evsi_mp(z, 1.0)
        naive_err, our_err = float(abs(naive - want) / want), float(abs(evsi(z, 1.0) - want) / want)
        assert our_err < 1e-13 and naive_err > 10 * our_err, (z, naive_err, our_err)
    with np.errstate(divide="ignore"):
        assert np.log(norm.pdf(40.0) - 40.0 * norm.cdf(-40.0)) == -np.inf
    assert np.isfinite(log_evsi(40.0, 1.0))


@pytest.mark.parametrize("mu,s", [(0.0, 1.0), (0.5, 1.0), (-1.0, 0.7), (2.0, 1.5), (3.0, 1.0), (-0.2, 0.05)])
def test_monte_carlo_agreement(mu, s):
    rng = np.random.default_rng(abs(hash((mu, s))) % 2**32)
    post_mean = rng.normal(mu, s, 1_000_000)
    gain = np.maximum(post_mean, 0.0) - max(mu, 0.0)
    se = gain.std(ddof=1) / math.sqrt(gain.size)
    assert abs(gain.mean() - evsi(mu, s)) < 3 * se


def test_zero_resolvable_std():
    mu = np.array([-3.0, 0.0, 2.0, np.inf])
    assert np.all(evsi(mu, 0.0) == 0.0)
    assert np.all(log_evsi(mu, 0.0) == -np.inf)
    assert evsi(0.0, np.array([0.0, 1.0]))[0] == 0.0


def test_negative_std_is_an_error_naming_the_position():
    with pytest.raises(ValueError, match=r"s must be >= 0.*index \(1, 0\)"):
        evsi(0.0, np.array([[1.0], [-2.0]]))
    with pytest.raises(ValueError, match="s must be >= 0"):
        log_evsi(1.0, -1e-300)


def test_properties_random():
    rng = np.random.default_rng(0)
    mu = rng.normal(0, 5, 20_000) * rng.choice([1e-3, 1, 1e3], 20_000)
    s = rng.uniform(0.01, 5, 20_000) * rng.choice([1e-3, 1, 1e3], 20_000)
    # Symmetry in mu, exactly.
    assert np.array_equal(evsi(mu, s), evsi(-mu, s))
    assert np.array_equal(log_evsi(mu, s), log_evsi(-mu, s))
    # Bounds: 0 <= EVSI <= s*phi(0), and EVSI <= s*phi(z)/z^2 (first term of the asymptotic series).
    v = evsi(mu, s)
    assert np.all(v >= 0) and np.all(v <= s / math.sqrt(2 * math.pi) * (1 + 1e-15))
    z = np.abs(mu) / s
    big = z > 2
    upper = np.log(s[big]) - z[big] ** 2 / 2 - 0.5 * math.log(2 * math.pi) - 2 * np.log(z[big])
    assert np.all(log_evsi(mu, s)[big] <= upper + 1e-12 * np.maximum(1, np.abs(upper)))
    # Monotone: larger |mu| lowers it, larger s raises it (strictly, in log space).
    bump = 1 + rng.uniform(1e-3, 0.5, mu.size)
    nz = np.abs(mu) / s > 1e-4  # below this the change is under the log's double resolution
    assert np.all(log_evsi(mu[nz] * bump[nz], s[nz]) < log_evsi(mu[nz], s[nz]))
    assert np.all(log_evsi(mu, s * bump) > log_evsi(mu, s))
    # Scale: EVSI(c mu, c s) = c EVSI(mu, s).
    fine = v > 1e-300  # subnormal results carry few significant bits
    np.testing.assert_allclose(evsi(3 * mu, 3 * s)[fine], 3 * v[fine], rtol=1e-12)
    # exp(log_evsi) == evsi where representable.
    np.testing.assert_allclose(np.exp(log_evsi(mu, s))[fine], v[fine], rtol=1e-12)


def test_derivative_in_s_is_phi():
    # d EVSI / d s = phi(|mu|/s): central difference at a few points.
    for mu, s in [(0.3, 1.0), (2.0, 0.8), (-4.0, 1.1)]:
        h = 1e-5
        slope = (evsi(mu, s + h) - evsi(mu, s - h)) / (2 * h)
        assert abs(slope - math.exp(-0.5 * (mu / s) ** 2) / math.sqrt(2 * math.pi)) < 1e-8


def test_shapes_and_broadcasting():
    assert isinstance(evsi(1.0, 2.0), float)
    assert np.ndim(log_evsi(1, 2)) == 0
    assert evsi(np.zeros((2, 1, 3)), np.ones((4, 1))).shape == (2, 4, 3)
    assert log_evsi([1.0, 2.0], [[1.0], [2.0], [3.0]]).shape == (3, 2)
    assert evsi(np.zeros(0), 1.0).shape == (0,)
    mu = np.linspace(-60, 60, 24).reshape(2, 3, 4)
    s = np.linspace(0.5, 3, 4)
    out = log_evsi(mu, s)
    for idx in itertools.product(range(2), range(3), range(4)):
        assert out[idx] == log_evsi(mu[idx], s[idx[-1]])
    with pytest.raises(ValueError):
        evsi(np.zeros(3), np.ones(4))


def test_nan_propagates():
    assert np.isnan(evsi(np.nan, 1.0)) and np.isnan(log_evsi(1.0, np.nan))


def test_pair_and_threshold():
    assert evsi_pair(0.4, 0.1, 1.0, 0.5, 0.3) == pytest.approx(evsi(0.3, math.sqrt(0.9)), rel=1e-15)
    assert evsi_pair(0.4, 0.1, 1.0, 0.5, 0.3, resolved_fraction=0.25) == pytest.approx(evsi(0.3, math.sqrt(0.9) / 2), rel=1e-15)
    assert evsi_pair(0.4, 0.1, 1.0, 1.0, 1.0) == 0.0
    assert evsi_pair(40.0, 0.0, 0.5, 0.5, 0.0, log=True) == pytest.approx(log_evsi(40.0, 1.0), rel=1e-15)
    assert evsi_threshold(0.2, 4.0) == pytest.approx(evsi(0.2, 2.0), rel=1e-15)
    assert evsi_threshold(0.2, 4.0, threshold=1.0) == pytest.approx(evsi(-0.8, 2.0), rel=1e-15)
    assert evsi_threshold([0.1, 0.2], [[1.0], [2.0]]).shape == (2, 2)
    with pytest.raises(ValueError, match="not a valid covariance"):
        margin_std(1.0, 1.0, 1.5)
    with pytest.raises(ValueError, match="resolved_fraction"):
        evsi_threshold(0.2, 1.0, resolved_fraction=-0.1)
    with pytest.raises(ValueError, match="var_obs"):
        preposterior_std(0.1, -1.0)
    with pytest.raises(ValueError, match="not a valid covariance"):
        preposterior_std(0.1, 0.0)
    assert preposterior_std(0.0, 0.0) == 0.0


def test_correlated_pair_matches_simulation_of_the_probe():
    """Simulate the whole story: utilities, a noisy probe of option 1 only, the Bayes decision after it.
    The gain in realised utility must match evsi(mu1 - mu2, preposterior_std(...)) within 3 standard errors."""
    rng = np.random.default_rng(7)
    mu = np.array([0.25, 0.4])
    v1, v2, c, noise = 0.6, 0.5, 0.35, 0.2
    cov = np.array([[v1, c], [c, v2]])
    u = rng.multivariate_normal(mu, cov, 1_000_000)
    y = u[:, 0] + rng.normal(0, math.sqrt(noise), len(u))
    cov_dy, var_y = v1 - c, v1 + noise
    post_margin = (mu[0] - mu[1]) + cov_dy / var_y * (y - mu[0])
    realised = np.where(post_margin > 0, u[:, 0], u[:, 1]) - (u[:, 0] if mu[0] > mu[1] else u[:, 1])
    se = realised.std(ddof=1) / math.sqrt(len(u))
    want = evsi(mu[0] - mu[1], preposterior_std(cov_dy, var_y))
    assert abs(realised.mean() - want) < 3 * se
    assert want < evsi_pair(*mu, v1, v2, c)  # a one-sided noisy probe resolves less than the full margin


@pytest.mark.parametrize("k,seed", [(3, 1), (5, 2), (8, 3)])
def test_family_bound_dominates_monte_carlo(k, seed):
    rng = np.random.default_rng(seed)
    means = rng.normal(0, 0.3, k)
    a = rng.normal(0, 0.4, (k, k))
    cov = a @ a.T + 0.05 * np.eye(k)
    draws = rng.multivariate_normal(means, cov, 1_000_000)
    gain = draws.max(axis=1) - means.max()
    voi, se = gain.mean(), gain.std(ddof=1) / math.sqrt(len(gain))
    bound = evsi_family_upper_bound(means, cov)
    assert voi <= bound + 3 * se
    # The bound is at least the best single pairwise EVSI (it is a sum of them) and each term is a real lower piece.
    inc = int(np.argmax(means))
    pairs = [evsi_pair(means[inc], means[j], cov[inc, inc], cov[j, j], cov[inc, j]) for j in range(k) if j != inc]
    assert bound == pytest.approx(sum(pairs), rel=1e-12)
    assert voi >= max(pairs) - 3 * se  # the exact value is at least what the best single comparison offers


def test_family_bound_exact_for_two():
    rng = np.random.default_rng(9)
    means, cov = np.array([0.1, -0.2]), np.array([[0.5, 0.1], [0.1, 0.3]])
    draws = rng.multivariate_normal(means, cov, 1_000_000)
    gain = draws.max(axis=1) - means.max()
    se = gain.std(ddof=1) / math.sqrt(len(gain))
    assert abs(gain.mean() - evsi_family_upper_bound(means, cov)) < 3 * se


def _brute_force(values, costs, budget, groups):
    best = 0.0
    n = len(values)
    for mask in range(1 << n):
        idx = [i for i in range(n) if mask >> i & 1]
        if sum(costs[i] for i in idx) > budget:
            continue
        if groups is not None and len({groups[i] for i in idx}) < len(idx):
            continue
        best = max(best, sum(values[i] for i in idx))
    return best


def test_select_probe_batch_random_instances():
    rng = np.random.default_rng(4)
    for trial in range(200):
        n = int(rng.integers(1, 11))
        values = evsi(rng.normal(0, 1, n), rng.uniform(0, 1, n) * (rng.random(n) > 0.1))
        costs = rng.integers(1, 6, n).astype(float)
        budget = float(rng.integers(0, 15))
        groups = list(rng.integers(0, max(1, n // 2), n)) if trial % 2 else None
        chosen = select_probe_batch(values, costs, budget, groups=groups)
        assert chosen.dtype.kind == "i" and len(set(chosen.tolist())) == len(chosen)
        assert costs[chosen].sum() <= budget
        assert np.all(values[chosen] > 0)
        if groups is not None:
            assert len({groups[i] for i in chosen}) == len(chosen)
        opt = _brute_force(values, costs, budget, groups)
        got = values[chosen].sum()
        assert got <= opt + 1e-12
        if groups is None:
            assert got >= 0.5 * opt - 1e-12  # greedy-by-ratio plus best single: within a factor two
        # Deterministic.
        assert np.array_equal(chosen, select_probe_batch(values, costs, budget, groups=groups))


def test_select_probe_batch_dedup_keeps_best_ratio_in_group():
    values = np.array([0.5, 0.9, 0.4, 0.3])
    costs = np.array([1.0, 3.0, 1.0, 1.0])
    chosen = select_probe_batch(values, costs, 10, groups=["cmp-a", "cmp-a", "cmp-b", None])
    assert chosen.tolist() == [0, 2, 3]  # probe 1 resolves the same comparison as probe 0 at a worse ratio


def test_select_probe_batch_errors_name_the_field():
    with pytest.raises(ValueError, match="evsi_values"):
        select_probe_batch([np.nan], [1.0], 1.0)
    with pytest.raises(ValueError, match="costs"):
        select_probe_batch([1.0], [np.inf], 1.0)
    with pytest.raises(ValueError, match="budget"):
        select_probe_batch([1.0], [1.0], -1.0)


def test_aggregate_then_select():
    comparison_evsi = evsi([0.1, 0.5, 3.0, 0.0], [1.0, 1.0, 1.0, 0.0])
    per_probe = aggregate_evsi(comparison_evsi, [0, 0, 1, 2], n_probes=3)
    assert per_probe[0] == pytest.approx(comparison_evsi[0] + comparison_evsi[1])
    assert per_probe[2] == 0.0
    assert select_probe_batch(per_probe, [1.0, 1.0, 1.0], 5).tolist() == [0, 1]
