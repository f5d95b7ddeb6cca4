"""The reliability trials at full counts, with their figures: driver
lifecycles and faults, kill -9 of simulators and of the training CLI,
serving under abuse.

    python benchmarks/reliability.py [--lifecycles 200] [--faults 100] [--seed 0]
        [--chaos_kills 100] [--checkpoint_kills 20] [--abuse_bad_requests 10000] ...

The trials assert, so they are tests: tests/stress/ (CI runs them reduced,
`pytest -m stress`). This entry runs tests/stress/reliability.py with the
same arguments, as a process of its own (nothing here imports the tests).
"""

import os
import sys

STRESS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests",
                      "stress")

if __name__ == "__main__":
    script = os.path.join(STRESS, "reliability.py")
    os.execv(sys.executable, [sys.executable, script] + sys.argv[1:])
