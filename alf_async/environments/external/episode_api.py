"""The episode API's one definition: its methods, their arguments, and the
checks and JSON form of their values. TF-free (standard library and numpy):
used by the episode table (episodes.py), the policy server and its protocol,
and both the remote and the local-inference PolicyClient.

    start_episode(episode_id=None, training_enabled=True) -> episode_id
    get_action(episode_id, observation, reward=None) -> action
    log_action(episode_id, observation, action)
    log_returns(episode_id, reward, info=None)
    end_episode(episode_id, observation)

`METHODS` lists them with their required and optional arguments and the key
of their result on the wire; `check_nest` checks an observation or action
against an array spec nest (tf-agents ArraySpecs, read by duck typing);
`check_episode_id` and `check_reward` check the other arguments;
`to_json` turns numpy nests into JSON values.

Threads: pure functions; any thread.
"""

import collections

import numpy as np

Method = collections.namedtuple("Method", ["required", "optional", "result"])

# name -> (required arguments, optional arguments, key of the result or None)
METHODS = {
    "start_episode": Method((), ("episode_id", "training_enabled"), "episode_id"),
    # `reward`: log_returns(episode_id, reward) and get_action in one call
    # (one round trip per step for a served client; see EpisodeTable.get_action).
    "get_action": Method(("episode_id", "observation"), ("reward",), "action"),
    "log_action": Method(("episode_id", "observation", "action"), (), None),
    "log_returns": Method(("episode_id", "reward"), ("info",), None),
    "end_episode": Method(("episode_id", "observation"), (), None),
}


def check_episode_id(episode_id, allow_none=False):
    """Raises TypeError unless `episode_id` is a str (or None when allowed)."""
    if isinstance(episode_id, str) or (allow_none and episode_id is None):
        return episode_id
    raise TypeError(f"episode_id must be a str{' or None' if allow_none else ''}, got "
                    f"{type(episode_id).__name__}")


def check_reward(reward):
    """`reward` as a finite float; ValueError otherwise."""
    try:
        r = float(reward)
    except OverflowError:  # an int beyond float range (e.g. 10**400 from JSON)
        raise ValueError(f"reward: expected a finite number, got an integer of "
                         f"{len(str(reward))} digits") from None
    except (TypeError, ValueError):
        raise ValueError(f"reward: expected a number, got {reward!r:.80}") from None
    if not np.isfinite(r):
        raise ValueError(f"reward: expected a finite number, got {r}")
    return r


def to_json(value):
    """Numpy nests to JSON values (dicts stay objects, lists and tuples become lists)."""
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    return value


def _bounds_str(values):
    values = np.asarray(values)
    if values.size and np.all(values == values.flat[0]):
        return str(values.flat[0].item())
    return np.array2string(values, threshold=8)


def _check_array(value, spec, what):
    dtype = np.dtype(spec.dtype)
    shape = tuple(spec.shape)
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{what}: expected an array of shape {shape} and dtype {dtype.name}, "
                         f"got a value that is not a regular array ({e})") from None
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{what}: expected dtype {dtype.name}, got {arr.dtype} "
                         f"(value {value!r:.80})")
    if arr.shape != shape:
        raise ValueError(f"{what}: expected shape {shape}, got {arr.shape}")
    if not np.can_cast(arr.dtype, dtype, casting="same_kind"):
        raise ValueError(f"{what}: expected dtype {dtype.name}, got {arr.dtype.name} "
                         f"(which does not convert to {dtype.name} safely)")
    if dtype.kind in "iu" and arr.size:
        info = np.iinfo(dtype)
        if arr.min() < info.min or arr.max() > info.max:
            raise ValueError(f"{what}: values {arr.min()}..{arr.max()} do not fit {dtype.name}")
    out = arr.astype(dtype, copy=True)
    if hasattr(spec, "minimum") and hasattr(spec, "maximum"):   # a BoundedArraySpec
        ok = (out >= spec.minimum) & (out <= spec.maximum)
        if not np.all(ok):
            bad = tuple(int(i) for i in np.argwhere(~ok)[0]) if out.ndim else ()
            raise ValueError(
                f"{what}: out of bounds: expected values in [{_bounds_str(spec.minimum)}, "
                f"{_bounds_str(spec.maximum)}], got {out[bad]!r} at index {bad}")
    return out


def check_nest(value, spec, what):
    """Converts `value` to numpy arrays that match the array spec nest `spec`.

    Structure, shape and dtype must match (a value of another dtype is
    accepted when numpy casts it safely within its kind, e.g. Python floats
    to float32, ints to float32; never floats to ints); bounded specs must
    hold every value (NaN never does).

    Args:
        value: the nest to check (lists and numpy arrays for the leaves).
        spec: the array spec nest.
        what: the field's name for error messages, e.g. "observation".

    Returns:
        The same nest of numpy arrays of the spec's dtypes.

    Raises:
        ValueError: naming the field (e.g. "observation['pos']") and what was
            expected.
    """
    if isinstance(spec, dict):
        if not isinstance(value, dict) or set(value) != set(spec):
            got = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise ValueError(f"{what}: expected a dict with keys {sorted(spec)}, got {got}")
        return type(spec)((k, check_nest(value[k], spec[k], f"{what}[{k!r}]")) for k in spec)
    if isinstance(spec, (list, tuple)):
        if not isinstance(value, (list, tuple)) or len(value) != len(spec):
            got = (f"{len(value)} items" if isinstance(value, (list, tuple))
                   else type(value).__name__)
            raise ValueError(f"{what}: expected a sequence of {len(spec)} items, got {got}")
        items = [check_nest(v, s, f"{what}[{i}]") for i, (v, s) in enumerate(zip(value, spec))]
        return type(spec)(*items) if hasattr(spec, "_fields") else type(spec)(items)
    return _check_array(value, spec, what)
