"""Reliability trials, as tests: driver lifecycles and faults
(driver_trials.py), kill -9 of simulators and of the training CLI
(chaos.py), serving under abuse (serving_abuse.py). The test_*.py modules
run them in reduced counts (marker `stress`; ALF_ASYNC_STRESS_SCALE
multiplies the counts); the trial modules, run as scripts (reliability.py:
all of them), run full counts and print the figures.
"""
