"""EnvPoolRows: an EnvPool pool's rows stepped by their env thread in EnvPool's
asynchronous mode, with no Python thread per row.

An env thread steps the rows of a batch one by one, whichever are ready first
(the driver's rows_loop.py). EnvPool does exactly that itself: in its
asynchronous mode `send(actions, env_ids)` hands some environments their
actions and returns at once, its C++ threads step them without the GIL, and
`recv()` returns the first `recv_batch_size` environments whose steps are
done, whichever they are. So the env thread needs no worker thread: `send`
queues a row's action (all the rows an actor reply answered go to EnvPool in
one `send`, made by the next `recv`), and `recv` receives the rows that are
done and records their time steps (`on_rows`, one indexed write per field
for the k rows), as SubprocessRows does row by row for child processes'
pipes.

How many rows one receive returns (`recv_batch_size`, k; fixed when the pool
is made, which needs k < batch_size for an asynchronous pool, or k =
batch_size = 1):

- A row is never held up by a row that is not ready: EnvPool fills each
  receive with the first k steps to finish, in the order they finish (its
  state buffer is written in completion order), so a slow row is simply not
  among them. A row that is done waits only until k - 1 other steps finish,
  and since the env thread sends every row it received before it receives
  again, all batch_size rows are always in flight: with k <= batch_size / 2
  at least as many other rows are stepping as it waits for. k = 1 makes no
  row wait for any other at all.
- Each receive is one request to the actor, i.e. one forward pass of the
  policy over k rows, and one pass of the env thread's loop. With k = 1 a
  pool of B rows costs B forward passes of one row per B steps: while the
  env thread waits for one row's action the other rows' steps finish and
  wait, so the forward pass, not the simulators, sets the pace (a
  convolutional policy's pass costs nearly as much for one row as for
  several). With k = B / 2 one half of the pool steps on EnvPool's threads
  while the policy acts for the other half: the overlap EnvPool's
  asynchronous mode is for, with EnvPool's own suggested ratio of
  num_envs = 2 x batch_size.

The default (`default_recv_batch_size`) is therefore k = max(1, B // 2);
`recv_batch_size=1` (gin: `suite_envpool.recv_batch_size = 1`) gives each
row its action the moment its step is done, for policies that are cheap per
call next to the environment's step.

EnvPool's `recv()` has no timeout and blocks until k rows in flight are done:
`recv` calls it only when at least k rows are in flight (then it returns
within about one step of the environments; the driver's stop is so not held
up) and otherwise sleeps `timeout` and returns nothing, as a queue with
nothing to come would.

Threads: every method is called by the owning env thread only; `recv`
blocks in EnvPool's receive (GIL released) while rows step, or at most
`timeout` seconds when fewer than k rows are in flight. The driver's stop
closes the environment from its own thread (EnvPoolEnv is a
`BlockingStep`): `EnvPoolEnv.close()` waits for a receive in progress
(freeing a pool under a receive would be unsafe), and the stepper's next
call to the closed pool raises RuntimeError, on which a stopping env thread
leaves quietly.
"""

import time

import numpy as np
from tf_agents.trajectories import time_step as ts

from alf_async.roles import RowStepper


def default_recv_batch_size(batch_size):
    """k = max(1, batch_size // 2): see the module docstring."""
    return max(1, batch_size // 2)


class EnvPoolRows(RowStepper):
    """A RowStepper over one EnvPool pool in asynchronous mode, with no threads."""

    def __init__(self, env, on_rows):
        """
        Args:
            env: the `envpool_envs.EnvPoolEnv` whose rows to step.
            on_rows: callable(rows, time_step), called in `recv` with the
                rows of each receive (int32 [k]) and their tf-agents TimeStep,
                batched over them (EnvPool applies the action it is given).
        """
        self._env = env
        self._on_rows = on_rows
        self._k = env.recv_batch_size
        self._in_flight = 0
        self._rows = []       # arrays of rows sent for since the last recv, and their actions
        self._actions = []

    @property
    def in_flight(self):
        """Rows sent to the pool (or being reset) whose time step has not come."""
        return self._in_flight + sum(len(r) for r in self._rows)

    def start(self):
        """Resets every row (in an asynchronous pool, made now if need be); each
        reports from a later `recv` once its first time step came."""
        self._env.reset_rows()
        self._in_flight = self._env.batch_size

    def send(self, rows, actions):
        """Rows `rows` step with `actions` (an array batched over them); sent
        to the pool, with the other rows' actions sent since, by the next
        `recv`."""
        self._rows.append(np.asarray(rows, np.int32))
        self._actions.append(np.asarray(actions))

    def recv(self, timeout):
        """Sends the actions queued by `send`, then receives the next k rows
        whose steps are done (see the module docstring for how long that
        waits).

        Returns:
            A list of (row, None): k rows, or none if fewer than k were in
                flight (after sleeping `timeout` seconds).
        """
        if self._rows:
            rows, actions = self._rows, self._actions
            if len(rows) > 1:
                rows, actions = [np.concatenate(rows)], [np.concatenate(actions)]
            self._rows, self._actions = [], []
            self._env.send_rows(rows[0], actions[0])
            self._in_flight += len(rows[0])
        if self._in_flight < self._k:
            time.sleep(timeout)   # nothing (or too little) in flight to wait for
            return []
        rows, (step_type, reward, discount, observation) = self._env.recv_rows()
        self._in_flight -= len(rows)
        self._on_rows(rows, ts.TimeStep(step_type, reward, discount, observation))
        return [(row, None) for row in rows.tolist()]

    def close(self, wait=True):
        """Forgets the actions not sent yet; the rows in flight end with the
        pool when the driver closes the environment."""
        del wait
        self._rows, self._actions = [], []
