"""V-trace targets (Espeholt et al. 2018, "IMPALA", section 4.1), batch-major.

    returns = vtrace_returns(log_rhos, discounts, rewards, values, bootstrap_value)
    value_loss = 0.5 * (returns.vs - values) ** 2
    policy_loss = -returns.pg_advantages * log_pi(a_t | x_t)

tf-agents has no V-trace, so it is written here: one reverse `tf.scan` over
time, on [B, T] tensors like every trajectory of the driver (IMPALA's own
code and Acme's `trfl` are time-major).

At step t of row b (every argument [B, T] but `bootstrap_value` [B]):

    values[:, t]      V(x_t)
    rewards[:, t]     r_t
    discounts[:, t]   gamma_t: the discount of the transition x_t -> x_{t+1},
                      0 where the episode ended after step t
    log_rhos[:, t]    log pi(a_t | x_t) - log mu(a_t | x_t), target policy pi,
                      behaviour policy mu
    bootstrap_value   V(x_T)

With rho_t = min(rho_bar, pi/mu) and c_t = min(c_bar, pi/mu), eq. (1):

    delta_t = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t))
    v_t     = V(x_t) + delta_t + gamma_t c_t (v_{t+1} - V(x_{t+1})),  v_T = V(x_T)

and the policy-gradient advantage min(rho_pg_bar, pi/mu) (r_t + gamma_t
v_{t+1} - V(x_t)). A threshold of None clips nothing. Both outputs are
targets: no gradient flows through them.
"""

import collections

import tensorflow as tf

VTraceReturns = collections.namedtuple("VTraceReturns", ["vs", "pg_advantages"])
VTraceReturns.__doc__ = """V-trace's outputs, each [B, T].

vs: the value targets v_t.
pg_advantages: the policy-gradient advantages.
"""


def _clipped(rhos, threshold):
    return rhos if threshold is None else tf.minimum(tf.cast(threshold, rhos.dtype), rhos)


def vtrace_returns(log_rhos, discounts, rewards, values, bootstrap_value,
                   clip_rho_threshold=1.0, clip_pg_rho_threshold=1.0, clip_c_threshold=1.0):
    """The V-trace targets and policy-gradient advantages of a batch of unrolls.

    Args:
        log_rhos: [B, T] log importance ratios log(pi / mu) of the actions taken.
        discounts: [B, T] discounts gamma_t (0 after the episode's last step).
        rewards: [B, T] rewards r_t.
        values: [B, T] value estimates V(x_t).
        bootstrap_value: [B] V(x_T), the value of the step after the unroll.
        clip_rho_threshold: rho_bar, the clip of the importance ratio in
            delta_t (None: none).
        clip_pg_rho_threshold: the clip of the ratio weighting the
            policy-gradient advantage (None: none).
        clip_c_threshold: c_bar, the clip of the trace coefficients c_t
            (None: none).

    Returns:
        A `VTraceReturns` of [B, T] tensors with no gradient.

    Raises:
        ValueError: arguments whose static shapes disagree.
    """
    with tf.name_scope("vtrace_returns"):
        log_rhos = tf.convert_to_tensor(log_rhos, tf.float32)
        discounts = tf.convert_to_tensor(discounts, tf.float32)
        rewards = tf.convert_to_tensor(rewards, tf.float32)
        values = tf.convert_to_tensor(values, tf.float32)
        bootstrap_value = tf.convert_to_tensor(bootstrap_value, tf.float32)
        for name, t in (("discounts", discounts), ("rewards", rewards), ("values", values)):
            if not t.shape.is_compatible_with(log_rhos.shape) or t.shape.rank != 2:
                raise ValueError(f"vtrace_returns: {name} must be [B, T] like log_rhos "
                                 f"{log_rhos.shape}, got {t.shape}")
        if bootstrap_value.shape.rank != 1 or not bootstrap_value.shape.is_compatible_with(
                log_rhos.shape[:1]):
            raise ValueError(f"vtrace_returns: bootstrap_value must be [B] "
                             f"({log_rhos.shape[:1]}), got {bootstrap_value.shape}")
        rhos = tf.exp(log_rhos)
        clipped_rhos = _clipped(rhos, clip_rho_threshold)
        cs = _clipped(rhos, clip_c_threshold)
        next_values = tf.concat([values[:, 1:], bootstrap_value[:, None]], axis=1)
        deltas = clipped_rhos * (rewards + discounts * next_values - values)

        # v_t - V(x_t) = delta_t + gamma_t c_t (v_{t+1} - V(x_{t+1})), from t = T-1 down.
        def step(acc, elems):
            delta, discount_c = elems
            return delta + discount_c * acc

        vs_minus_values = tf.transpose(tf.scan(
            step, (tf.transpose(deltas), tf.transpose(discounts * cs)),
            initializer=tf.zeros_like(bootstrap_value), reverse=True))
        vs = vs_minus_values + values
        next_vs = tf.concat([vs[:, 1:], bootstrap_value[:, None]], axis=1)
        pg_advantages = _clipped(rhos, clip_pg_rho_threshold) * (
            rewards + discounts * next_vs - values)
        return VTraceReturns(vs=tf.stop_gradient(vs),
                             pg_advantages=tf.stop_gradient(pg_advantages))
