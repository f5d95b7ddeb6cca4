"""Keras optimizers that behave as the published agents' optimizers did.

`TF1RMSprop` is TensorFlow 1's `tf.compat.v1.train.RMSPropOptimizer` (the
optimizer of OpenAI baselines' a2c and of the IMPALA paper's code) as a
Keras optimizer, so that it takes learning-rate schedules, builds before
tracing and checkpoints as every other optimizer here. Keras' `RMSprop`
already adds epsilon inside the square root as TF1 did; it differs in the
mean square's start: zeros, so its first steps move each weight by about
ten times the learning rate (1 / sqrt(1 - rho)), where TF1's start at 1
makes them small. Stable-Baselines3 ships the same change for PyTorch
(`RMSpropTFLike`) because A2C is less stable on Atari without it.
"""

import gin
import tensorflow as tf


@gin.configurable
class TF1RMSprop(tf.keras.optimizers.RMSprop):
    """Keras `RMSprop` whose mean square of each variable starts at 1 (TF1's
    `RMSPropOptimizer`); its arguments are Keras `RMSprop`'s."""

    def build(self, var_list):
        fresh = not getattr(self, "_built", False)
        super().build(var_list)
        if fresh:
            for velocity in self._velocities:
                velocity.assign(tf.ones_like(velocity))
