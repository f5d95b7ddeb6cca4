"""Row steppers (`alf_async.roles.RowStepper`): what steps the rows of a
batch one by one, whichever are ready first, for their env thread (the
driver's rows_loop.py), with no Python thread per row. One per kind of
environment that offers its own (`capabilities.RowStepping`,
`capabilities.OffersRowStepper`):

- `envpool_rows`: `EnvPoolRows`, an EnvPool pool in its asynchronous mode.
- `subprocess_rows`: `SubprocessRows`, the rows of a batch of SubprocessEnvs.
- `slot_stepper`: `SlotStepper`, the rows of a batch of ExternalEnv slots.
"""
