"""Running again on a root_dir: finished or not, what the checkpoint restores, what applies.

What `train()` does with each kind of setting when it resumes:

- Settings that live in the graph as Python values are the config's, with
  nothing to do: they are not in the checkpoint. That is every `train.*`
  limit and interval, tf-agents' agent arguments (`DqnAgent.gamma`,
  `n_step_update`, `target_update_tau` / `_period`, ...), and the epsilon
  schedule of `agents.dqn_agent` (`epsilon_greedy`, `epsilon_final`,
  `epsilon_decay_steps`: a function of the restored global step).
- Settings the checkpoint stores as variables: the optimizers' learning
  rates (and a legacy Keras optimizer's other hyperparameters,
  `agents.optimizer_hyperparameters`). They are restored with the
  optimizer's state (its step count and moments), then set back to the
  config's values (`apply_config`), and each one that changed is printed.
  The saved operative config therefore always states what runs.
- Settings that shape the checkpoint (`CHECKPOINT_SHAPING_BINDINGS`: network sizes, the
  environment, `Layout.env_threads x Layout.rows_per_env_thread` replay rows, replay capacity)
  cannot change: the restore fails and `incompatible_message` says which
  bindings differ from the run's last operative config; a new `--root_dir`
  starts fresh.
- A finished run is not resumed (`finished`): its `num_iterations` or
  `num_env_steps` was reached, or it is solved (an evaluation reached
  `stop_at_eval_return`; a higher `stop_at_eval_return` trains on).
"""

import ast
import collections
import glob
import os
import re

import gin
import tensorflow as tf

from alf_async.learning import agents
from alf_async.learning.learner import Hook

# Bindings whose values shape the checkpoint's variables.
CHECKPOINT_SHAPING_BINDINGS = (
    "Task.suite", "Task.env_name", "Task.agent_fn", "Task.replayer_fn", "Layout.env_threads",
    "Layout.rows_per_env_thread", "UniformReplayer.capacity_per_row",
    "PixelReplayer.capacity_per_row", "dqn_agent.agent_class", "dqn_agent.fc_layer_params",
    "dqn_agent.conv_layer_params", "sac_agent.actor_fc_layer_params",
    "sac_agent.critic_joint_fc_layer_params")

Finished = collections.namedtuple("Finished", ["reason", "global_step", "env_steps",
                                               "iterations"])
Finished.__doc__ = """A finished run: why (one line) and its counters."""


def checkpoint_dir(root_dir):
    return os.path.join(root_dir, "train")


def finished(root_dir, num_iterations, num_env_steps, stop_at_eval_return):
    """A `Finished` if the latest checkpoint in `root_dir` has nothing left to do, else None.

    Reads the checkpoint's counters only (nothing is built).
    """
    path = tf.train.latest_checkpoint(checkpoint_dir(root_dir))
    if path is None:
        return None
    reader = tf.train.load_checkpoint(path)

    def value(name, default):
        key = f"{name}/.ATTRIBUTES/VARIABLE_VALUE"
        return reader.get_tensor(key) if reader.has_tensor(key) else default

    iterations = int(value("counters/iterations", 0))
    env_steps = int(value("counters/env_steps", 0))
    global_step = int(value("global_step", 0))
    solved_step = int(value("solved/step", -1))
    solved_return = float(value("solved/average_return", float("-inf")))
    if num_iterations is not None and iterations >= num_iterations:
        reason = f"Schedule.num_iterations = {num_iterations} reached"
    elif num_env_steps is not None and env_steps >= num_env_steps:
        reason = f"Schedule.num_env_steps = {num_env_steps} reached"
    elif (stop_at_eval_return is not None and solved_step >= 0 and
          solved_return >= stop_at_eval_return):
        reason = (f"solved at train step {solved_step} (evaluation AverageReturn "
                  f"{solved_return:.1f} >= Evaluation.stop_at_return = {stop_at_eval_return:g})")
    else:
        return None
    return Finished(reason, global_step, env_steps, iterations)


def configured_values(agent):
    """[(name, variable, the config's value)] of the hyperparameters a restore overwrites;
    call it before restoring."""
    return [(name, variable, variable.numpy())
            for name, variable in agents.optimizer_hyperparameters(agent)]


def apply_config(configured):
    """Sets each restored hyperparameter back to the config's value.

    Args:
        configured: what `configured_values` returned before the restore.

    Returns:
        ["name = config value (the checkpoint had restored value)"] for each
            one the checkpoint had with another value.
    """
    changed = []
    for name, variable, value in configured:
        restored = variable.numpy()
        if restored != value:
            variable.assign(value)
            changed.append(f"{name} = {value:.6g} (the checkpoint had {restored:.6g})")
    return changed


def incompatible_message(root_dir, error, operative_config):
    """One line: why `root_dir`'s checkpoint cannot be restored into this config.

    Args:
        root_dir: the run directory.
        error: the restore's exception.
        operative_config: gin's operative config now (every configurable
            that built the checkpointed objects has been called).
    """
    previous = _latest_operative_config(root_dir)
    differences = []
    if previous is not None:
        old, new = _bindings(previous), _bindings(operative_config)
        for name in CHECKPOINT_SHAPING_BINDINGS:
            if name in old and name in new and old[name] != new[name]:
                differences.append(f"{name} was {old[name]}, this config says {new[name]}")
    if not differences:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        differences.append("TensorFlow: " + (lines[0] if lines else type(error).__name__))
    return (f"--root_dir {root_dir} holds a checkpoint this config cannot resume ("
            f"{'; '.join(differences)}): a new --root_dir starts fresh")


class OperativeConfigHook(Hook):
    """Saves gin's operative config in `root_dir` once training started
    (then every configurable has been called) or, at the latest, at the end.

    Args:
        root_dir: the run directory.
        layout: the layout `Layout.choice = 'auto'` chose (as
            `layout.format_layout` names it), written in the config in place of
            'auto' so that the config states what ran and a resumed run
            reuses it (`saved_layout`); None: the config as gin has it.
    """

    def __init__(self, root_dir, layout=None):
        self._root_dir = root_dir
        self._layout = layout
        self._written = False

    def after_iteration(self, learner, train_step_before, train_step):
        if learner.training and not self._written:
            self._write(learner)

    def end(self, learner, stopped_by):
        if not self._written:
            self._write(learner)

    def _write(self, learner):
        text = gin.operative_config_str()
        if self._layout is not None:
            binding = (f"# chosen by Layout.choice 'auto', measuring when the run started:\n"
                       f"Layout.choice = {self._layout!r}")
            text, found = re.subn(r"^Layout\.choice = ['\"]auto['\"]$", binding, text,
                                  flags=re.MULTILINE)
            if not found:   # 'auto' passed to train() in Python, not bound in gin
                text = text.rstrip("\n") + "\n\n" + binding + "\n"
        path = os.path.join(self._root_dir, f"operative_config-{learner.train_step}.gin")
        tf.io.gfile.makedirs(self._root_dir)
        with tf.io.gfile.GFile(path, "w") as f:
            f.write(text)
        self._written = True


def saved_layout(root_dir):
    """The layout `Layout.choice` names in `root_dir`'s latest operative
    config when it names one (what `Layout.choice = 'auto'` chose when the
    run started), else None."""
    text = _latest_operative_config(root_dir)
    value = None if text is None else _bindings(text).get("Layout.choice")
    if value is None:
        return None
    try:
        value = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, str) and value != "auto" else None


def _latest_operative_config(root_dir):
    paths = glob.glob(os.path.join(root_dir, "operative_config-*.gin"))
    if not paths:
        return None
    latest = max(paths, key=lambda p: (_step_of(p), os.path.getmtime(p)))
    with open(latest, encoding="utf-8") as f:
        return f.read()


def _step_of(path):
    match = re.search(r"operative_config-(\d+)\.gin$", path)
    return int(match.group(1)) if match else -1


def _bindings(config_text):
    """{'selector.param': value text} of a gin config's one-line bindings."""
    bindings = {}
    for line in config_text.splitlines():
        match = re.match(r"^([\w.]+) = (.+)$", line)
        if match:
            bindings[match.group(1)] = match.group(2).strip()
    return bindings
