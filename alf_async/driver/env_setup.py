"""The driver's environments: built together, checked against each other
and the policy, closed.

Threads: all run on the driver's constructing thread, except `close_envs`,
which the driver's stop calls from the stopping thread.
"""

import concurrent.futures
import logging

import numpy as np
import tensorflow as tf

logger = logging.getLogger(__name__)


def make_envs(env_constructor, num_envs):
    """Calls env_constructor num_envs times concurrently; closes all and re-raises on failure."""
    with concurrent.futures.ThreadPoolExecutor(num_envs,
                                               thread_name_prefix="env_constructor") as pool:
        futures = [pool.submit(env_constructor) for _ in range(num_envs)]
        concurrent.futures.wait(futures)
    envs = [f.result() for f in futures if f.exception() is None]
    for f in futures:
        if f.exception() is not None:
            close_envs(envs)
            raise f.exception()
    return envs


def close_envs(envs):
    for env in envs:
        close = getattr(env, "close", None)
        if close is None:
            continue
        try:
            close()
        except NotImplementedError:
            pass
        except Exception:  # a failing close must not hide the error being raised
            logger.exception("closing environment %r failed", env)


def spec_str(spec):
    return str(tf.nest.map_structure(
        lambda s: f"{s.dtype.name}{s.shape.as_list()}" + (
            f"[{np.min(s.minimum)}..{np.max(s.maximum)}]" if hasattr(s, "minimum") else ""),
        spec))


def specs_match(a, b):
    """Same structure, dtypes, shapes and (where both are bounded) bounds; names ignored."""
    try:
        tf.nest.assert_same_structure(a, b)
    except (ValueError, TypeError):
        return False
    for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)):
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        if hasattr(x, "minimum") and hasattr(y, "minimum"):
            if not (np.array_equal(np.broadcast_to(x.minimum, x.shape),
                                   np.broadcast_to(y.minimum, y.shape)) and
                    np.array_equal(np.broadcast_to(x.maximum, x.shape),
                                   np.broadcast_to(y.maximum, y.shape))):
                return False
    return True


def check_specs(envs, policy):
    """Checks every env against env 0 and the policy; returns the batch size B."""
    first = envs[0]
    B = first.batch_size
    if B is None or B < 1:
        raise ValueError(f"environments must have a batch size >= 1, got {B}")
    for i, env in enumerate(envs[1:], start=1):
        if env.batch_size != B:
            raise ValueError(f"env {i} has batch size {env.batch_size}, env 0 has {B}: "
                             f"every environment must have the same batch size")
        for what in ("time_step_spec", "action_spec"):
            a, b = getattr(first, what)(), getattr(env, what)()
            if not specs_match(a, b):
                raise ValueError(f"env {i}'s {what} differs from env 0's: expected "
                                 f"{spec_str(a)}, got {spec_str(b)}")
    for what, env_spec, policy_spec in [
            ("time_step_spec", first.time_step_spec(), policy.time_step_spec),
            ("action_spec", first.action_spec(), policy.action_spec)]:
        if not specs_match(env_spec, policy_spec):
            raise ValueError(f"the environments' {what} does not match the policy's: "
                             f"policy expects {spec_str(policy_spec)}, environments "
                             f"have {spec_str(env_spec)}")
    return B
