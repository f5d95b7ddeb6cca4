"""alf_async: an asynchronous off-policy training driver for TF2 and tf-agents.

The top-level names are imported lazily so that ``import alf_async.environments``
(for example inside a SubprocessEnv child) does not pay for the driver.
"""

from alf_async import quiet
from alf_async._lazy import lazy_exports

# A process started by a quiet one (SubprocessEnv's fork server and children)
# is quiet too; see alf_async.quiet.
quiet.apply_inherited()

_EXPORTS = {
    "AsyncOffPolicyDriver": "driver.async_driver",
    "DriverStoppedError": "driver.async_driver",
    "Learner": "learning.learner",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
