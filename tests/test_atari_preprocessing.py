"""Both Pong layers against the reference preprocessing, on one scripted game.

The reference is OpenAI baselines' Atari wrappers as the published PPO and
A2C curves use them (MaxAndSkipEnv: each action repeated 4 frames, rewards
summed, the max of the last two frames; WarpFrame: grayscale, 84x84 by
INTER_AREA; FrameStack: the last 4, the reset frame filling the stack),
written here over ale-py's raw frames (frameskip 1, no sticky actions).
Both layers are run without no-op starts, so one scripted action sequence
plays the same game on all three:

- suite_atari (gymnasium's AtariPreprocessing, in process) gives the
  reference's observations pixel for pixel at every step but the game-over
  one, whose observation only a discount of 0 reads (gymnasium stops the
  action's frames before reading the screen, baselines after);
- suite_envpool (`noop_max=0` becomes EnvPool's 1) plays one no-op frame at
  the reset, then gives the reference's observations after that frame.

What neither layer copies by design (suite_atari's docstring): baselines'
FIRE at the reset (Pong serves by itself) and its clipped rewards (the
suites give the game score; the agents clip).
"""

import ale_py
import cv2
import gymnasium
import numpy as np
import pytest

from alf_async.environments import suites

pytestmark = pytest.mark.timeout(120)

SEED = 3
LAST = 2
gymnasium.register_envs(ale_py)


def raw_pong():
    """ale-py's Pong: RGB frames, one frame a step, no sticky actions."""
    return gymnasium.make("ALE/Pong-v5", frameskip=1, repeat_action_probability=0.0,
                          obs_type="rgb")


def scripted_actions(n):
    """Runs of 7 steps of each of Pong's 6 actions, in a fixed order."""
    pattern = [0, 2, 2, 3, 3, 1, 4, 5]
    return [pattern[(k // 7) % len(pattern)] for k in range(n)]


def reference_game(actions, noop_frames=0):
    """baselines' MaxAndSkip(4) + WarpFrame(84) + FrameStack(4) over ale-py's
    raw Pong frames, to the game's end.

    Returns:
        (observations [T + 1, 84, 84, 4] uint8, the reset's first; rewards
        [T] unclipped; whether the last step ended the game).
    """
    env = raw_pong()

    def gray(rgb):
        return cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)

    def warp(frame):
        return cv2.resize(frame, (84, 84), interpolation=cv2.INTER_AREA)

    rgb, _ = env.reset(seed=SEED)
    for _ in range(noop_frames):
        rgb, *_ = env.step(0)
    stack = [warp(gray(rgb))] * 4
    buffer = np.zeros((2, 210, 160), np.uint8)
    observations, rewards, done = [np.stack(stack, -1)], [], False
    for action in actions:
        total = 0.0
        for k in range(4):
            rgb, reward, terminated, truncated, _ = env.step(action)
            if k >= 2:
                buffer[k - 2] = gray(rgb)
            total += reward
            done = terminated or truncated
            if done:
                break
        stack = stack[1:] + [warp(buffer.max(axis=0))]
        observations.append(np.stack(stack, -1))
        rewards.append(total)
        if done:
            break
    env.close()
    return np.array(observations), np.array(rewards), done


def layer_game(suite, env_name, actions, steps):
    """`steps` scripted steps of one game of a suite's layer (no no-ops, no
    sticky actions): observations, rewards and step types, the reset's first."""
    tf_env = suites.load(suite, env_name, batch_size=1, seed=SEED, noop_max=0,
                         repeat_action_probability=0.0)
    env = tf_env.pyenv
    try:
        time_step = env.reset()
        observations, rewards, step_types = [time_step.observation[0]], [], [0]
        for action in actions[:steps]:
            time_step = env.step(np.array([action], np.int64))
            observations.append(time_step.observation[0])
            rewards.append(float(time_step.reward[0]))
            step_types.append(int(time_step.step_type[0]))
    finally:
        tf_env.close()
    return np.array(observations), np.array(rewards), step_types


@pytest.fixture(scope="module")
def game():
    actions = scripted_actions(1500)
    observations, rewards, done = reference_game(actions)
    assert done and rewards.sum() == -21.0 and len(rewards) > 700   # a whole lost game
    return actions, observations, rewards


def test_the_reference_grayscale_is_the_ale_s():
    # suite_atari reads ALE's own grayscale screen; baselines converts RGB with
    # cv2: the same bytes on Pong's palette.
    env = raw_pong()
    env.reset(seed=SEED)
    ale = env.unwrapped.ale
    screen = np.zeros((210, 160), np.uint8)
    for action in scripted_actions(200):
        rgb, *_ = env.step(action)
        ale.getScreenGrayscale(screen)
        np.testing.assert_array_equal(screen, cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY))
    env.close()


def test_suite_atari_is_the_reference_but_for_the_game_over_frame(game):
    actions, ref_obs, ref_rewards = game
    steps = len(ref_rewards)
    obs, rewards, step_types = layer_game("suite_atari", "ALE/Pong-v5", actions, steps)
    assert step_types.count(LAST) == 1 and step_types[-1] == LAST      # the same game's end
    np.testing.assert_array_equal(rewards, ref_rewards)
    np.testing.assert_array_equal(obs[:-1], ref_obs[:-1])
    np.testing.assert_array_equal(obs[-1][..., :3], ref_obs[-1][..., :3])   # the stack's older frames


def test_suite_envpool_is_the_reference_after_its_reset_noop_frame(game):
    pytest.importorskip("envpool")
    actions, _, _ = game
    ref_obs, ref_rewards, done = reference_game(actions, noop_frames=1)
    assert done
    steps = len(ref_rewards)
    obs, rewards, step_types = layer_game("suite_envpool", "Pong-v5", actions, steps)
    assert step_types.count(LAST) == 1 and step_types[-1] == LAST
    np.testing.assert_array_equal(rewards, ref_rewards)
    np.testing.assert_array_equal(obs[:-1], ref_obs[:-1])
