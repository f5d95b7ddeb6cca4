"""The pictures beside the learning tables: each a docs/images/ file with the
results files it is drawn from and the command that draws it
(render_results.py writes them under their pages' `pictures:NAME` markers).

Each picture list is a function `(results_dir) -> [Picture]` in `PICTURES`.
"""

import dataclasses

from result_rows import meta_of
from tables_learning import (files_matching, from_json_command, ppo_breakout_per_frame,
                             ppo_pong_per_frame)


@dataclasses.dataclass(frozen=True)
class Picture:
    """A picture of docs/images/ and the results files it is drawn from.

    Attributes:
        image: its file name in docs/images/.
        alt: what it shows, in words (no measured figures).
        files: the results files it is drawn from, relative to benchmarks/results/.
        command: the command that draws it from them.
        host: "CPU model (kind)" of the runs.
        date: YYYY-MM-DD of the latest of them.
    """
    image: str
    alt: str
    files: tuple
    command: str
    host: str
    date: str


def _picture(image, alt, files, command, results_dir):
    meta = meta_of(files, results_dir)
    return Picture(image=image, alt=alt, files=tuple(files), command=command, host=meta["host"],
                   date=meta["date"])


def _wall_clock_picture(results_dir, image, alt, task, minutes, report_minutes, pattern):
    return _picture(image, alt, files_matching(results_dir, pattern),
                    from_json_command(task, minutes, report_minutes, pattern), results_dir)


def dqn_pictures(results_dir):
    return [_wall_clock_picture(
        results_dir, "wall_clock_Breakout-v5_3seeds_30min.png",
        "DQN Breakout-v5, game score against wall-clock minutes, seeds 0-2 a side",
        "Breakout-v5", 30, "10 20 30", "wall_clock_Breakout-v5_seed?_30min.json")]


def _pong_hour_picture(results_dir):
    return _wall_clock_picture(
        results_dir, "wall_clock_Pong-v5-ppo_60min.png",
        "PPO Pong-v5, seeds 0-2 a side: game score against wall-clock minutes and against "
        "frames, beside ppo2's curve", "Pong-v5-ppo", 60, "15 30 45 60",
        "wall_clock_Pong-v5-ppo_seed?_*_60min.json")


def _breakout_hour_picture(results_dir):
    return _wall_clock_picture(
        results_dir, "wall_clock_Breakout-v5-ppo_60min.png",
        "PPO Breakout-v5, the paced layout, seeds 0-2 a side: greedy evaluations and training "
        "scores against wall-clock minutes and against frames, beside the zoo's PPO curve",
        "Breakout-v5-ppo", 60, "15 30 45 60", "wall_clock_Breakout-v5-ppo_paced_seed?_*_60min.json")


def ppo_pictures(results_dir):
    pong = ppo_pong_per_frame(results_dir)
    breakout = ppo_breakout_per_frame(results_dir)
    return [
        _pong_hour_picture(results_dir),
        _picture("per_frame_Pong-v5-ppo_1M_steps.png",
                 "PPO Pong-v5 per frame, seeds 0-2 a side: training episodes and greedy "
                 "evaluations beside ppo2's and the zoo's PPO curves",
                 pong.files, pong.command, results_dir),
        _breakout_hour_picture(results_dir),
        _picture("per_frame_Breakout-v5-ppo.png",
                 "PPO Breakout-v5 per frame, seeds 0-1 a side: training episodes and greedy "
                 "evaluations beside the zoo's PPO curve", breakout.files, breakout.command,
                 results_dir),
        _wall_clock_picture(results_dir, "wall_clock_Hopper-v5-ppo_3seeds_15min.png",
                            "PPO Hopper-v5, greedy return against wall-clock minutes, seeds 0-2 "
                            "a side", "Hopper-v5-ppo", 15, "5 10 15",
                            "wall_clock_Hopper-v5-ppo_seed?_*_15min.json")]


def impala_pictures(results_dir):
    names = ("per_frame_impala_a2c_1m_seed0_tf_agents.json",
             "per_frame_impala_sb3_a2c_seed0_tf_agents.json")
    return [
        _wall_clock_picture(results_dir, "wall_clock_Pong-v5-impala_seed0_60min.png",
                            "IMPALA Pong-v5, seed 0 a side: game score against wall-clock "
                            "minutes and against frames", "Pong-v5-impala", 60, "15 30 45 60",
                            "wall_clock_Pong-v5-impala_seed0_*_60min.json"),
        _picture("per_frame_Pong-v5-impala_3.2M_steps.png",
                 "IMPALA Pong-v5 per frame on the synchronous loop, seed 0: training episodes "
                 "beside RL Baselines3 Zoo's A2C", names,
                 "python benchmarks/per_frame.py --from_json " + " ".join(
                     f"benchmarks/results/{n}" for n in names)
                 + " --reference sb3_a2c_pong --marks 1 2 4 8 10 12", results_dir)]


def sac_pictures(results_dir):
    return [_wall_clock_picture(
        results_dir, "wall_clock_HalfCheetah-v5_2seeds_8min.png",
        "SAC HalfCheetah-v5, greedy return against wall-clock minutes, seeds 0-1 a side",
        "HalfCheetah-v5", 8, "4 8", "wall_clock_HalfCheetah-v5_seeds*_8min.json")]


def learning_pictures(results_dir):
    return [_pong_hour_picture(results_dir), _breakout_hour_picture(results_dir)]


PICTURES = {"pictures:dqn": dqn_pictures, "pictures:sac": sac_pictures,
            "pictures:ppo": ppo_pictures, "pictures:impala": impala_pictures,
            "pictures:learning": learning_pictures}
