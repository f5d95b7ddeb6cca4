"""The collection, not_paying, layout_auto, host_kinds and reliability tables
read their figures from the results files as the benchmarks wrote them.

Each table is rendered by `python benchmarks/render_results.py --show NAME`
(the scripts are not imported by tests), from the committed files or from a
copy of them with one file missing or with trial outputs written in
tests/stress/chaos.py's and benchmarks/soak.py's print format. The figures
asserted are the files' own: the scripts' printed ratios and medians.
"""

import functools
import os
import re
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results")

pytestmark = pytest.mark.timeout(60)

CHAOS = """\
# command: python benchmarks/chaos.py --chaos_kills 100 --chaos_interval 2.0 --checkpoint_kills 20
# date: 2026-12-07
# host: AMD EPYC | AMD EPYC (AVX-512), oneDNN on, calibration 0.074 s / 0.067 s
# host_record: {"cpu": "AMD EPYC", "cores": 2, "cpu_flags": ["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16"], "tensorflow": "2.15.1", "env": {}, "kernels": {"cpu_kind": "avx512_bf16", "emulated_kind": null, "host_kind": "avx512_bf16", "onednn": true, "choice": "auto", "variables": {}, "auto_torso_dtype": "bfloat16"}, "python_loop_secs": 0.074, "numpy_matmul_secs": 0.067}
SubprocessEnv(env_index=5, ...): the environment process died; restarting it (restart 17)

Crashing simulators: 100 kill -9 of SubprocessEnv children (~2 s apart) during a DQN training run on 2 x 2 CountingEnvs
  per env (kills, restarts, truncations): {0: (21, 21, 21), 1: (23, 23, 23), 2: (27, 27, 27), 3: (29, 29, 29)}
  env steps checked 225504 in 7047 learner batches, 7047 train steps (final loss 0.0328)
  steps lost or repeated: 0; envs with kills != restarts != truncations: []; children seen 104, left 0; stop() 0.04 s; 204 s; error None

Checkpoints: 20 kill -9 of alf-async-train (smoke.gin, checkpoint every 10 train steps) at random moments, each resumed
  resumes 20 (fresh starts 1), resumed at global steps [0, 10, 30]
  kills that left a save's temporary files behind (killed mid-save): 1
  final run: exit 0; problems 0; 388 s

0 failures
"""

SOAK = """\
# command: python benchmarks/soak.py --minutes 30 --sample_secs 60
# date: 2026-12-07
# host: AMD EPYC | AMD EPYC (AVX-512), oneDNN on, calibration 0.074 s / 0.067 s
# host_record: {"cpu": "AMD EPYC", "cores": 2, "cpu_flags": ["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16"], "tensorflow": "2.15.1", "env": {}, "kernels": {"cpu_kind": "avx512_bf16", "emulated_kind": null, "host_kind": "avx512_bf16", "onednn": true, "choice": "auto", "variables": {}, "auto_torso_dtype": "bfloat16"}, "python_loop_secs": 0.074, "numpy_matmul_secs": 0.067}
  sample 1 at 0 s: RSS 533 MB, threads 15, fds 34, children 10, env steps 768

Soak: 30 min of DQN CartPole on 8 SubprocessEnvs (2 env threads x 4 children), sampled every 60 s

| t (s) | trainer RSS MB | threads | open fds | child procs | children PSS MB | env steps | steps/s |
|---:|---:|---:|---:|---:|---:|---:|---:|
| 0 | 533 | 15 | 34 | 10 | 310 | 768 |  |
| 60 | 542 | 15 | 34 | 10 | 312 | 45056 | 738 |
| 1800 | 548 | 15 | 34 | 10 | 313 | 1310720 | 727 |

The HTTP-fed learner beside it: a PolicyServerEnv with 4 slots, 4 client threads playing CartPole-v0 in another process

| t (s) | server RSS MB | threads | open fds | env steps | train steps | client RSS MB | episodes | client errors | mean return (last 100) |
|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|
| 0 | 521 | 18 | 12 | 3000 | 100 | 64 | 475 |  |  |
| 60 | 521 | 18 | 12 | 9000 | 400 | 64 | 563 | 0 | 131.5 |
| 1800 | 524 | 18 | 12 | 300000 | 17000 | 64 | 6120 | 0 | 198.0 |

exit code 0; processes left 0
growth flags: none
"""


@functools.lru_cache(maxsize=None)
def _show(name, results_dir=RESULTS):
    """(exit status, output) of rendering block `name` from `results_dir`."""
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", "render_results.py"), "--show", name,
         "--results_dir", results_dir], capture_output=True, text=True, timeout=50)
    return proc.returncode, proc.stdout + proc.stderr


def _row(name, start, results_dir=RESULTS, file=""):
    """The rendered row of table `name` whose `what` cell begins with `start`
    (and whose files include `file`)."""
    status, out = _show(name, results_dir)
    assert status == 0, out
    rows = [line for line in out.splitlines()
            if re.match(rf"\| \d+ \| {re.escape(start)}", line) and f"results/{file}" in line]
    assert len(rows) == 1, out
    return rows[0]


def _copy(tmp_path, leave_out=(), write=None):
    target = tmp_path / "results"
    shutil.copytree(RESULTS, target, ignore=shutil.ignore_patterns(*leave_out))
    for name, text in (write or {}).items():
        (target / name).write_text(text)
    return str(target)


def test_rows_one_by_one_give_the_range_over_every_row_of_driver_cost():
    row = _row("not_paying", "The driver's own CPU per env step where rows are stepped one by one")
    assert ("| 4.5-17.8x lockstep's; worker threads 211.0-398.4 us, EnvPool's asynchronous pool "
            "82.5-328.0 us | lockstep: 26.7 us, 18.4 us |") in row
    batched = _row("not_paying", "The driver's own CPU per env step where rows step together:")
    assert ("| the graph loop 17.7 us (1.02x); EnvPool lockstep pools 13.4 us (0.69x) | "
            "lockstep: 17.3 us; 19.4 us |") in batched
    pool = _row("not_paying", "16 Breakout games in EnvPool's asynchronous pool")
    assert ("| 0.82-0.97x lockstep (best: 1x16 acting itself, 1,533 steps/s) | tf-agents' "
            "lockstep driver over the same pool: 1,582 steps/s |") in pool


def test_collection_rows_read_the_scripts_console_tables_and_json():
    atari = _row("collection", "16 in-process Breakout games")
    assert ("| 1,412 steps/s, 1.52x (with an actor thread 1.46x); the games alone, no TF: "
            "1,415 steps/s | `DynamicStepDriver`: 933 steps/s |") in atari
    pools = _row("collection", "16 Breakout games in EnvPool pools")
    assert "| 1,971 steps/s, 1.15x (1 x 16: 1.02x) |" in pools
    cartpoles = _row("collection", "64 cheap in-process CartPoles")
    assert ("| 73,525 steps/s, 1.09x; with an actor thread 0.91x; through tf-agents' "
            "`suite_gym` stack, 2 x 32: 1.01x | `DynamicStepDriver`: 65,129 steps/s |") in cartpoles
    lognormal = _row("collection", "Environments that wait briefly")
    assert ("| 1x48: 8,943 steps/s, 1.61x; 1x48 acting itself 1.59x; 2x24 1.42x; 53% of the no-TF "
            "ceiling |") in lognormal
    pong = _row("collection", "PPO Pong-v5 while training",
                file="step_breakdown_ppo_pong_paced.json")
    assert ("| 975 env steps/s, 1.06x (pairs 0.99x, 1.06x, 1.06x), at 1.03x its CPU per env "
            "step, on 1.81 cores | tf-agents' synchronous loop: 919 env steps/s, 1.66 cores |"
            ) in pong


def test_layout_auto_rows_give_choice_best_head_to_head_and_noise_floor():
    atari = _row("layout_auto", "`Layout.choice = 'auto'` on 16 in-process Breakout",
                 file="layout_choice_acting_blocking_atari_envpool.txt")
    assert ("| 4x4, 1 actor queue (cap 4), in process: 0.898 of the table's best, 0.878 head to "
            "head; 13.7 s measuring (2 candidates) | the best of the table: 2x8, 1 actor queue "
            "(cap 2), in process; the table's noise floor 0.771 |") in atari
    # One round: no noise floor to give.
    cartpoles = _row("layout_auto", "`Layout.choice = 'auto'` on 64 in-process CartPoles")
    assert "| the best of the table: 1x64, no actor queue, in process |" in cartpoles


def test_host_kinds_rows_take_medians_of_the_rounds():
    pong = _row("host_kinds", "PPO Pong-v5 (`ppo_pong.gin`) on the AVX2 kind")
    assert ("| learner 3.85 ms of CPU an env step (1.56x less); the whole run 339 env steps/s "
            "(1.31x; rounds 1.25x, 1.40x, 1.31x) | TensorFlow's default: learner 5.99 ms; 260 "
            "env steps/s |") in pong
    floor = _row("host_kinds", "The learner of `ppo_pong.gin` and `impala_pong.gin`")
    assert "| PPO 1.10x on AVX-512, 1.17x on AVX2; IMPALA 1.06x on AVX-512, 1.05x on AVX2 |" in floor


def test_reliability_rows_read_the_trials_faults_and_links(tmp_path):
    results = _copy(tmp_path, write={"chaos.txt": CHAOS, "soak.txt": SOAK})
    kills = _row("reliability", "A DQN training run on `SubprocessEnv` children", results)
    assert ("| 100 kills; 0 env steps lost or repeated of 225,504 checked in 7,047 learner "
            "batches; envs whose kills, restarts and truncations differ: []; 0 of 104 children "
            "left; `stop()` 0.04 s |") in kills
    resumes = _row("reliability", "The training CLI `kill -9`ed", results)
    assert ("| 20 of 20 resumed (fresh starts 1, killed mid-save 1); problems 0; the final run: "
            "exit 0 |") in resumes
    soak = _row("reliability", "A 30-minute DQN training run on 8", results)
    assert ("| trainer RSS 542 -> 548 MB, threads 15 -> 15, fds 34 -> 34, child processes 10 -> "
            "10 (from the first sample after warm-up to the last, 1,310,720 env steps); policy "
            "server RSS 521 -> 524 MB, threads 18 -> 18, 6,120 client episodes, 0 client "
            "errors; exit code 0, 0 processes left; growth flags: none |") in soak
    kill = _row("reliability", "The learner of `dqn_cartpole_distributed.gin` and 2 collectors on "
                "hosts of their own, each through a relay: the learner SIGKILLed", results)
    assert ("24,240 items audited, 0 spliced, 6,960 steps in 4 gaps (one per row, written after "
            "the last checkpoint)") in kill
    link = _row("reliability", "The learner of `dqn_cartpole_distributed.gin` and 2 collectors "
                "(16 rows, 8-step unrolls), each on a host of its own behind a relay adding 20 ms "
                "each way (the shipped", results)
    assert "| 0.80x loopback's train steps/s (per round 0.78x, 0.80x, 0.80x) |" in link


def test_a_missing_results_file_is_named(tmp_path):
    results = _copy(tmp_path, leave_out=["latency_bound_32_processes.txt"])
    status, out = _show("collection", results)
    assert status == 1
    assert "results file missing: latency_bound_32_processes.txt" in out
