"""The chaos trials at full counts, with their figures: SubprocessEnv
children kill -9'ed during a DQN training run, and the training CLI kill
-9'ed at random moments and resumed.

    python benchmarks/chaos.py [--chaos_kills 100] [--chaos_interval 2.0] [--checkpoint_kills 20]

The trials assert, so they are tests: tests/stress/chaos.py (CI runs them
reduced, `pytest -m stress`). This entry runs that script with the same
arguments, as a process of its own (nothing here imports the tests).
"""

import os
import sys

STRESS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests",
                      "stress")

if __name__ == "__main__":
    script = os.path.join(STRESS, "chaos.py")
    os.execv(sys.executable, [sys.executable, script] + sys.argv[1:])
