"""Every item of a learner's replay table, read once, and what they say
about the steps collectors wrote (benchmarks/network_faults.py):

    items = read_checkpoint(os.path.join(root_dir, "replay"), REPLAY_TABLE,
                            [VARIABLE_TABLE, STATS_TABLE])   # {key: observation}
    report = row_runs(items)   # spliced items, steps no item holds

`read_checkpoint` restores a learner's Reverb checkpoint on a server of its
own and drains the replay table there. Reverb restores a table with its
own sampler and rate limiter (uniform, `SampleToInsertRatio`, with the
learner's counts), so there is no way to read it in order: `drain` samples
in batches and deletes what it sampled, inserting placeholder items (told
apart by their priority) whenever the rate limiter allows no more samples,
until no real item is left. Reverb has no call that lists a table's items.

`row_runs` reads observations of `envs.counting_rows` ([env index, counter,
step in episode]; the counter goes up by one at every step of a row,
resets included): an item is whole when all its steps are one row's and
their counters consecutive.

Threads: one thread calls everything here.
"""

import math

import numpy as np
import reverb
import tensorflow as tf


PLACEHOLDER_PRIORITY = 0.25  # real items are inserted with priority 1


def read_checkpoint(checkpoint_dir, table, other_tables=(), batch=256):
    """The items of `table` in the latest Reverb checkpoint under
    `checkpoint_dir` (a learner's ROOT_DIR/replay), as {key: its [L, 3]
    observation}. `other_tables`: the names of the checkpoint's other
    tables (Reverb restores only tables it is given by name, replacing
    them with what it restored, and refuses a checkpoint with others)."""
    names = {table, *other_tables}
    server = reverb.Server([reverb.Table.queue(name, 1) for name in sorted(names)],
                           checkpointer=reverb.checkpointers.DefaultCheckpointer(checkpoint_dir))
    try:
        return drain(reverb.Client(f"localhost:{server.port}"), table, batch, observation)
    finally:
        server.stop()


def drain(client, table, batch=256, keep=lambda data: data):
    """Samples and deletes every item of `table`, which nobody else samples
    or writes; returns {key: keep(data nest)} of the real ones."""
    info = client.server_info()[table]
    signature = info.signature
    length = int(tf.nest.flatten(signature)[0].shape[0])
    step = tf.nest.map_structure(lambda s: np.zeros(s.shape[1:], s.dtype.as_numpy_dtype),
                                 signature)
    items, placeholders = {}, 0
    with client.trajectory_writer(num_keep_alive_refs=length) as writer:
        while True:
            info = client.server_info()[table]
            if info.current_size - placeholders <= 0:
                return items
            limiter = info.rate_limiter_info
            room = (limiter.insert_stats.completed * limiter.samples_per_insert
                    - limiter.sample_stats.completed - limiter.min_diff)
            take = int(min(batch, math.floor(room) - 1))
            if take < 1 or info.current_size < limiter.min_size_to_sample:
                more = max(math.ceil((batch - room + 1) / limiter.samples_per_insert),
                           limiter.min_size_to_sample - info.current_size, 1)
                for _ in range(more):
                    for _ in range(length):
                        writer.append(step)
                    writer.create_item(table, PLACEHOLDER_PRIORITY, tf.nest.map_structure(
                        lambda column: column[-length:], writer.history))
                writer.flush()
                placeholders += more
                continue
            sampled = {}
            for sample in client.sample(table, num_samples=take, emit_timesteps=False,
                                        unpack_as_table_signature=True):
                sampled[int(sample.info.key)] = sample
            for key, sample in sampled.items():
                if float(sample.info.priority) == PLACEHOLDER_PRIORITY:
                    placeholders -= 1
                else:
                    items[key] = keep(sample.data)
            client.mutate_priorities(table, deletes=list(sampled))


def observation(data):
    """The observation of an item (a Trajectory or a dict of fields)."""
    return np.asarray(data["observation"] if isinstance(data, dict) else data.observation)


def row_runs(items):
    """What the items ({key: [L, 3] observation}) say of the rows that wrote them.

    Returns:
        dict: the number of `items`; `spliced`, how many are not one row's
            consecutive steps; `rows`, the env indices seen; `missing`,
            {env index: the counters between its first and last step that
            no item holds} (steps lost).
    """
    spliced = 0
    held = {}
    for obs in items.values():
        env, counter = obs[:, 0], obs[:, 1]
        if not (env == env[0]).all() or not (np.diff(counter) == 1).all():
            spliced += 1
            continue
        held.setdefault(int(env[0]), set()).update(int(c) for c in counter)
    missing = {}
    for env, counters in held.items():
        gaps = sorted(set(range(min(counters), max(counters) + 1)) - counters)
        if gaps:
            missing[env] = gaps
    return dict(items=len(items), spliced=spliced, rows=sorted(held), missing=missing)
