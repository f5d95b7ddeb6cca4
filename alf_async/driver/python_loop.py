"""An env thread's Python loop: the batch stepped in lockstep from Python.

For `stepping.PYTHON` environments (a blocking step whose rows are not
separate environments; AppliedStep environments): the graph loop's unroll,
written in Python with raw queue ops (acting.py, unrolls.py). An
AppliedStep environment's `applied_step()` is read after each step
(`applied_steps.AppliedSteps`): its applied action goes into the
trajectory, and the learn queue's copy of each unroll has its untrainable
transitions made inert.

Threads: `run_python_loop` runs on the env thread until a queue op fails
because the driver closed the queues (or the environment raises); it blocks
in the queue ops and the environment's step.
"""

import numpy as np
import tensorflow as tf
from tf_agents.trajectories import trajectory as trajectory_lib

from alf_async.driver import applied_steps


def run_python_loop(env, stepping, acting, unrolls, queues):
    """Steps `env`'s batch (its `stepping.py_env`) unroll after unroll.

    Args:
        env: the TFEnvironment (for its action spec).
        stepping: its `Stepping` (kind PYTHON).
        acting: the thread's `ActorActing` or `SelfActing`.
        unrolls: the thread's `Unrolls`.
        queues: the driver's `TFQueues` (for the specs).
    """
    py_env = stepping.py_env
    step_spec = queues.policy_step_spec
    B, T, env_ids = unrolls.B, unrolls.T, unrolls.env_ids
    applied = (applied_steps.AppliedSteps(py_env, queues.unroll_spec[0], env.action_spec(), B)
               if stepping.reports_applied else None)
    acting.open()
    unrolls.open()
    time_step = py_env.reset()
    flat_state = [np.asarray(t) for t in tf.nest.flatten(unrolls.initial_state)]
    while True:
        unrolls.take_permit()
        transitions = []
        for _ in range(T):
            flat_step = acting.ask(tf.nest.flatten(time_step), flat_state, env_ids)
            policy_step = tf.nest.pack_sequence_as(step_spec, flat_step)
            next_time_step = py_env.step(policy_step.action)
            if applied is not None:
                policy_step = applied.after_step(policy_step)
            transitions.append(tf.nest.flatten(
                trajectory_lib.from_transition(time_step, policy_step, next_time_step)))
            time_step = next_time_step
            flat_state = tf.nest.flatten(policy_step.state)
        unroll = [np.stack(leaves, axis=1) for leaves in zip(*transitions)] + [env_ids]
        unrolls.ship(unroll, unroll if applied is None else applied.for_learner(unroll), B)
