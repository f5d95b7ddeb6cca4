"""The rows of one forward pass as a side of benchmarks/step_breakdown.py
runs the parsed gin config (its inference part times that many rows)."""


def forward_rows(side):
    """Rows per forward pass as `side` runs the parsed gin config: alf_async's
    actors batch `actor_queue_cap` env threads of `env_batch_size` games, an
    env thread acting itself (`num_actor_queues = 0`) its own
    `env_batch_size`; the synchronous loop all `num_envs x env_batch_size`."""
    import gin
    q = _query  # the bound value, else train()'s default
    batch = gin.query_parameter("Layout.rows_per_env_thread")
    if side != "alf_async":
        return batch * q("Layout.env_threads", 1)
    return batch * (q("Layout.actor_queue_cap", 1) if q("Layout.actor_queues", 1) else 1)


def _query(name, default):
    import gin
    try:
        return gin.query_parameter(name)
    except ValueError:  # not bound: train()'s default
        return default
