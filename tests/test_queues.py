"""NestFIFOQueue, TFQueues.close_all and the queue configuration checks."""

import linecache
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

from alf_async.driver.queues import NestFIFOQueue, TFQueues, check_queue_config
from alf_async.testing.policies import StatefulCountingPolicy

SPEC = {"a": tf.TensorSpec([2], tf.int32), "b": (tf.TensorSpec([], tf.float32),)}


def element(i):
    return {"a": np.array([i, i + 1], np.int32), "b": (np.float32(i / 2),)}


def wait_inside_queue_op(thread, secs=20.0):
    """Waits until `thread` is inside a queue op's kernel call (its innermost
    Python frame is the generated op wrapper, at the line that calls into
    TF), where an enqueue on a full queue or a dequeue on an empty one
    blocks. Fails if the thread ends or `secs` pass first."""
    deadline = time.monotonic() + secs
    while True:
        frame = sys._current_frames().get(thread.ident)  # pylint: disable=protected-access
        if frame is not None and frame.f_code.co_filename.endswith("gen_data_flow_ops.py") and \
                "TFE_Py_FastPathExecute" in linecache.getline(frame.f_code.co_filename,
                                                               frame.f_lineno):
            return
        assert thread.is_alive(), "the thread ended before blocking in a queue op"
        assert time.monotonic() < deadline, f"the thread did not block in a queue op in {secs} s"
        time.sleep(0.005)


@pytest.mark.timeout(30)
def test_nest_roundtrip_and_dequeue_all_stacks_capacity_elements():
    q = NestFIFOQueue(3, SPEC, "q")
    for i in range(3):
        q.enqueue(element(i))
    out = q.dequeue_all()
    np.testing.assert_array_equal(out["a"].numpy(), [[0, 1], [1, 2], [2, 3]])
    np.testing.assert_allclose(out["b"][0].numpy(), [0.0, 0.5, 1.0])
    assert int(q.size()) == 0


@pytest.mark.timeout(30)
def test_dequeue_all_blocks_until_full_then_close_wakes_it():
    q = NestFIFOQueue(2, SPEC, "q")
    result = {}

    def take():
        try:
            result["value"] = q.dequeue_all()
        except tf.errors.OutOfRangeError as e:
            result["error"] = e

    t = threading.Thread(target=take)
    t.start()
    q.enqueue(element(0))
    time.sleep(0.3)
    assert t.is_alive() and not result, "dequeue_all returned with 1 of 2 elements"
    q.close()
    t.join(5)
    assert not t.is_alive()
    assert isinstance(result.get("error"), tf.errors.OutOfRangeError)


@pytest.mark.timeout(30)
def test_close_cancels_a_blocked_enqueue_and_keeps_what_was_queued():
    q = NestFIFOQueue(1, SPEC, "q")
    q.enqueue(element(7))
    errors = []

    def put():
        try:
            q.enqueue(element(8))
        except tf.errors.CancelledError as e:
            errors.append(e)

    t = threading.Thread(target=put)
    t.start()
    wait_inside_queue_op(t)
    q.close(cancel_pending_enqueues=True)
    t.join(5)
    assert not t.is_alive() and len(errors) == 1
    np.testing.assert_array_equal(q.dequeue()["a"].numpy(), [7, 8])
    with pytest.raises(tf.errors.OutOfRangeError):
        q.dequeue()


def test_wrong_structure_is_refused_and_nothing_is_queued():
    q = NestFIFOQueue(2, SPEC, "q")
    with pytest.raises((ValueError, TypeError)):
        q.enqueue({"a": np.zeros(2, np.int32)})
    assert int(q.size()) == 0


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_envs=2, num_actor_queues=3, actor_queue_cap=1), "3 > 2"),
    (dict(num_envs=2, num_actor_queues=1, actor_queue_cap=0),
     "actor_queue_cap must be an integer >= 1, got 0"),
    (dict(num_envs=0, num_actor_queues=1, actor_queue_cap=1), "num_envs must be an integer >= 1"),
    (dict(num_envs=2, num_actor_queues=1, actor_queue_cap=1, unroll_length=0),
     "unroll_length must be an integer >= 1, got 0"),
])
def test_queue_config_refused(kwargs, message):
    args = dict(learn_queue_cap=1, unroll_length=4)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        check_queue_config(**args)


def test_queue_config_accepts_any_cap():
    # actor_queue_cap is an upper bound: actors take what is waiting, so caps
    # larger than the env threads of a queue (once a deadlock) are fine.
    check_queue_config(num_envs=6, num_actor_queues=3, actor_queue_cap=2, learn_queue_cap=1,
                       unroll_length=1)
    check_queue_config(num_envs=2, num_actor_queues=2, actor_queue_cap=5, learn_queue_cap=1,
                       unroll_length=1)


# ------------------------------------------------------------- TFQueues.close_all

def make_queues(num_actor_queues, batches_ahead):
    """A driver's queues: 2 env threads of B=2 rows, one actor queue (or
    none), learner batches of 2 unrolls of 2 steps, `batches_ahead` permits."""
    time_step_spec = ts.time_step_spec(tf.TensorSpec([3], tf.int32))
    action_spec = tensor_spec.BoundedTensorSpec([], tf.int32, 0, 9)
    policy = StatefulCountingPolicy(time_step_spec, action_spec)  # a policy state per row
    return TFQueues(num_envs=2, env_batch_size=2, learn_queue_cap=2, actor_queue_cap=2,
                    num_actor_queues=num_actor_queues, unroll_length=2,
                    time_step_spec=time_step_spec, policy_state_spec=policy.policy_state_spec,
                    policy_step_spec=policy.policy_step_spec,
                    trajectory_spec=policy.trajectory_spec, batches_ahead=batches_ahead)


def every_queue(queues):
    """{name: queue} of every NestFIFOQueue a TFQueues holds, found from its
    attributes, not from `all_queues()` (which close_all uses)."""
    found = {}
    for value in vars(queues).values():
        for q in (value if isinstance(value, list) else [value]):
            if isinstance(q, NestFIFOQueue):
                found[q.name] = q
    return found


def zeros(q):
    return tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), q.element_spec)


def size(q):
    return int(q.size())


# Every kind of queue a driver has: with actors and pacing, and without either.
KINDS = {
    (1, 1): {"actor_queue_0", "action_return_queue_0", "action_return_queue_1", "learn_queue",
             "log_queue", "step_token", "permits"},
    (0, None): {"learn_queue", "log_queue", "step_token"},
}


def run_blocked(calls):
    """Starts a thread per {name: call}, waits until each is blocked inside
    its queue op; returns {name: thread} and {name: (exception type or
    None, monotonic time it returned)}."""
    outcome, threads = {}, {}

    def run(name, call):
        try:
            call()
            outcome[name] = (None, time.monotonic())
        except tf.errors.OpError as e:
            outcome[name] = (type(e), time.monotonic())

    for name, call in calls.items():
        threads[name] = threading.Thread(target=run, args=(name, call), name=f"blocked_{name}",
                                         daemon=True)
        threads[name].start()
    for t in threads.values():
        wait_inside_queue_op(t)
    return threads, outcome


def close_all(queues, secs=10.0):
    """`queues.close_all()` on a thread of its own (a close that waits for
    the blocked ops would otherwise hang the test); returns when it did."""
    closer = threading.Thread(target=queues.close_all, name="close_all", daemon=True)
    closer.start()
    closer.join(secs)
    assert not closer.is_alive(), f"close_all() did not return within {secs} s"
    return time.monotonic()


def join_all(threads, queues, secs=10.0):
    """Joins every thread; those still blocked after `secs` fail the test
    (their queues are then closed one by one, so that none is left behind)."""
    deadline = time.monotonic() + secs
    for t in threads.values():
        t.join(max(0.0, deadline - time.monotonic()))
    left = [name for name, t in threads.items() if t.is_alive()]
    if left:
        for q in queues.values():
            q.close(cancel_pending_enqueues=True)
        for t in threads.values():
            t.join(5)
    assert not left, f"still blocked after close_all: {left}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_actor_queues, batches_ahead", list(KINDS))
def test_close_all_cancels_a_blocked_enqueue_on_every_queue_and_is_idempotent(
        num_actor_queues, batches_ahead):
    queues = make_queues(num_actor_queues, batches_ahead)
    found = every_queue(queues)
    assert set(found) == KINDS[num_actor_queues, batches_ahead]
    for q in found.values():  # full (the step token and the permits start full)
        while size(q) < q.capacity:
            q.enqueue(zeros(q))
    threads, outcome = run_blocked({name: (lambda q=q: q.enqueue(zeros(q)))
                                    for name, q in found.items()})
    assert not outcome  # every enqueue is waiting for room
    closed_at = time.monotonic()
    close_all(queues)
    join_all(threads, found)
    # Each blocked enqueue raised CancelledError, promptly.
    assert {name: kind for name, (kind, _) in outcome.items()} == {
        name: tf.errors.CancelledError for name in found}
    assert max(at for _, at in outcome.values()) - closed_at < 5.0
    for name, q in found.items():
        assert q.is_closed(), name
        assert size(q) == q.capacity, name  # what was queued stays, nothing was added
        with pytest.raises(tf.errors.CancelledError):
            q.enqueue(zeros(q))
    close_all(queues)  # idempotent: no error, nothing changes
    assert all(q.is_closed() and size(q) == q.capacity for q in found.values())
    # What was queued can still be taken out of a closed queue.
    assert tf.nest.flatten(found["learn_queue"].dequeue_all())[0].shape[0] == 4


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_actor_queues, batches_ahead", list(KINDS))
def test_close_all_wakes_a_blocked_dequeue_on_every_queue_with_out_of_range(
        num_actor_queues, batches_ahead):
    queues = make_queues(num_actor_queues, batches_ahead)
    found = every_queue(queues)
    for q in found.values():  # empty (the step token and the permits start full)
        if size(q):
            q.dequeue_many(size(q))
    # The learner's dequeue_all waits for a whole batch: one unroll of 4 is there.
    found["learn_queue"].enqueue(zeros(found["learn_queue"]))
    calls = {name: q.dequeue for name, q in found.items()}
    calls["learn_queue"] = found["learn_queue"].dequeue_all
    threads, outcome = run_blocked(calls)
    assert not outcome  # every dequeue is waiting
    closed_at = time.monotonic()
    close_all(queues)
    join_all(threads, found)
    assert {name: kind for name, (kind, _) in outcome.items()} == {
        name: tf.errors.OutOfRangeError for name in found}
    assert max(at for _, at in outcome.values()) - closed_at < 5.0
    assert all(q.is_closed() for q in found.values())
    # The partial batch was not lost: it is still queued, too short to dequeue_all.
    assert size(found["learn_queue"]) == 1
    with pytest.raises(tf.errors.OutOfRangeError):
        found["learn_queue"].dequeue_all()
    close_all(queues)  # idempotent
    assert all(q.is_closed() for q in found.values())
