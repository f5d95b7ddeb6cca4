"""What the agent builders (agents.py) share: the checks of their gin
arguments, the dtype a torso computes in and how it takes pixels, the
learning-rate schedule, and their optimizers built ahead of the first
trace with the hyperparameters a checkpoint holds of them.
"""

import numbers
import weakref

import tensorflow as tf

from alf_async import kernels


def check_layers(binding, layers):
    """Raises ValueError naming `binding` unless `layers` is a sequence of ints >= 1."""
    try:
        ok = all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in layers)
    except TypeError:
        ok = False
    if not ok or isinstance(layers, str):
        raise ValueError(f"{binding} must be a tuple of layer sizes (ints >= 1), got {layers!r}")


def check_number(binding, value, low, high=None, low_open=False):
    """Raises ValueError naming `binding` unless `value` is a number in range."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and (
        value > low if low_open else value >= low) and (high is None or value <= high)
    if not ok:
        bounds = f"> {low:g}" if low_open else (
            f">= {low:g}" if high is None else f"in [{low:g}, {high:g}]")
        raise ValueError(f"{binding} must be a number {bounds}, got {value!r}")


def check_count(binding, value):
    """Raises ValueError naming `binding` unless `value` is an int >= 1."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{binding} must be an int >= 1, got {value!r}")


def check_conv(binding, conv_layer_params):
    """Raises ValueError naming `binding` unless `conv_layer_params` is None or
    (filters, kernel size, stride) tuples of ints >= 1; returns them as tuples."""
    if conv_layer_params is not None and not (
            all(isinstance(c, (tuple, list)) and len(c) == 3 for c in conv_layer_params)
            and all(isinstance(n, int) and n >= 1 for c in conv_layer_params for n in c)):
        raise ValueError(f"{binding} must be (filters, kernel size, stride) tuples of ints "
                         f">= 1, got {conv_layer_params!r}")
    return None if conv_layer_params is None else tuple(tuple(c) for c in conv_layer_params)


def check_reward_clip(binding, value):
    """Raises ValueError unless `value` is None or (low, high) with low < high."""
    if value is not None and not (
            isinstance(value, (tuple, list)) and len(value) == 2
            and all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value)
            and value[0] < value[1]):
        raise ValueError(f"{binding} must be (low, high) with low < high, got {value!r}")


# Keras dtype policies a torso may compute in. 'mixed_bfloat16': bfloat16
# convolutions and matmuls over float32 variables (the heads, losses and
# optimizer stay float32), which oneDNN runs on AMX or AVX-512 BF16 (docs:
# performance, where a Pong env step's CPU goes); a CPU without them
# emulates bfloat16, slower than float32. 'auto': 'mixed_bfloat16' where
# the CPU has them and the kernel choice is not off (`kernels.bf16_torsos`),
# else 'float32'.
TORSO_DTYPE_POLICIES = ("float32", "mixed_bfloat16", "auto")


def torso_compute_dtype(policy):
    """'bfloat16' or 'float32': what a torso of `torso_dtype_policy` `policy`
    computes in on this CPU ('auto' resolved by `kernels.bf16_torsos`)."""
    if policy == "auto":
        return "bfloat16" if kernels.bf16_torsos() else "float32"
    return "bfloat16" if policy == "mixed_bfloat16" else "float32"


def torso_dtype(binding, policy):
    """The `dtype` tf-agents' EncodingNetwork gives its conv and dense layers."""
    if policy not in TORSO_DTYPE_POLICIES:
        raise ValueError(f"{binding} must be one of {TORSO_DTYPE_POLICIES}, got {policy!r}")
    if torso_compute_dtype(policy) == "float32":
        return tf.float32
    return tf.keras.mixed_precision.Policy("mixed_bfloat16")


def scale_pixels(observation_spec, dtype=tf.float32):
    """uint8 observations (pixels) scaled by 1 / 255 inside a network (None
    otherwise), computed in the torso's `dtype`. A bfloat16 torso's pixels go
    from uint8 to bfloat16 at once and are scaled there: one pass over a
    minibatch's frames, where scaling in float32 takes three (cast, scale,
    the first convolution's cast). Its scaled pixels are within two
    bfloat16 roundings (0.8%) of / 255, where float32's scaling cast to
    bfloat16 is within one."""
    if getattr(observation_spec, "dtype", None) == tf.uint8:
        return tf.keras.layers.Rescaling(1.0 / 255.0, dtype=dtype)
    return None


def linear_decay(learning_rate, decay_steps):
    """`learning_rate`, or (with `decay_steps`) a schedule falling linearly
    from it to 0 over that many of the optimizer's iterations (one per
    gradient step)."""
    if decay_steps is None:
        return learning_rate
    return tf.keras.optimizers.schedules.PolynomialDecay(
        learning_rate, decay_steps, end_learning_rate=0.0, power=1.0)


# optimizer -> the gin binding of its learning rate (see `optimizer_hyperparameters`).
LEARNING_RATE_BINDINGS = weakref.WeakKeyDictionary()


def optimizer_hyperparameters(agent):
    """[(name, variable)]: the hyperparameters of `agent`'s Keras optimizers that a
    checkpoint stores as variables (and a restore would overwrite).

    That is the learning rate of a Keras 2.11+ optimizer and every built
    hyperparameter of a legacy one (learning_rate, beta_1, ...). A learning
    rate set by the builders of agents.py is named by its gin binding
    (`dqn_agent.learning_rate`); others by where they live
    (`agent._optimizer.learning_rate`).
    """
    found = []
    for attr, optimizer in sorted(vars(agent).items()):
        if isinstance(optimizer, tf.keras.optimizers.legacy.Optimizer):
            hyper = dict(optimizer._hyper)  # pylint: disable=protected-access
        elif isinstance(optimizer, tf.keras.optimizers.Optimizer):
            hyper = {"learning_rate": getattr(optimizer, "_learning_rate", None)}
        else:
            continue
        for name, variable in sorted(hyper.items()):
            if not isinstance(variable, tf.Variable):
                continue
            binding = LEARNING_RATE_BINDINGS.get(optimizer) if name == "learning_rate" else None
            found.append((binding or f"agent.{attr}.{name}", variable))
    return found


def build_optimizer(optimizer, variables):
    """Creates a Keras optimizer's slot variables for `variables` now.

    Otherwise the optimizer creates them in the first `apply_gradients`, that
    is inside the first trace of the train step, and a tf.function that
    creates variables is traced twice; building them first spares that
    second trace (`python benchmarks/trace_time.py` times both).
    `variables` must be exactly the list the agent applies gradients to (a
    built Keras optimizer refuses variables it was not built with).
    """
    if isinstance(optimizer, tf.keras.optimizers.legacy.Optimizer):
        optimizer._create_all_weights(variables)  # legacy optimizers have no public build()
    elif isinstance(optimizer, tf.keras.optimizers.Optimizer):
        optimizer.build(variables)
