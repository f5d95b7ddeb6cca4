"""Serving under abuse at full counts, with its figures: hypothesis-fuzzed
bad requests beside good clients, and clients that vanish mid-episode.

    python benchmarks/serving_abuse.py [--abuse_bad_requests 10000] [--abuse_vanishing 100]

The trials assert, so they are tests: tests/stress/serving_abuse.py (CI
runs them reduced, `pytest -m stress`). This entry runs that script with the
same arguments, as a process of its own (nothing here imports the tests).
"""

import os
import sys

STRESS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests",
                      "stress")

if __name__ == "__main__":
    script = os.path.join(STRESS, "serving_abuse.py")
    os.execv(sys.executable, [sys.executable, script] + sys.argv[1:])
