"""SlotStepper: ExternalEnv slots stepped as rows with no worker threads.

The rows of a batch of ExternalEnv slots (`env_constructor(slots_per_env=K)`)
are stepped by their env thread's rows loop (the driver's rows_loop.py) as
an `alf_async.roles.RowStepper` (start / send / recv / close / join). A
slot's step does no work of its own: it hands the policy's action to the
client waiting in get_action and then waits for that client's next call.
The driver's row workers would give each slot a worker thread that waits
in that step, i.e. two more thread hand-offs per action (benchmarks/serving.py
measures what they cost per get_action). Instead the env thread
steps the slots in two halves itself (EpisodeTable's polled slots): `send`
answers the client at once, `recv` waits on the table for whichever slots'
clients have called since.

Threads: every method is called by the owning env thread only; `recv`
blocks at most `timeout` seconds (in the EpisodeTable's condition, which
clients' calls and stop() notify); nothing else blocks.
"""

from alf_async.environments.capabilities import RowFailed, row_action
from alf_async.roles import RowStepper


class SlotStepper(RowStepper):
    """A RowStepper over ExternalEnv slots, with no threads."""

    def __init__(self, table, slots, on_step):
        """
        Args:
            table: the slots' EpisodeTable.
            slots: the unbatched slots (external_slots.SlotEnv), one per row.
            on_step: callable(row, time_step, applied), called in `recv`
                for each row whose next step came (`applied`: the slot's
                (logged action or None, trainable) after a step, None after
                the first reset), as `OffersRowStepper.row_stepper` says.
        """
        self._table = table
        self._slots = list(slots)
        self._row = {id(slot): row for row, slot in enumerate(self._slots)}
        self._on_step = on_step
        self._pending = []    # slots waiting for their next step
        self._started = [False] * len(self._slots)

    def start(self):
        """Resets every slot: each reports once its first episode comes."""
        for slot in self._slots:
            self._table.slot_begin(slot)
        self._pending = list(self._slots)

    def send(self, rows, actions):
        """Answers each row's client of `rows` with its action (`actions`
        batched over `rows`); their next steps come from a later `recv`."""
        for j, row in enumerate(rows):
            slot = self._slots[row]
            self._table.slot_act(slot, row_action(actions, j))
            self._pending.append(slot)

    def recv(self, timeout):
        """Waits up to `timeout` seconds for one of the rows sent for (or
        reset) to have its next step; returns every such row.

        Returns:
            A list of (row, None or RowFailed), possibly empty (timed out).
        """
        if not self._pending:
            return []
        came = self._table.slot_poll(self._pending, timeout)
        if not came:
            return []
        results = []
        done = set()
        for slot, outcome in came:
            row = self._row[id(slot)]
            done.add(id(slot))
            if isinstance(outcome, BaseException):
                results.append((row, RowFailed(outcome)))
                continue
            self._on_step(row, outcome, slot.applied if self._started[row] else None)
            self._started[row] = True
            results.append((row, None))
        self._pending = [s for s in self._pending if id(s) not in done]
        return results

    def close(self, wait=True):
        """Nothing to stop: the slots are closed by the driver's stop."""
        del wait
        self._pending = []
