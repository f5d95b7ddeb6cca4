"""`Replayer`: the interface between the driver's experience and the train step.

A replayer is an exp_observer of the driver, `replayer(exp, env_ids)` with
`exp` a batch-major Trajectory [rows, T, ...] and `env_ids` int32 [rows],
and it hands experience to the training step with
`sample(sample_batch_size, num_steps)` -> Trajectory [batch, num_steps, ...].
`sample` uses TF ops only, so the learner traces it into the same graph as
`agent.train`. The replayers that implement it: `one_time_replayer`,
`uniform_replayer`, `pixel_replayer` and
`alf_async.distributed.reverb_replayer`.
"""

import tensorflow as tf


class Replayer(tf.Module):
    """The interface the learner uses; subclass it for your own replayer.

    Required: `__call__(exp, env_ids)` (an exp_observer), `can_sample(num_steps)`,
    `sample(sample_batch_size, num_steps)`, `num_frames()`.

    Optional capabilities, off by default (the learner and its hooks read
    them instead of probing attributes):
    - `traceable_before_data`: True when `sample` can be traced before the
      first batch arrived; the learner then builds its train iteration at
      start-up, on a helper thread, while the driver collects.
    - `trace()`: builds the graph that writes a batch without writing one;
      the learner calls it while the driver collects its first batch.
    - `policy_lag()`: the latest sample's policy lag (summaries, progress lines).
    """

    traceable_before_data = False

    def __call__(self, exp, env_ids):
        raise NotImplementedError

    def can_sample(self, num_steps):
        """True once `sample(..., num_steps)` can return data."""
        raise NotImplementedError

    def sample(self, sample_batch_size, num_steps=None):
        raise NotImplementedError

    def num_frames(self):
        """Steps currently held."""
        raise NotImplementedError

    def trace(self):
        """Builds the write graph ahead of the first batch (nothing by default)."""

    def policy_lag(self):
        """(mean, max) policy lag of the latest sample, in train steps, or None
        where it is not measured (see `policy_lag.PolicyLag`)."""
        return None
