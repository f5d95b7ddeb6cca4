"""After/before ratios of one benchmark run on two checkouts, read from a
results file that holds both sides' JSON records.

A code change that must not cost speed (a reshaping, say) is measured by
running the same benchmark scripts from two git worktrees, alternately on
one host, each writing its `--json`; the records are gathered into one
file under `runs`, keyed `<group>/<script>_<before|after>_<n>`, and this
prints, per row of each script, the median of every round of a side over
its runs and the ratio after/before (rate > 1 and cpu_us < 1: faster).

    python benchmarks/ab_ratios.py benchmarks/results/reshape_before_after.json
"""

import argparse
import json
import re
import statistics


def _sides(runs, group, script):
    """{'before': [record, ...], 'after': [...]} of one script in one group."""
    found = {"before": [], "after": []}
    for key in sorted(runs):
        match = re.fullmatch(rf"{group}/{script}_(before|after)_\d+", key)
        if match:
            found[match.group(1)].append(runs[key])
    return found


def table_ratios(records_by_side, keys=("rate", "cpu_us", "cs")):
    """[(path, row, {key: (before, after)})] of driver_cost / throughput
    records (their `table` of rows with `rounds`); a table without paths
    (throughput's) has path ''."""
    first = records_by_side["before"][0]["table"]
    nested = all(isinstance(v, dict) and "rounds" not in v for v in first.values())
    rows = [(p, r) for p, t in first.items() for r in t] if nested else [("", r) for r in first]
    out = []
    for path, row in rows:
        def med(side, key):
            return statistics.median(
                rnd[key] for rec in records_by_side[side]
                for rnd in (rec["table"][path][row] if nested else rec["table"][row])["rounds"])
        out.append((path, row, {k: (med("before", k), med("after", k)) for k in keys}))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    args = parser.parse_args(argv)
    with open(args.results) as f:
        data = json.load(f)
    runs = data["runs"]
    groups = sorted({key.split("/")[0] for key in runs})
    host = next(iter(runs.values()))
    host = host[0]["host"] if isinstance(host, list) else host["host"]
    print(f"{data.get('what', '')}\nhost: {host['cpu']}, {host['cores']} cores, kind "
          f"{host['kernels']['host_kind']}, calibration {host.get('python_loop_secs')} s / "
          f"{host.get('numpy_matmul_secs')} s")
    for group in groups:
        for script in ("driver_cost", "throughput"):
            sides = _sides(runs, group, script)
            if not sides["before"] or not sides["after"]:
                continue
            args_ = sides["before"][0].get("args", {})
            print(f"\n[{group}] {script}.py {args_}: {len(sides['before'])} runs before, "
                  f"{len(sides['after'])} after; medians of every round, after/before")
            print(f"{'path':17s}{'row':50s}{'rate':>8s}{'cpu_us':>8s}{'cs':>8s}")
            for path, row, vals in table_ratios(sides):
                print(f"{path:17s}{row[:50]:50s}" + "".join(
                    f"{vals[k][1] / vals[k][0]:8.2f}" for k in ("rate", "cpu_us", "cs")))
        sides = _sides(runs, group, "step_breakdown")
        if sides["before"] and sides["after"]:
            print(f"\n[{group}] step_breakdown.py ({sides['before'][0][0]['gin_file']}, "
                  f"side alf_async): per run")
            for side in ("before", "after"):
                for rec in sides[side]:
                    r = rec[0]
                    print(f"  {side:7s} env steps/s {r['env_steps_per_sec']:8.1f}  CPU ms/step "
                          f"{r['whole_ms']:.3f}  context switches/step "
                          f"{r['context_switches_per_step']:.2f}  cores {r['cores']:.2f}")
            for key in ("env_steps_per_sec", "whole_ms", "context_switches_per_step"):
                b = statistics.median(rec[0][key] for rec in sides["before"])
                a = statistics.median(rec[0][key] for rec in sides["after"])
                print(f"  {key}: after/before {a / b:.2f}")


if __name__ == "__main__":
    main()
