"""Keras optimizers that behave as the published agents' optimizers did,
and a faster Adam.

`TF1RMSprop` is TensorFlow 1's `tf.compat.v1.train.RMSPropOptimizer` (the
optimizer of OpenAI baselines' a2c and of the IMPALA paper's code) as a
Keras optimizer, so that it takes learning-rate schedules, builds before
tracing and checkpoints as every other optimizer here. Keras' `RMSprop`
already adds epsilon inside the square root as TF1 did; it differs in the
mean square's start: zeros, so its first steps move each weight by about
ten times the learning rate (1 / sqrt(1 - rho)), where TF1's start at 1
makes them small. Stable-Baselines3 ships the same change for PyTorch
(`RMSpropTFLike`) because A2C is less stable on Atari without it.

`FusedAdam` is Keras' `Adam` updating each variable with TensorFlow's fused
`ApplyAdam` kernel: the same arithmetic in one op per variable (PPO's and
IMPALA's default; `docs/results/collection.md`).
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


class FusedAdam(tf.keras.optimizers.Adam):
    """Keras `Adam` whose dense update is TensorFlow's fused `ApplyAdam`
    kernel: one op per variable that reads and writes the variable and its
    two moments once, where Keras 2.15's `Adam.update_step` runs about ten
    elementwise ops, each a pass over the variable. The arithmetic is the
    same (`m += (g - m)(1 - beta_1)`, `v += (g^2 - v)(1 - beta_2)`,
    `var -= alpha m / (sqrt(v) + epsilon)`, alpha = lr sqrt(1 - beta_2^t) /
    (1 - beta_1^t)), and the slots are Adam's (`m`, `v`), so checkpoints
    restore across the two. Sparse gradients and `amsgrad` take Adam's own
    update. Arguments: Keras `Adam`'s.
    """

    def update_step(self, gradient, variable):
        if isinstance(gradient, tf.IndexedSlices) or self.amsgrad:
            return super().update_step(gradient, variable)
        dtype = variable.dtype
        local_step = tf.cast(self.iterations + 1, dtype)
        beta_1 = tf.cast(self.beta_1, dtype)
        beta_2 = tf.cast(self.beta_2, dtype)
        index = self._index_dict[self._var_key(variable)]
        return tf.raw_ops.ResourceApplyAdam(
            var=variable.handle, m=self._momentums[index].handle,
            v=self._velocities[index].handle, beta1_power=tf.pow(beta_1, local_step),
            beta2_power=tf.pow(beta_2, local_step), lr=tf.cast(self.learning_rate, dtype),
            beta1=beta_1, beta2=beta_2, epsilon=tf.cast(self.epsilon, dtype), grad=gradient)
