"""Replayers: where the learner's experience goes between `run_async()` and training.

This module names them from one import path; each lives in its own:

- `Replayer` (replayer_base.py): the interface. A replayer is an
  exp_observer of the driver, `replayer(exp, env_ids)` with `exp` a
  batch-major Trajectory [rows, T, ...] and `env_ids` int32 [rows], and it
  hands experience to the training step with `sample(sample_batch_size,
  num_steps)` -> Trajectory [batch, num_steps, ...].
- `OneTimeReplayer` (one_time_replayer.py): trains on exactly the batch
  that was dequeued (each row's unroll preceded by the last step of the
  row's previous unroll, so that no transition is lost between unrolls),
  whole or cut into the overlapping windows of `num_steps` the agent
  trains on.
- `UniformReplayer` (uniform_replayer.py): a replay buffer with one ring
  per environment row; samples windows uniformly, never across rows or
  across a row's write cursor. Its subclass `pixel_replayer.PixelReplayer`
  stores each frame of an image stack once.

Importing this module registers both replayers with gin
(`@OneTimeReplayer`, `@UniformReplayer`).
"""

from alf_async.learning.one_time_replayer import OneTimeReplayer
from alf_async.learning.replayer_base import Replayer
from alf_async.learning.uniform_replayer import UniformReplayer

__all__ = ["OneTimeReplayer", "Replayer", "UniformReplayer"]
