"""The results tables of the choices alf_async makes for the user, read from
benchmarks/results/: `Layout.choice = 'auto'` against the best of every
candidate layout (layout_choice.py's output), and the kernels per host kind
with where a Pong env step's CPU goes (kernel_choice.py, learner_ops.py and
step_breakdown.py JSON). tables_collection.py registers them.

A table whose file is missing raises FileNotFoundError naming it.
"""

import re
import statistics

from result_rows import Row, count, load_json, meta_of, ratio, read_text


def _row(results_dir, key, what, ours, theirs, files):
    return Row(key=key, what=what, ours=ours, theirs=theirs, files=tuple(files),
               **meta_of(files, results_dir))


def _ms(value):
    return f"{value:.2f} ms"


# ------------------------------------------------------------------ layout auto

WORKLOADS = {
    "cartpole64": "64 in-process CartPoles (child processes among the candidates)",
    "blocking32": "32 CartPoles whose steps sleep exp(10 ms)",
    "lognormal48": "48 CartPoles whose steps sleep lognormal(1 ms)",
    "atari16": "16 in-process Breakout games, the Nature-CNN policy (child processes among "
               "the candidates)",
    "envpool16": "a 16-game EnvPool Breakout pool (receive sizes among the candidates)",
    "mixed16": "16 environments no test has seen, each step computing or waiting at random",
}
# (file, workload, key): every workload of every layout_choice.py output kept.
LAYOUT_RUNS = (
    ("layout_choice_cartpole64_acting.txt", "cartpole64", "layout_auto.cartpole64"),
    ("layout_choice_acting_blocking_atari_envpool.txt", "blocking32", "layout_auto.blocking32"),
    ("layout_choice_acting_blocking_atari_envpool.txt", "atari16", "layout_auto.atari16"),
    ("layout_choice_atari16_acting.txt", "atari16", "layout_auto.atari16_again"),
    ("layout_choice_acting_blocking_atari_envpool.txt", "envpool16", "layout_auto.envpool16"),
    ("layout_choice_lognormal48_mixed16.txt", "lognormal48", "layout_auto.lognormal48"),
    ("layout_choice_lognormal48_mixed16.txt", "mixed16", "layout_auto.mixed16"),
)


def layout_choice(name, workload, results_dir):
    """One workload's summary in a layout_choice.py output: chosen, best,
    measured (candidates measured by choose_layout), secs, table_ratio,
    head_to_head, noise_floor (None when one round)."""
    text = read_text(name, results_dir)
    w = re.escape(workload)
    chose = re.search(rf"^{w}: chose (.+) \((\d+) measured in ([\d.]+) s\); best (.+); "
                      rf"chosen / best = ([\d.]+)$", text, re.M)
    head = re.search(rf"^{w}: head to head, chosen / best = ([\d.]+)$", text, re.M)
    if chose is None or head is None:
        raise ValueError(f"{name}: no summary of workload {workload}")
    floor = re.search(rf"^{w}: noise floor: .* median ([\d.]+),", text, re.M)
    return dict(chosen=chose.group(1), measured=int(chose.group(2)),
                secs=float(chose.group(3)), best=chose.group(4),
                table_ratio=float(chose.group(5)), head_to_head=float(head.group(1)),
                noise_floor=float(floor.group(1)) if floor else None)


def layout_auto(results_dir):
    """`Layout.choice = 'auto'` against the best of every candidate, per workload."""
    rows = []
    for name, workload, key in LAYOUT_RUNS:
        c = layout_choice(name, workload, results_dir)
        floor = ("" if c["noise_floor"] is None
                 else f"; the table's noise floor {c['noise_floor']:.3f}")
        rows.append(_row(
            results_dir, key,
            f"`Layout.choice = 'auto'` on {WORKLOADS[workload]}: the layout it picks against "
            f"the best of a table of every candidate measured in the same run, then head to "
            f"head",
            f"{c['chosen']}: {c['table_ratio']:.3f} of the table's best, {c['head_to_head']:.3f} "
            f"head to head; {c['secs']:.1f} s measuring ({c['measured']} candidates)",
            f"the best of the table: {c['best']}{floor}", [name]))
    return rows


# ------------------------------------------------------------------ host kinds


def kernel_choice_medians(name, results_dir):
    """{gin file name: {field: (oneDNN off median, on median)}} of a
    kernel_choice.py JSON, over its rounds (as its report prints them)."""
    out = {}
    for gin_file, by_setting in load_json(name, results_dir)["results"].items():
        fields = [f for f, v in by_setting["0"][0].items() if isinstance(v, float)]
        out[gin_file.rsplit("/", 1)[-1]] = {
            f: tuple(statistics.median(r[f] for r in by_setting[s]) for s in ("0", "1"))
            for f in fields}
    return out


def kernel_choice_rounds(name, results_dir, field):
    """{gin file name: [oneDNN on / off of `field` per round]} of a kernel_choice.py JSON."""
    return {gin_file.rsplit("/", 1)[-1]: [on[field] / off[field] for off, on in
                                          zip(by_setting["0"], by_setting["1"])]
            for gin_file, by_setting in load_json(name, results_dir)["results"].items()}


def _kernel_choice_pong(results_dir):
    parts = kernel_choice_medians("kernel_choice_avx2.json", results_dir)["ppo_pong.gin"]
    whole = kernel_choice_medians("kernel_choice_avx2_ppo_pong_whole.json",
                                  results_dir)["ppo_pong.gin"]
    (learner_off, learner_on), (off, on) = parts["learner"], whole["env_steps_per_sec"]
    rounds = kernel_choice_rounds("kernel_choice_avx2_ppo_pong_whole.json", results_dir,
                                  "env_steps_per_sec")["ppo_pong.gin"]
    return _row(
        results_dir, "host_kinds.kernel_choice_ppo_pong",
        "PPO Pong-v5 (`ppo_pong.gin`) on the AVX2 kind (emulated): oneDNN on, as alf_async's "
        "kernel choice sets it, against TensorFlow's default there (oneDNN off), alternating "
        "rounds",
        f"learner {_ms(learner_on)} of CPU an env step ({ratio(learner_off / learner_on)} less); "
        f"the whole run {count(on)} env steps/s ({ratio(on / off)}; rounds "
        f"{', '.join(ratio(r) for r in rounds)})",
        f"TensorFlow's default: learner {_ms(learner_off)}; {count(off)} env steps/s",
        ["kernel_choice_avx2.json", "kernel_choice_avx2_ppo_pong_whole.json"])


def _kernel_choice_workloads(results_dir):
    medians = kernel_choice_medians("kernel_choice_avx2.json", results_dir)
    return _row(
        results_dir, "host_kinds.kernel_choice_workloads",
        "The learner's CPU per step on the AVX2 kind (emulated), per shipped gin file: "
        "TensorFlow's default (oneDNN off) over oneDNN on, above 1 where oneDNN is faster",
        "; ".join(f"`{gin}` {ratio(m['learner'][0] / m['learner'][1])}"
                  for gin, m in medians.items()),
        "", ["kernel_choice_avx2.json"])


def _learner_floor(results_dir):
    records = load_json("learner_ops_host_kinds.json", results_dir)
    kinds = (("avx512", "AVX-512"), ("avx2", "AVX2"))
    agents = (("ppo_pong", "PPO"), ("impala_pong", "IMPALA"))
    return _row(
        results_dir, "host_kinds.learner_floor",
        "The learner of `ppo_pong.gin` and `impala_pong.gin` against its floor (its bare "
        "networks' forward, backward and optimizer step, same kernels, same process), on the "
        "AVX-512 kind and the AVX2 kind (emulated)",
        "; ".join(f"{label} " + ", ".join(
            f"{ratio(records[f'{a}_{k}']['cpu_ms'] / records[f'{a}_{k}']['floor_ms'])} on {kl}"
            for k, kl in kinds) for a, label in agents),
        "", ["learner_ops_host_kinds.json"])


STEP_PARTS = ("env stepping", "actor inference", "learner", "driver (the rest)")


def _step_breakdown(results_dir, key, name, kind):
    ours, theirs = load_json(name, results_dir)
    floors = lambda r: sum(r["floors"]["ms"].values())
    parts = lambda r: ", ".join(f"{part} {r['alone_ms'][part]:.2f}" for part in STEP_PARTS)
    learner = ours["alone_ms"]["learner"] / ours["floors"]["ms"]["learner"]
    return _row(
        results_dir, key,
        f"Where an env step's CPU goes: `ppo_pong.gin` with its earlier layout (two env "
        f"threads of 4, an actor thread) on {kind}: the whole run against the sum of its "
        f"parts' floors, each part timed alone (ms), the learner against its floor",
        f"{_ms(ours['whole_ms'])} an env step, {ratio(ours['whole_ms'] / floors(ours))} the "
        f"floors ({parts(ours)}); learner {ratio(learner)} its floor; "
        f"{count(ours['env_steps_per_sec'])} env steps/s on {ours['cores']:.2f} cores",
        f"tf-agents' synchronous loop: {_ms(theirs['whole_ms'])} ({parts(theirs)}); "
        f"{count(theirs['env_steps_per_sec'])} env steps/s on {theirs['cores']:.2f} cores",
        [name])


def host_kinds(results_dir):
    """The kernels chosen per host kind, and where a Pong env step's CPU goes."""
    return [
        _kernel_choice_pong(results_dir),
        _kernel_choice_workloads(results_dir),
        _learner_floor(results_dir),
        _step_breakdown(results_dir, "host_kinds.step_breakdown_avx512",
                        "step_breakdown_ppo_pong_avx512.json", "the AVX-512 kind"),
        _step_breakdown(results_dir, "host_kinds.step_breakdown_avx2",
                        "step_breakdown_ppo_pong_avx2.json",
                        "the AVX2 kind (emulated, oneDNN on)"),
        _step_breakdown(results_dir, "host_kinds.step_breakdown_bf16",
                        "step_breakdown_ppo_pong_epyc.json",
                        "the AVX-512 BF16 kind (bfloat16 torsos)"),
    ]
