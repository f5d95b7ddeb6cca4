"""NestFIFOQueue and the queue configuration checks."""

import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from alf_async.driver.queues import NestFIFOQueue, check_queue_config

SPEC = {"a": tf.TensorSpec([2], tf.int32), "b": (tf.TensorSpec([], tf.float32),)}


def element(i):
    return {"a": np.array([i, i + 1], np.int32), "b": (np.float32(i / 2),)}


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
    time.sleep(0.2)
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
