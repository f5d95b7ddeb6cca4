"""The local-inference half of a `PolicyClient` (`inference_mode="local"`):
a copy of the server's policy, acting in this process, and the buffer of
experience it reports to the server in batches. TensorFlow and tf-agents
are imported only when the policy is first loaded.
"""

import io
import os
import shutil
import tarfile
import tempfile
import threading
import time
import uuid
import weakref

import numpy as np

from alf_async.environments.external import episode_api
from alf_async.serving import protocol


class _LocalEpisode(object):
    __slots__ = ("first", "policy_state", "reward")

    def __init__(self):
        self.first = True
        self.policy_state = None
        self.reward = 0.0


class LocalInference(object):
    """The local-inference half of a PolicyClient (policy copy + report buffer).

    Threads: any client thread; `_policy_lock` serialises inference and
    weight updates, `_report_lock` keeps reports in order, `_lock` guards
    the buffer and the episodes.
    """

    def __init__(self, client, update_interval, report_interval, report_max_events,
                 max_body_bytes):
        self._client = client
        self._update_interval = float(update_interval)
        self._report_interval = float(report_interval)
        self._report_max = int(report_max_events)
        self._max_body = int(max_body_bytes)
        self._lock = threading.Lock()
        self._policy_lock = threading.Lock()
        self._report_lock = threading.Lock()
        self._events = []
        self._last_report = time.monotonic()
        self._episodes = {}
        self._finished = set()
        self._policy = None
        self._obs_spec = None
        self._time_step_spec = None
        self._etag = None
        self._last_update = float("-inf")
        self._dir = None
        self.policy_updates = 0   # weight refreshes that changed the policy

    # ------------------------------------------------------------ episodes

    def start_episode(self, episode_id, training_enabled):
        if episode_api.check_episode_id(episode_id, allow_none=True) is None:
            episode_id = uuid.uuid4().hex
        with self._lock:
            if episode_id in self._episodes:
                raise ValueError(f"episode {episode_id!r} is already started")
            if episode_id in self._finished:
                raise ValueError(f"episode {episode_id!r} has already finished")
            self._episodes[episode_id] = _LocalEpisode()
            self._events.append({"command": "start_episode", "episode_id": episode_id,
                                 "training_enabled": bool(training_enabled)})
        self._maybe_report()
        return episode_id

    def get_action(self, episode_id, observation):
        from tf_agents.trajectories import time_step as ts  # pylint: disable=import-outside-toplevel
        self._ensure_policy()
        with self._lock:
            ep = self._episode(episode_id)
        obs = episode_api.check_nest(observation, self._obs_spec, "observation")
        spec = self._time_step_spec
        time_step = ts.TimeStep(
            step_type=np.asarray(ts.StepType.FIRST if ep.first else ts.StepType.MID,
                                 spec.step_type.dtype),
            reward=np.asarray(ep.reward, spec.reward.dtype),
            discount=np.asarray(1.0, spec.discount.dtype),
            observation=obs)
        with self._policy_lock:
            if ep.policy_state is None:
                ep.policy_state = self._policy.get_initial_state(batch_size=1)
            step = self._policy.action(time_step, ep.policy_state)
        ep.policy_state = step.state
        self._log(episode_id, ep, obs, step.action)
        self._maybe_report()
        return step.action

    def log_action(self, episode_id, observation, action):
        with self._lock:
            ep = self._episode(episode_id)
        self._log(episode_id, ep, observation, action)
        self._maybe_report()

    def log_returns(self, episode_id, reward, info):
        reward = episode_api.check_reward(reward)
        with self._lock:
            ep = self._episode(episode_id)
            if ep.first:
                raise ValueError(f"log_returns for episode {episode_id!r} before its first "
                                 f"action: a reward belongs to the action before it")
            ep.reward += reward
            event = {"command": "log_returns", "episode_id": episode_id, "reward": reward}
            if info is not None:
                event["info"] = info
            self._events.append(event)
        self._maybe_report()

    def end_episode(self, episode_id, observation):
        with self._lock:
            self._episode(episode_id)
            del self._episodes[episode_id]
            self._finished.add(episode_id)
            self._events.append({"command": "end_episode", "episode_id": episode_id,
                                 "observation": episode_api.to_json(observation)})
        self._maybe_report()

    def _episode(self, episode_id):
        ep = self._episodes.get(episode_id)
        if ep is None:
            if episode_id in self._finished:
                raise ValueError(f"episode {episode_id!r} has already finished")
            raise ValueError(f"episode {episode_id!r} is unknown: call start_episode() first")
        return ep

    def _log(self, episode_id, ep, observation, action):
        with self._lock:
            ep.first = False
            ep.reward = 0.0
            self._events.append({"command": "log_action", "episode_id": episode_id,
                                 "observation": episode_api.to_json(observation),
                                 "action": episode_api.to_json(action)})

    # ------------------------------------------------------------- reports

    def _maybe_report(self):
        with self._lock:
            due = (len(self._events) >= self._report_max or
                   time.monotonic() - self._last_report >= self._report_interval)
        if due:
            self.report()

    def report(self):
        with self._report_lock:
            with self._lock:
                events, self._events = self._events, []
                self._last_report = time.monotonic()
            if events:
                self._send(events)

    def _send(self, events):
        body = protocol.encode_command("report", events=events)
        if len(body) > self._max_body and len(events) > 1:
            half = len(events) // 2
            self._send(events[:half])
            self._send(events[half:])
            return
        self._client.call("report", events=events)

    # -------------------------------------------------------------- policy

    def _ensure_policy(self):
        with self._policy_lock:
            if self._policy is None:
                self._load_model()
            if time.monotonic() - self._last_update >= self._update_interval:
                self._update_weights()

    def _load_model(self):
        # pylint: disable=import-outside-toplevel
        from tf_agents.policies import py_tf_eager_policy
        from tf_agents.specs import tensor_spec
        blob = self._get(protocol.POLICY_MODEL_PATH)[1]
        self._dir = tempfile.mkdtemp(prefix="alf_async_client_policy_")
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._dir, ignore_errors=True)
        model_dir = os.path.join(self._dir, "model")
        _extract(blob, model_dir)
        self._policy = py_tf_eager_policy.SavedModelPyTFEagerPolicy(
            model_dir, load_specs_from_pbtxt=True, use_tf_function=True)
        self._time_step_spec = tensor_spec.to_nest_array_spec(self._policy.time_step_spec)
        self._obs_spec = self._time_step_spec.observation

    def _update_weights(self):
        self._last_update = time.monotonic()
        headers = {"If-None-Match": self._etag} if self._etag else {}
        etag, blob = self._get(protocol.POLICY_WEIGHTS_PATH, headers)
        if blob is None:   # 304: unchanged
            return
        ckpt_dir = tempfile.mkdtemp(dir=self._dir)
        try:
            _extract(blob, ckpt_dir)
            self._policy.update_from_checkpoint(ckpt_dir)
        finally:
            shutil.rmtree(ckpt_dir, ignore_errors=True)
        self._etag = etag
        self.policy_updates += 1

    def _get(self, path, headers=None):
        status, response_headers, body = self._client.request("GET", path, headers=headers)
        if status == 304:
            return response_headers.get("ETag"), None
        if status != 200:
            raise protocol.exception_from_response(status, body)
        return response_headers.get("ETag"), body

    def close(self):
        try:
            self.report()
        finally:
            if self._dir is not None:
                self._cleanup()


def _extract(blob, directory):
    """Extracts a tar.gz from the server, refusing links and paths outside `directory`."""
    os.makedirs(directory, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        tar.extractall(directory, filter="data")
