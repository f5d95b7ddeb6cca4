"""alf_async: an asynchronous off-policy training driver for TF2 and tf-agents.

The top-level names are imported lazily so that ``import alf_async.environments``
(for example inside a SubprocessEnv child) does not pay for the driver.
"""

__all__ = ["AsyncOffPolicyDriver", "DriverStoppedError"]


def __getattr__(name):
    if name in __all__:
        from alf_async import driver
        return getattr(driver, name)
    raise AttributeError(f"module 'alf_async' has no attribute {name!r}")
