"""Bytes and RSS of PixelReplayer on the Atari DQN data spec.

Builds a PixelReplayer for DQN's collect_data_spec with 84x84x4 uint8
observations (action int64, reward and discount float32, step types int32,
no policy_info), writes --steps steps of random frames laid out as real
stacks (episodes of 20-200 steps, each starting with its first frame
repeated, as gymnasium's FrameStackObservation and EnvPool pad), in unrolls
of --unroll steps from every row, and samples once (32 windows of 2 steps,
checking the stacks are consistent). Prints two plain tables:

- bytes per stored step: PixelReplayer's, measured from its variables
  (`bytes_per_step()`), against UniformReplayer's for the same spec,
  computed from the spec without allocating it;
- the process's VmRSS and VmHWM (peak) from /proc/self/status before the
  replay is allocated, after, after the writes and after the sample.

With --checkpoint_dir it also saves the replay with `tf.train.Checkpoint`
(as a run's checkpoint holds it), restores that into a new replayer (the
first one freed, as in a resumed run) and samples again with the same seed, and prints the checkpoint's bytes on disk
and the seconds to write and to restore it, with the host.

    python benchmarks/pixel_replay.py                    # 20K steps, a few seconds
    python benchmarks/pixel_replay.py --capacity 1000000 --rows 16 --steps 131072
    python benchmarks/pixel_replay.py --capacity 1000000 --rows 16 --steps 3072 \
        --checkpoint_dir /tmp/replay_ckpt                # also 102400 and 1000000 steps

These allocate a 1M-step replay (7.1 GB), as `dqn_breakout.gin` does; a
checkpoint of a full one needs as much free disk and, restored, twice the
memory: run them on a machine with that much free, with nothing else
measuring time beside them.
"""

import argparse
import gc
import os
import shutil
import time

import numpy as np

from host_info import host  # benchmarks/ is this script's directory

H = W = 84
S = 4


def memory_mib():
    """(VmRSS, VmHWM) of this process in MiB."""
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f if line.startswith(("VmRSS", "VmHWM")))
    return tuple(int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM"))


def atari_dqn_spec():
    import tensorflow as tf
    from tf_agents.trajectories import trajectory
    return trajectory.Trajectory(
        step_type=tf.TensorSpec([], tf.int32), observation=tf.TensorSpec([H, W, S], tf.uint8),
        action=tf.TensorSpec([], tf.int64), policy_info=(),
        next_step_type=tf.TensorSpec([], tf.int32), reward=tf.TensorSpec([], tf.float32),
        discount=tf.TensorSpec([], tf.float32))


def uniform_bytes_per_step(spec, capacity_per_row):
    """What UniformReplayer would take per step: every leaf whole, plus its cursors."""
    import tensorflow as tf
    return (sum(s.shape.num_elements() * s.dtype.size for s in tf.nest.flatten(spec))
            + 8 / capacity_per_row)


class Stacks:
    """Per row: random frames stacked as an Atari environment stacks them."""

    def __init__(self, rows, seed=0):
        self.rng = np.random.RandomState(seed)
        self.stack = np.zeros([rows, H, W, S], np.uint8)
        self.left = np.zeros(rows, np.int64)  # steps left in each row's episode

    def unroll(self, T):
        """The next T steps of every row: (stacks [rows, T, H, W, S], step types [rows, T])."""
        rows = len(self.left)
        frames = self.rng.randint(0, 256, size=[rows, T, H, W], dtype=np.uint8)
        stacks = np.empty([rows, T, H, W, S], np.uint8)
        types = np.empty([rows, T], np.int32)
        for r in range(rows):
            for t in range(T):
                if self.left[r] == 0:
                    self.left[r] = self.rng.randint(20, 201)
                    self.stack[r] = frames[r, t, :, :, None]
                    types[r, t] = 0  # FIRST
                else:
                    self.stack[r, ..., :-1] = self.stack[r, ..., 1:]
                    self.stack[r, ..., -1] = frames[r, t]
                    types[r, t] = 2 if self.left[r] == 1 else 1  # LAST, MID
                self.left[r] -= 1
                stacks[r, t] = self.stack[r]
        return stacks, types


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacity", type=int, default=20_000, help="steps in all rows")
    parser.add_argument("--rows", type=int, default=4, help="environment rows")
    parser.add_argument("--steps", type=int, default=4096, help="steps to write, all rows")
    parser.add_argument("--unroll", type=int, default=64, help="steps per row per batch")
    parser.add_argument("--checkpoint_dir", default=None,
                        help="also time a checkpoint of the replay here (emptied first)")
    args = parser.parse_args()
    machine = host()  # its calibration before TensorFlow and the replay load

    import tensorflow as tf
    from tf_agents.trajectories import trajectory

    from alf_async.learning.pixel_replayer import PixelReplayer

    started = time.monotonic()
    spec = atari_dqn_spec()
    capacity_per_row = args.capacity // args.rows
    memory = [("before allocation (TF loaded)", *memory_mib())]
    replayer = PixelReplayer(spec, num_rows=args.rows, capacity_per_row=capacity_per_row)
    storage_mib = sum(v.shape.num_elements() * v.dtype.size for v in replayer.variables) / 2**20
    memory.append(("after allocation", *memory_mib()))

    stacks = Stacks(args.rows)
    ids = np.arange(args.rows, dtype=np.int32)
    written = 0
    while written < args.steps:
        obs, types = stacks.unroll(args.unroll)
        shape = types.shape
        replayer(trajectory.Trajectory(
            step_type=types, observation=obs, action=np.zeros(shape, np.int64), policy_info=(),
            next_step_type=np.roll(types, -1, axis=1), reward=np.zeros(shape, np.float32),
            discount=np.ones(shape, np.float32)), ids)
        written += types.size
    memory.append((f"after writing {written:,} steps", *memory_mib()))
    sample = replayer.sample(32, 2).observation.numpy()
    # Within an episode the second stack is the first shifted by one frame.
    shifted = (sample[:, 1, ..., :-1] == sample[:, 0, ..., 1:]).all(axis=(1, 2, 3))
    fresh = (sample[:, 1, ..., :-1] == sample[:, 1, ..., -1:]).all(axis=(1, 2, 3))
    assert (shifted | fresh).all(), "a sampled stack is neither continued nor a padded start"
    memory.append(("after sampling 32 x 2 steps", *memory_mib()))

    if args.checkpoint_dir:
        # As a resumed run does: a new replayer, the old one gone.
        path, before, nbytes, write_secs = save_checkpoint(replayer, args.checkpoint_dir)
        held = replayer.num_frames()
        memory.append(("after the checkpoint's write", *memory_mib()))
        del replayer
        gc.collect()
        replayer = PixelReplayer(spec, num_rows=args.rows, capacity_per_row=capacity_per_row)
        restore_secs = restore_checkpoint(replayer, path, before)
        shutil.rmtree(args.checkpoint_dir)
        memory.append(("after its restore (a new replayer)", *memory_mib()))

    pixel = replayer.bytes_per_step()
    uniform = uniform_bytes_per_step(spec, capacity_per_row)
    capacity = args.rows * capacity_per_row
    print(f"Atari DQN spec (obs uint8 [{H}, {W}, {S}]), {args.rows} rows x "
          f"{capacity_per_row:,} steps = {capacity:,} steps")
    print()
    print(f"{'replayer':<16} {'bytes/step':>11} {'GB at this capacity':>20} {'GB at 1M steps':>15}")
    for name, per_step, how in (("PixelReplayer", pixel, "measured"),
                                ("UniformReplayer", uniform, "from the spec")):
        print(f"{name:<16} {per_step:>11,.1f} {per_step * capacity / 1e9:>20.2f} "
              f"{per_step * 1e6 / 1e9:>15.2f}   ({how})")
    print()
    print(f"replay variables: {storage_mib:,.0f} MiB")
    print(f"{'stage':<36} {'VmRSS MiB':>10} {'VmHWM MiB':>10}")
    for stage, rss, hwm in memory:
        print(f"{stage:<36} {rss:>10,.0f} {hwm:>10,.0f}")
    # 1.00: the variables were allocated in place; 2.00: a zeros tensor, then a copy.
    print(f"allocation: VmHWM rise / replay variables = "
          f"{(memory[1][2] - memory[0][2]) / storage_mib:.3f}")
    if args.checkpoint_dir:
        print()
        print(f"checkpoint of {held:,} held steps (capacity {capacity:,}): {nbytes / 2**20:,.1f} "
              f"MiB on disk ({nbytes / held:,.0f} bytes per held step), written in "
              f"{write_secs:.2f} s, restored in {restore_secs:.2f} s")
        print(f"host: {machine}")
    print(f"({time.monotonic() - started:.0f} s)")


def save_checkpoint(replayer, ckpt_dir):
    """Saves `replayer` into `ckpt_dir` (emptied first) as a run's checkpoint
    holds it; returns (its path, a seeded sample's stacks taken before, bytes
    on disk, seconds to write)."""
    import tensorflow as tf
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    os.makedirs(ckpt_dir)
    tf.random.set_seed(0)
    before = replayer.sample(32, 2).observation.numpy()
    start = time.perf_counter()
    path = tf.train.Checkpoint(replay_buffer=replayer).write(os.path.join(ckpt_dir, "replay"))
    write_secs = time.perf_counter() - start
    nbytes = sum(os.path.getsize(os.path.join(ckpt_dir, f)) for f in os.listdir(ckpt_dir))
    return path, before, nbytes, write_secs


def restore_checkpoint(replayer, path, before):
    """Restores `path` into `replayer`, checks the same seeded sample comes
    back; returns the seconds the restore took."""
    import tensorflow as tf
    start = time.perf_counter()
    tf.train.Checkpoint(replay_buffer=replayer).read(path).assert_consumed()
    restore_secs = time.perf_counter() - start
    tf.random.set_seed(0)
    after = replayer.sample(32, 2).observation.numpy()
    assert (before == after).all(), "a restored replay sampled other stacks"
    return restore_secs

if __name__ == "__main__":
    main()
