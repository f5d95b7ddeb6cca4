"""OfflineEnv: logged episodes fed to the driver as off-policy experience.

Log format: JSON lines, one step per line, episodes possibly interleaved:

    {"episode_id": "e17", "observation": [...], "action": 1, "reward": 1.0, "done": false}
    {"episode_id": "e17", "observation": [...], "action": 0, "reward": 1.0, "done": true,
     "next_observation": [...]}

A line says: in `observation` the logger took `action` and then received
`reward`; `done` means the episode terminated after that step.
`next_observation` (optional, read on done lines) is the terminal
observation; without it the last observation is repeated (harmless: a
terminal step's value is never bootstrapped). An episode whose lines end
without `done` (a log cut short, or a time limit) is abandoned: its steps are
used, but its last transition, whose outcome is unknown, is kept from the
learner (`ExternalEnv.abandon_episode`).

`OfflineEnv(paths, action_spec, observation_spec)` reads the files in
`run()` and feeds each episode with `log_action` / `log_returns` /
`end_episode`; the driver records the logged actions (its slots report
them, see external_env.py), so the learner trains on them. After `num_epochs` passes over the logs `run()` returns and the
driver ends with `ExternalEnvFinished` once the last episode is in (the
learner's `run_async()` raises it; `None` epochs: forever). An episode's id is
its logged id (plus "#<epoch>" after the first pass).

`EpisodeLogWriter` writes such logs.

The fast route: `load_into_replayer(paths, replayer, data_spec, num_rows)`
reads the logs straight into a replayer (e.g. a UniformReplayer), with no
driver and no policy inference per logged step, as the transitions the
OfflineEnv route would give the learner: an episode of n logged steps is n
transitions (FIRST, MID, ...; the last with discount 0 when terminated)
followed, when terminated, by the LAST -> FIRST boundary at the terminal
observation; an episode cut short ends with its last transition as an
inert boundary (step type LAST, reward 0, discount 1: its outcome is
unknown; its observation stays, the next observation of the transition
before it). Whole episodes go to the row that holds the fewest steps, so
each row is a contiguous stream of episodes and a sampled window never
joins two unrelated steps. Observations and actions are checked against
`data_spec` per episode (one vectorised check; a failure names file and
line).

Threads: `load_into_replayer` runs on the caller's thread (the replayer's
owner, e.g. the learner's). `run()` (the ExternalEnv thread) reads the logs and queues whole
episodes; `num_workers` daemon threads ("offline_feeder_<i>") feed one
episode each at a time, so that `num_workers` slots (the driver's num_envs)
are busy at once. A malformed line or a step that does not match the specs
raises in `run()` (naming file and line), which stops the driver and raises
it in the learner. On stop the workers' calls raise and they end; `run()`
joins them.
"""

import collections
import json
import logging
import queue
import threading

import numpy as np

from alf_async.environments.external import episode_api
from alf_async.environments.external.external_env import ExternalEnv, ExternalEnvStoppedError

logger = logging.getLogger(__name__)

_POLL_SECS = 0.2


class LogFormatError(ValueError):
    """A log line that is not a step of the documented format."""


class EpisodeLogWriter(object):
    """Writes steps as JSON lines (the OfflineEnv format). Not thread-safe."""

    def __init__(self, path):
        self._file = open(path, "w", encoding="utf-8")  # pylint: disable=consider-using-with

    def write_step(self, episode_id, observation, action, reward, done,
                   next_observation=None):
        step = {"episode_id": str(episode_id), "observation": _plain(observation),
                "action": _plain(action), "reward": float(reward), "done": bool(done)}
        if next_observation is not None:
            step["next_observation"] = _plain(next_observation)
        self._file.write(json.dumps(step, allow_nan=False) + "\n")

    def close(self):
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value.tolist() if hasattr(value, "tolist") else value


def read_episodes(paths):
    """Yields (episode_id, steps, terminated) per logged episode, in completion order.

    `steps` is a list of (where, step dict); `where` is "file:line". Episodes
    still open at the end of the last file come last, with terminated False.

    Raises:
        LogFormatError: a line that is not a JSON step object.
    """
    open_episodes = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                where = f"{path}:{lineno}"
                step = _parse_step(line, where)
                steps = open_episodes.setdefault(step["episode_id"], [])
                steps.append((where, step))
                if step["done"]:
                    yield step["episode_id"], open_episodes.pop(step["episode_id"]), True
    for episode_id, steps in open_episodes.items():
        yield episode_id, steps, False


def _parse_step(line, where):
    try:
        step = _DECODER.decode(line)
    except ValueError as e:
        raise LogFormatError(f"{where}: not a JSON object: {e}") from None
    if not isinstance(step, dict):
        raise LogFormatError(f"{where}: expected a JSON object, got {type(step).__name__}")
    missing = [k for k in ("episode_id", "observation", "action", "reward", "done")
               if k not in step]
    if missing:
        raise LogFormatError(f"{where}: missing fields {missing}")
    if not isinstance(step["episode_id"], (str, int)) or isinstance(step["episode_id"], bool):
        raise LogFormatError(f"{where}: episode_id must be a string or an integer")
    step["episode_id"] = str(step["episode_id"])
    if not isinstance(step["done"], bool):
        raise LogFormatError(f"{where}: done must be true or false")
    if isinstance(step["reward"], bool) or not isinstance(step["reward"], (int, float)):
        raise LogFormatError(f"{where}: reward must be a number")
    return step


def _refuse(name):
    raise ValueError(f"{name} is not allowed")


# One decoder for every line: json.loads with an argument builds a new one per call.
_DECODER = json.JSONDecoder(parse_constant=_refuse)


class OfflineEnv(ExternalEnv):
    """An ExternalEnv whose run() replays logged episodes (see the module docstring)."""

    def __init__(self, paths, action_spec, observation_spec, num_epochs=1, num_workers=4,
                 name="offline_env", **external_env_kwargs):
        """
        Args:
            paths: log files (JSON lines), read in order.
            action_spec: an array spec nest (or a gym space).
            observation_spec: an array spec nest (or a gym space).
            num_epochs: passes over the logs; None: forever.
            num_workers: episodes fed at once; match the driver's num_envs.
            name: the ExternalEnv thread's name.
            **external_env_kwargs: more ExternalEnv arguments.
        """
        external_env_kwargs.setdefault("max_concurrent", max(num_workers, 1))
        super().__init__(action_spec, observation_spec, name=name, **external_env_kwargs)
        if isinstance(paths, str):
            paths = [paths]
        self._paths = list(paths)
        self._num_epochs = num_epochs
        self._num_workers = int(num_workers)
        self._episodes_queue = queue.Queue(maxsize=2 * self._num_workers)
        self._worker_error = None
        self.episodes_fed = 0
        self.steps_fed = 0
        self._count_lock = threading.Lock()

    def run(self):
        workers = [threading.Thread(target=self._work, name=f"offline_feeder_{i}",
                                    daemon=True) for i in range(self._num_workers)]
        for w in workers:
            w.start()
        try:
            epoch = 0
            while self._num_epochs is None or epoch < self._num_epochs:
                for episode_id, steps, terminated in read_episodes(self._paths):
                    name = episode_id if epoch == 0 else f"{episode_id}#{epoch}"
                    if not self._put((name, steps, terminated)):
                        return
                epoch += 1
        finally:
            for _ in workers:
                self._put(None)
            for w in workers:   # they end at their sentinel, on stop or on an error
                while w.is_alive():
                    w.join(_POLL_SECS)
            if self._worker_error is not None and not self.stopped:
                raise self._worker_error

    def _put(self, item):
        """Queues an item for the workers; False once stopped or a worker failed."""
        while not self.stopped and self._worker_error is None:
            try:
                self._episodes_queue.put(item, timeout=_POLL_SECS)
                return True
            except queue.Full:
                continue
        return False

    def _work(self):
        while not self.stopped and self._worker_error is None:
            try:
                item = self._episodes_queue.get(timeout=_POLL_SECS)
            except queue.Empty:
                continue
            if item is None:
                return
            try:
                self._feed(*item)
            except ExternalEnvStoppedError:
                return
            except Exception as e:  # pylint: disable=broad-except
                if self._worker_error is None:
                    self._worker_error = e
                return

    def _feed(self, episode_id, steps, terminated):
        try:
            self.start_episode(episode_id)
        except ValueError as e:   # e.g. an id logged again after its done
            raise LogFormatError(f"{steps[0][0]}: {e}") from None
        for where, step in steps:
            try:
                self.log_action(episode_id, step["observation"], step["action"])
                self.log_returns(episode_id, step["reward"])
            except ValueError as e:
                raise LogFormatError(f"{where}: {e}") from None
        where, last = steps[-1]
        try:
            if terminated:
                self.end_episode(episode_id, last.get("next_observation", last["observation"]))
            else:
                self.abandon_episode(episode_id)
        except ValueError as e:
            raise LogFormatError(f"{where}: {e}") from None
        with self._count_lock:
            self.episodes_fed += 1
            self.steps_fed += len(steps)


# ------------------------------------------------------ straight into a replayer

LoadStats = collections.namedtuple("LoadStats", ["episodes", "logged_steps", "transitions"])

_FIRST, _MID, _LAST = 0, 1, 2


def load_into_replayer(paths, replayer, data_spec, num_rows, num_epochs=1, chunk_steps=4096):
    """Reads logged episodes straight into `replayer` (see the module docstring).

    Args:
        paths: log files (JSON lines), read in order; or one path.
        replayer: an exp_observer `replayer(exp, env_ids)` taking Trajectories
            [rows, T, ...] whose rows are env ids in [0, num_rows), e.g. a
            `UniformReplayer(data_spec, num_rows)`.
        data_spec: the Trajectory TensorSpec of one step (the agent's
            `collect_data_spec`): the logs' observations and actions must
            match its observation and action specs.
        num_rows: rows to spread the episodes over.
        num_epochs: passes over the logs (each pass appends them again).
        chunk_steps: most steps of one row per replayer call (keep it at
            most the replayer's capacity per row).

    Returns:
        LoadStats(episodes, logged_steps, transitions written).

    Raises:
        LogFormatError: a malformed line, or a step that does not match the
            specs (naming file and line).
    """
    # pylint: disable=import-outside-toplevel
    import tensorflow as tf
    from tf_agents.specs import tensor_spec
    if isinstance(paths, str):
        paths = [paths]
    obs_spec = tensor_spec.to_nest_array_spec(data_spec.observation)
    action_spec = tensor_spec.to_nest_array_spec(data_spec.action)
    rows = [_Row() for _ in range(int(num_rows))]
    episodes = logged = 0
    for _ in range(num_epochs):
        for _, steps, terminated in read_episodes(paths):
            row = min(rows, key=lambda r: r.length)
            row.add(_episode_arrays(steps, terminated, obs_spec, action_spec))
            episodes += 1
            logged += len(steps)
    transitions = 0
    for r, row in enumerate(rows):
        if not row.parts:
            continue
        columns = row.concatenate()
        n = len(columns["step_type"])
        for start in range(0, n, chunk_steps):
            cut = slice(start, min(start + chunk_steps, n))
            replayer(_trajectory(tf, data_spec, columns, cut), tf.constant([r], tf.int32))
        transitions += n
    return LoadStats(episodes, logged, transitions)


class _Row(object):
    """One replayer row's episodes, as column arrays, in order."""

    def __init__(self):
        self.parts = []
        self.length = 0

    def add(self, columns):
        self.parts.append(columns)
        self.length += len(columns["step_type"])

    def concatenate(self):
        return {k: _concat([p[k] for p in self.parts]) for k in self.parts[0]}


def _concat(parts):
    if isinstance(parts[0], dict):
        return {k: _concat([p[k] for p in parts]) for k in parts[0]}
    if isinstance(parts[0], (list, tuple)):
        items = [_concat([p[i] for p in parts]) for i in range(len(parts[0]))]
        return type(parts[0])(*items) if hasattr(parts[0], "_fields") else type(parts[0])(items)
    return np.concatenate(parts)


def _stack(values, spec):
    """A list of logged nests -> one nest of lists (leaves stacked later)."""
    if isinstance(spec, dict):
        if not all(isinstance(v, dict) for v in values):
            raise ValueError("expected a dict")
        return {k: _stack([v.get(k) for v in values], s) for k, s in spec.items()}
    if isinstance(spec, (list, tuple)):
        items = [_stack([v[i] for v in values], s) for i, s in enumerate(spec)]
        return type(spec)(*items) if hasattr(spec, "_fields") else type(spec)(items)
    return values


class _Batched(object):
    """An array spec with a leading dimension of n (for one vectorised check)."""

    def __init__(self, spec, n):
        self.shape = (n,) + tuple(spec.shape)
        self.dtype = spec.dtype
        if hasattr(spec, "minimum"):
            self.minimum, self.maximum = spec.minimum, spec.maximum


def _checked_steps(values, spec, what, steps):
    """Stacks and checks `values` (one nest per step) against `spec`."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    batched = tf.nest.map_structure(lambda s: _Batched(s, len(values)), spec)
    try:
        return episode_api.check_nest(_stack(values, spec), batched, what)
    except (ValueError, TypeError, IndexError, KeyError):
        for (where, _), value in zip(steps, values):   # find the line at fault
            try:
                episode_api.check_nest(value, spec, what)
            except ValueError as e:
                raise LogFormatError(f"{where}: {e}") from None
        raise LogFormatError(f"{steps[0][0]}: {what}s do not match the spec") from None


def _episode_arrays(steps, terminated, obs_spec, action_spec):
    """One logged episode as the columns of its transitions (see the module docstring)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    n = len(steps)
    records = [step for _, step in steps]
    observations = [r["observation"] for r in records]
    if terminated:
        last = records[-1]
        observations.append(last.get("next_observation", last["observation"]))
    obs = _checked_steps(observations, obs_spec, "observation",
                         steps + [steps[-1]] if terminated else steps)
    actions = _checked_steps([r["action"] for r in records], action_spec, "action", steps)
    try:
        rewards = np.array([episode_api.check_reward(r["reward"]) for r in records], np.float32)
    except ValueError as e:
        raise LogFormatError(f"{steps[0][0]}: {e}") from None
    m = n + 1 if terminated else n            # transitions
    step_type = np.full([m], _MID, np.int32)
    step_type[0] = _FIRST
    next_step_type = np.full([m], _MID, np.int32)
    reward = np.zeros([m], np.float32)
    discount = np.ones([m], np.float32)
    reward[:n] = rewards
    if terminated:
        next_step_type[n - 1] = _LAST
        discount[n - 1] = 0.0
        step_type[n] = _LAST
        next_step_type[n] = _FIRST
        reward[n] = 0.0
        actions = tf.nest.map_structure(
            lambda a, s: np.concatenate([a, _blank(s)[None]]), actions, action_spec)
    else:   # cut short: the last transition's outcome is unknown
        step_type[n - 1] = _LAST
        next_step_type[n - 1] = _FIRST
        reward[n - 1] = 0.0
        for a, s in zip(tf.nest.flatten(actions), tf.nest.flatten(action_spec)):
            a[n - 1] = _blank(s)
    return dict(step_type=step_type, observation=obs, action=actions,
                next_step_type=next_step_type, reward=reward, discount=discount)


def _blank(spec):
    """The action an inert boundary carries: the spec's minimum (or zeros)."""
    return np.broadcast_to(np.asarray(getattr(spec, "minimum", 0), spec.dtype), spec.shape)


def _trajectory(tf, data_spec, columns, cut):
    """The Trajectory [1, T, ...] of rows `cut` of `columns`."""
    from tf_agents.trajectories import trajectory  # pylint: disable=import-outside-toplevel
    n = cut.stop - cut.start

    def take(x):
        return tf.convert_to_tensor(x[cut][None])

    return trajectory.Trajectory(
        step_type=take(columns["step_type"]),
        observation=tf.nest.map_structure(take, columns["observation"]),
        action=tf.nest.map_structure(take, columns["action"]),
        policy_info=tf.nest.map_structure(
            lambda s: tf.zeros([1, n] + s.shape.as_list(), s.dtype), data_spec.policy_info),
        next_step_type=take(columns["next_step_type"]),
        reward=take(columns["reward"]),
        discount=take(columns["discount"]))

