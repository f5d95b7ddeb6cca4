"""vtrace_returns against a NumPy loop of Espeholt et al. 2018's recursion."""

import numpy as np
import pytest
import tensorflow as tf

from alf_async.learning.vtrace import vtrace_returns


def _numpy_vtrace(log_rhos, discounts, rewards, values, bootstrap, rho_bar, pg_bar, c_bar):
    """The paper's definitions, step by step, for one batch row at a time."""
    B, T = log_rhos.shape
    vs = np.zeros((B, T))
    pg = np.zeros((B, T))

    def clip(x, bar):
        return x if bar is None else min(bar, x)

    for b in range(B):
        v_next = bootstrap[b]   # v_T = V(x_T)
        for t in reversed(range(T)):
            rho = np.exp(log_rhos[b, t])
            value_next = values[b, t + 1] if t + 1 < T else bootstrap[b]
            delta = clip(rho, rho_bar) * (rewards[b, t] + discounts[b, t] * value_next -
                                          values[b, t])
            vs[b, t] = values[b, t] + delta + discounts[b, t] * clip(rho, c_bar) * (
                v_next - value_next)
            v_next = vs[b, t]
        for t in range(T):
            rho = np.exp(log_rhos[b, t])
            vs_next = vs[b, t + 1] if t + 1 < T else bootstrap[b]
            pg[b, t] = clip(rho, pg_bar) * (rewards[b, t] + discounts[b, t] * vs_next -
                                            values[b, t])
    return vs, pg


def _batch(seed, B=3, T=7):
    rng = np.random.default_rng(seed)
    log_rhos = rng.normal(0.0, 0.8, (B, T))   # ratios on both sides of every threshold
    discounts = np.full((B, T), 0.9)
    discounts[0, 2] = 0.0   # row 0's episode ends after step 2, inside the unroll
    discounts[1, T - 1] = 0.0   # row 1's after the unroll's last step
    rewards = rng.normal(0.0, 1.0, (B, T))
    values = rng.normal(0.0, 1.0, (B, T))
    bootstrap = rng.normal(0.0, 1.0, (B,))
    return log_rhos, discounts, rewards, values, bootstrap


@pytest.mark.parametrize("rho_bar, pg_bar, c_bar", [
    (1.0, 1.0, 1.0),      # IMPALA's defaults
    (2.0, 0.5, 0.7),      # each threshold its own
    (None, None, None),   # no clipping: the off-policy n-step return of every ratio
    (None, 1.0, 0.5),
])
def test_matches_the_papers_recursion(rho_bar, pg_bar, c_bar):
    args = _batch(seed=0)
    got = vtrace_returns(*args, clip_rho_threshold=rho_bar, clip_pg_rho_threshold=pg_bar,
                         clip_c_threshold=c_bar)
    vs, pg = _numpy_vtrace(*args, rho_bar, pg_bar, c_bar)
    np.testing.assert_allclose(got.vs.numpy(), vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got.pg_advantages.numpy(), pg, rtol=1e-5, atol=1e-5)


def test_an_episode_end_cuts_the_trace():
    """Row 0 ends after step 2: its targets up to step 2 do not depend on
    anything after it, and step 2's target is its reward."""
    log_rhos, discounts, rewards, values, bootstrap = _batch(seed=1)
    first = vtrace_returns(log_rhos, discounts, rewards, values, bootstrap)
    rewards2, values2, bootstrap2 = rewards.copy(), values.copy(), bootstrap + 5.0
    rewards2[0, 3:] += 3.0
    values2[0, 3:] -= 2.0
    second = vtrace_returns(log_rhos, discounts, rewards2, values2, bootstrap2)
    np.testing.assert_allclose(first.vs.numpy()[0, :3], second.vs.numpy()[0, :3], rtol=1e-6)
    rho = min(1.0, np.exp(log_rhos[0, 2]))
    np.testing.assert_allclose(first.vs.numpy()[0, 2],
                               values[0, 2] + rho * (rewards[0, 2] - values[0, 2]), rtol=1e-5)


def test_on_policy_is_the_n_step_bootstrapped_return():
    """With pi = mu every ratio is 1 and v_t is the discounted return
    bootstrapped from V(x_T) (the paper's remark after eq. (1))."""
    _, _, rewards, values, bootstrap = _batch(seed=2)
    discounts = np.full(rewards.shape, 0.9)
    got = vtrace_returns(np.zeros(rewards.shape), discounts, rewards, values, bootstrap)
    returns = np.zeros(rewards.shape)
    acc = bootstrap.copy()
    for t in reversed(range(rewards.shape[1])):
        acc = rewards[:, t] + 0.9 * acc
        returns[:, t] = acc
    np.testing.assert_allclose(got.vs.numpy(), returns, rtol=1e-5, atol=1e-5)


def test_outputs_carry_no_gradient():
    args = [tf.Variable(a, dtype=tf.float32) for a in _batch(seed=3)]
    with tf.GradientTape() as tape:
        out = vtrace_returns(*args)
        total = tf.reduce_sum(out.vs) + tf.reduce_sum(out.pg_advantages)
    assert all(g is None for g in tape.gradient(total, args))


def test_runs_inside_a_traced_function_with_unknown_sizes():
    fn = tf.function(vtrace_returns, input_signature=[tf.TensorSpec([None, None])] * 4 +
                     [tf.TensorSpec([None])])
    args = [a.astype(np.float32) for a in _batch(seed=4, B=2, T=5)]
    vs, pg = _numpy_vtrace(*args, 1.0, 1.0, 1.0)
    got = fn(*args)
    np.testing.assert_allclose(got.vs.numpy(), vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got.pg_advantages.numpy(), pg, rtol=1e-5, atol=1e-5)


def test_refuses_mismatched_shapes():
    log_rhos, discounts, rewards, values, bootstrap = _batch(seed=5)
    with pytest.raises(ValueError, match=r"rewards must be \[B, T\]"):
        vtrace_returns(log_rhos, discounts, rewards[:, :-1], values, bootstrap)
    with pytest.raises(ValueError, match=r"bootstrap_value must be \[B\]"):
        vtrace_returns(log_rhos, discounts, rewards, values, bootstrap[:, None])
