"""`FusedAdam`: Keras' Adam through TensorFlow's fused ApplyAdam kernel,
checked step by step against Adam's arithmetic and against Keras' `Adam`,
across a checkpoint, and as the unroll agents' default."""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

from alf_async.learning import agents
from alf_async.learning.optimizers import FusedAdam

pytestmark = pytest.mark.timeout(120)


def _grads(step, shapes):
    rng = np.random.default_rng(step)
    return [rng.normal(size=shape).astype(np.float32) for shape in shapes]


def _schedule():
    return tf.keras.optimizers.schedules.PolynomialDecay(1e-2, 40, 0.0)


def _run(optimizer_class, steps, shapes=((6, 5), (5,), ())):
    """`steps` traced updates; returns the variables, the optimizer and the
    op types of the update's graph (its functions' included)."""
    variables = [tf.Variable(g) for g in _grads(100, shapes)]
    optimizer = optimizer_class(_schedule(), epsilon=1e-5)
    optimizer.build(variables)
    apply = tf.function(lambda grads: optimizer.apply_gradients(zip(grads, variables)))
    for step in range(steps):
        apply([tf.constant(g) for g in _grads(step, shapes)])
    graph = apply.get_concrete_function(
        [tf.TensorSpec(shape, tf.float32) for shape in shapes]).graph.as_graph_def()
    ops = [n.op for n in graph.node] + [n.op for f in graph.library.function
                                        for n in f.node_def]
    return variables, optimizer, ops


def test_fused_adam_takes_adams_steps():
    """m += (g - m)(1 - b1); v += (g^2 - v)(1 - b2);
    w -= lr_t sqrt(1 - b2^t) / (1 - b1^t) m / (sqrt(v) + eps), lr_t decaying."""
    shapes = ((6, 5), (5,), ())
    fused, optimizer, fused_ops = _run(FusedAdam, 30, shapes)
    keras, _, keras_ops = _run(tf.keras.optimizers.Adam, 30, shapes)
    # One fused op per variable, where Keras' Adam runs its elementwise ops.
    assert fused_ops.count("ResourceApplyAdam") == 3 and "ResourceApplyAdam" not in keras_ops
    assert fused_ops.count("AssignSubVariableOp") == 0 < keras_ops.count("AssignSubVariableOp")
    w = [g.astype(np.float64) for g in _grads(100, shapes)]
    m = [np.zeros_like(x) for x in w]
    v = [np.zeros_like(x) for x in w]
    for step in range(30):
        t, lr = step + 1, 1e-2 * (1 - step / 40)
        alpha = lr * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
        for i, g in enumerate(_grads(step, shapes)):
            m[i] += (g - m[i]) * 0.1
            v[i] += (g.astype(np.float64) ** 2 - v[i]) * 0.001
            w[i] -= alpha * m[i] / (np.sqrt(v[i]) + 1e-5)
    for f, k, ref in zip(fused, keras, w):
        np.testing.assert_allclose(f.numpy(), ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(f.numpy(), k.numpy(), rtol=1e-6, atol=1e-6)
    assert int(optimizer.iterations) == 30
    assert sorted({v.name.split("/")[0] for v in optimizer.variables[1:]}) == ["m", "v"]


def test_a_keras_adam_checkpoint_restores_into_fused_adam(tmp_path):
    keras_vars, keras_opt, _ = _run(tf.keras.optimizers.Adam, 5)
    path = tf.train.Checkpoint(optimizer=keras_opt, variables=keras_vars).save(
        str(tmp_path / "adam"))
    fused_vars = [tf.Variable(tf.zeros_like(v)) for v in keras_vars]
    fused_opt = FusedAdam(_schedule(), epsilon=1e-5)
    fused_opt.build(fused_vars)
    tf.train.Checkpoint(optimizer=fused_opt, variables=fused_vars).restore(
        path).assert_consumed()
    assert int(fused_opt.iterations) == 5
    for a, b in zip(keras_opt.variables, fused_opt.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    # One more step each from the same state: the same weights.
    grads = [tf.constant(g) for g in _grads(5, [v.shape for v in keras_vars])]
    keras_opt.apply_gradients(zip(grads, keras_vars))
    fused_opt.apply_gradients(zip(grads, fused_vars))
    for a, b in zip(keras_vars, fused_vars):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("amsgrad", [False, True])
def test_sparse_gradients_and_amsgrad_take_keras_adams_own_update(amsgrad):
    result = {}
    for cls in (tf.keras.optimizers.Adam, FusedAdam):
        table = tf.Variable(np.arange(12, dtype=np.float32).reshape(4, 3))
        optimizer = cls(0.1, amsgrad=amsgrad)
        for step in range(3):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.gather(table, [step % 4, 3]) ** 2)
            grad = tape.gradient(loss, table)
            assert isinstance(grad, tf.IndexedSlices)
            optimizer.apply_gradients([(grad, table)])
        result[cls] = table.numpy()
    np.testing.assert_array_equal(result[FusedAdam], result[tf.keras.optimizers.Adam])


def test_ppo_and_impala_agents_use_fused_adam():
    observation = tensor_spec.BoundedTensorSpec([12, 12, 2], tf.uint8, 0, 255)
    action = tensor_spec.BoundedTensorSpec((), tf.int64, 0, 2)
    time_step_spec = ts.time_step_spec(observation)
    ppo = agents.ppo_agent(time_step_spec, action, tf.Variable(0, tf.int64),
                           conv_layer_params=((4, 4, 2),), actor_fc_layer_params=(16,),
                           adam_epsilon=1e-5)
    impala = agents.impala_agent(time_step_spec, action, tf.Variable(0, tf.int64),
                                 conv_layer_params=((4, 4, 2),), fc_layer_params=(16,))
    assert type(ppo._optimizer) is FusedAdam and type(impala._optimizer) is FusedAdam
    assert ppo._optimizer.epsilon == 1e-5
