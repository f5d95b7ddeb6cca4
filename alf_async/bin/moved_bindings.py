"""The bindings that moved out of `train()` and `collect()`, and the one
line that refuses each.

`train()` took 39 flat parameters (`train.num_envs`, ...) and `collect()`
copies of them; both now take the settings groups of `alf_async.settings`.
A gin file or `--gin_param` with an old binding is refused by gin ("doesn't
have a parameter named"); the CLIs turn that error into one line naming the
new binding (`moved_binding_error`). Pure Python: the CLIs read it without
TensorFlow.
"""

import re

# train()'s old flat bindings, and where each one lives now.
MOVED_BINDINGS = {
    "train.env_name": "Task.env_name",
    "train.agent_fn": "Task.agent_fn",
    "train.suite": "Task.suite",
    "train.make_env_constructor": "Task.make_env_constructor",
    "train.replayer_fn": "Task.replayer_fn",
    "train.num_envs": "Layout.env_threads",
    "train.env_batch_size": "Layout.rows_per_env_thread",
    "train.num_actor_queues": "Layout.actor_queues",
    "train.actor_queue_cap": "Layout.actor_queue_cap",
    "train.layout": "Layout.choice",
    "train.layout_budget_secs": "Layout.auto_budget_secs",
    "train.unroll_length": "Schedule.unroll_length",
    "train.learn_queue_cap": "Schedule.rows_per_batch",
    "train.batches_ahead": "Schedule.batches_ahead",
    "train.num_iterations": "Schedule.num_iterations",
    "train.num_env_steps": "Schedule.num_env_steps",
    "train.initial_collect_steps": "Schedule.initial_collect_steps",
    "train.random_initial_collect": "Schedule.random_initial_collect",
    "train.train_steps_per_iteration": "Schedule.train_steps_per_iteration",
    "train.sample_batch_size": "Schedule.sample_batch_size",
    "train.num_eval_episodes": "Evaluation.episodes",
    "train.eval_interval": "Evaluation.interval",
    "train.stop_at_eval_return": "Evaluation.stop_at_return",
    "train.greedy_eval": "Evaluation.greedy",
    "train.eval_epsilon": "Evaluation.epsilon",
    "train.eval_env_kwargs": "Evaluation.env_kwargs",
    "train.async_eval": "Evaluation.in_background",
    "train.summary_interval": "Outputs.summary_interval",
    "train.checkpoint_interval": "Outputs.checkpoint_interval",
    "train.log_interval_secs": "Outputs.log_interval_secs",
    "train.inter_op_threads": "Runtime.inter_op_threads",
    "train.intra_op_threads": "Runtime.intra_op_threads",
    "train.seed": "Runtime.seed",
    "train.kernel_choice": "Runtime.kernel_choice",
    "train.num_collectors": "Collectors.count",
    "train.collector_launcher": "Collectors.launcher",
}
# collect()'s: a collector builds its Task and Layout in the gin scope `collect`.
MOVED_BINDINGS.update({
    "collect.env_name": "collect/Task.env_name",
    "collect.agent_fn": "collect/Task.agent_fn",
    "collect.suite": "collect/Task.suite",
    "collect.make_env_constructor": "collect/Task.make_env_constructor",
    "collect.num_envs": "collect/Layout.env_threads",
    "collect.env_batch_size": "collect/Layout.rows_per_env_thread",
    "collect.num_actor_queues": "collect/Layout.actor_queues",
    "collect.actor_queue_cap": "collect/Layout.actor_queue_cap",
    "collect.learn_queue_cap": "collect.rows_per_batch",
})
# What changed besides the name, said where a moved binding is refused.
_MOVED_NOTES = {
    "train.learn_queue_cap": " (rows, not env threads' unrolls: learn_queue_cap x "
                             "rows_per_env_thread)",
    "collect.learn_queue_cap": " (rows, not env threads' unrolls: learn_queue_cap x "
                               "rows_per_env_thread)",
}


def moved_binding_error(text):
    """The one line for gin's error `text` when it refuses a binding that
    moved from `train.*` or `collect.*` (its "Configurable 'train' doesn't
    have a parameter named ..."), else None."""
    match = re.search(r"Configurable '(train|collect)' doesn't have a parameter named '(\w+)'",
                      text)
    old = f"{match.group(1)}.{match.group(2)}" if match else None
    if old not in MOVED_BINDINGS:
        return None
    page = "many-machines.md" if old.startswith("collect.") else "training-runs.md"
    return (f"{old} moved: bind {MOVED_BINDINGS[old]} instead{_MOVED_NOTES.get(old, '')} "
            f"(docs/guides/{page} lists every setting)")
