"""Single-process baseline: PureJaxRL-style PPO on MinAtar Breakout, training as one jitted program.

What it is: the PPO a JAX user would write on one machine instead of running srl_jax
(`minatar_breakout_ppo`), in the style of PureJaxRL (luchris429/purejaxrl, `ppo.py` with
the MinAtar settings of its `examples/brax_minatar.ipynb`): the env is stepped inside the
jitted program (64 gymnax envs, vmapped, with gymnax's auto-reset), and the whole of
training (rollout of 128 steps, GAE, 4 epochs x 8 minibatches, for every update until
the end) is one `jax.jit` call: a `jax.lax.while_loop` over the updates, as PureJaxRL's
`jax.lax.scan` over them. PureJaxRL's MinAtar hyperparameters: lr 5e-3 annealed linearly
to 0 over `--total-frames` (PureJaxRL's 1e7), Adam eps 1e-5, gradients clipped to global
norm 0.5, gamma 0.99, lambda 0.95, clip 0.2 (surrogate and value), ent_coef 0.01,
vf_coef 0.5, advantages normalised per minibatch; separate actor and critic relu 64x64
MLPs on the flattened 10x10x4 observation with orthogonal init (hidden sqrt 2, policy
head 0.01, value head 1.0). Done (termination or gymnax's 1000-step limit) cuts the
bootstrap, as PureJaxRL.

The env: gymnax 0.0.9's `Breakout-MinAtar` (the version jaxmarl 0.2.0 resolves to under
jax 0.12; gymnax 1.0 needs jax < 0.12), a JAX re-implementation of the `minatar`
package's Breakout, which srl_jax steps. Its dynamics are a line-by-line port (ball,
paddle, bricks, respawn of the bricks; Breakout has no difficulty ramp in either), with
the minimal action set (no-op, left, right) and the same 4 channels. Two differences:
gymnax has no sticky actions, where `minatar.Environment` repeats the previous action
with probability 0.1 by default; and gymnax ends an episode after 1000 steps, minatar
never. PureJaxRL's curve and srl_jax's `minatar_breakout_ppo` (its minatar family with
sticky_action_prob 0 and a 1000-step limit) are on the first, so the default here is
no sticky actions; `--sticky-action-prob 0.1` adds minatar's (the last action carries
across episodes, as there). One difference to srl_jax remains: a cut at 1000 steps is a
done here (PureJaxRL does not bootstrap it).

Why it exists: the distributed system must beat one process on the same cores, and
PureJaxRL's fully jitted loop is the fastest single-process PPO there is for an env
written in JAX. The figures: return against env steps and wall time.

Output: one JSON line per `--report-interval` (1 s; written at the end of the update
past it, from an `io_callback` inside the jitted loop) on stdout, `{"wall", "time",
"env_frames", "updates", "episode_return_mean", "episodes",
"episode_return_mean_last20", "episode_return_mean_last100"}`, as
`bench.peers.cleanrl_ppo` writes them (`time` from the top of this file, so it counts
imports and compilation; `episode_return_mean` over the episodes finished since the
previous row, absent when none did). It stops at `--total-frames` or `--stop-frames`
(rounded down to whole updates), at `--seconds`, or when a row's `episode_return_mean` reaches
`--target-return` (all checked after each update) and prints a last line `{"done":
"frames"|"seconds"|"target", ...}`; it exits 0 in all three cases.

    .venv/bin/python -m bench.peers.purejaxrl_ppo --total-frames 2000000 --seed 1
    .venv/bin/python -m bench.peers.purejaxrl_ppo --sticky-action-prob 0.1   # minatar's
"""

from __future__ import annotations

import time

START = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402
from collections import deque  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from typing import Any  # noqa: E402

import flax.linen as nn  # noqa: E402
import gymnax  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import struct  # noqa: E402
from flax.training.train_state import TrainState  # noqa: E402
from gymnax.wrappers.purerl import (  # noqa: E402
    FlattenObservationWrapper,
    GymnaxWrapper,
    LogWrapper,
)
from jax.experimental import io_callback  # noqa: E402

from bench.peers.cleanrl_ppo import target_value  # noqa: E402
from srl_jax.dataflow.metrics_table import RETURN_WINDOWS, recent_return_means  # noqa: E402

Params = Any
warnings.filterwarnings("ignore", "scatter inputs have incompatible types", FutureWarning)
"""gymnax 0.0.9's MinAtar writes its int and float observation values into a bool array."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line; defaults are PureJaxRL's MinAtar PPO settings."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--env-id", default="Breakout-MinAtar", help="a gymnax env id")
    p.add_argument("--sticky-action-prob", type=float, default=0.0,
                   help="0: gymnax's env as PureJaxRL steps it; minatar's default is 0.1")
    add_ppo_arguments(p, seconds=900.0, target="episode_return_mean", num_envs=64,
                      learning_rate=5e-3, minibatches=8, ent_coef=0.01, max_grad_norm=0.5)
    return p.parse_args(argv)


def add_ppo_arguments(p: argparse.ArgumentParser, *, seconds: float, target: str,
                      num_envs: int, learning_rate: float, minibatches: int,
                      ent_coef: float, max_grad_norm: float) -> None:
    """The options both single-process PPO baselines take, with each one's defaults."""
    p.add_argument("--total-frames", type=int, default=10_000_000,
                   help="env steps; also the horizon of the lr annealing")
    p.add_argument("--stop-frames", type=int, default=None,
                   help="stop after this many env steps instead, the lr still annealed "
                        "over --total-frames (a run read part way, as a published curve)")
    p.add_argument("--seconds", type=float, default=seconds, help="wall-time limit from start")
    p.add_argument("--target-return", type=target_value, default=None,
                   help=f"stop when a row's {target} reaches it (default none)")
    p.add_argument("--report-interval", type=float, default=1.0, help="seconds between rows")
    p.add_argument("--num-envs", type=int, default=num_envs)
    p.add_argument("--num-steps", type=int, default=128, help="steps per env per rollout")
    p.add_argument("--learning-rate", type=float, default=learning_rate)
    p.add_argument("--no-anneal-lr", dest="anneal_lr", action="store_false")
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--gae-lambda", type=float, default=0.95)
    p.add_argument("--update-epochs", type=int, default=4)
    p.add_argument("--num-minibatches", type=int, default=minibatches)
    p.add_argument("--clip-coef", type=float, default=0.2)
    p.add_argument("--ent-coef", type=float, default=ent_coef)
    p.add_argument("--vf-coef", type=float, default=0.5)
    p.add_argument("--max-grad-norm", type=float, default=max_grad_norm)


class Progress:
    """The rows of a run and when it stops, fed once per update by an `io_callback` from
    inside the jitted loop with the episodes that finished during the update's rollout."""

    def __init__(self, frames_per_update: int, total_frames: int, seconds: float,
                 report_interval: float, target: float | None, keys: Sequence[str]) -> None:
        self.frames_per_update, self.total_frames = frames_per_update, total_frames
        self.seconds, self.report_interval, self.target = seconds, report_interval, target
        self.keys = keys
        """Row keys of the per-episode figures, the first the one the target is on."""
        self.finished: dict[str, list[float]] = {k: [] for k in keys}
        self.recent: dict[str, deque[float]] = {k: deque(maxlen=max(RETURN_WINDOWS))
                                                for k in keys}
        self.frames, self.updates, self.last_row = 0, 0, time.time()
        self.done: str | None = None

    def __call__(self, ended: np.ndarray, figures: dict[str, np.ndarray]) -> np.bool_:
        """`ended` [T, N]: the steps that ended an episode; `figures`: each key's value per
        step (the episode's figure where it ended). Returns whether to stop."""
        ended = np.asarray(ended, bool)
        for key in self.keys:
            self.finished[key].extend(np.asarray(figures[key])[ended].tolist())
        self.updates += 1
        self.frames += self.frames_per_update
        now = time.time()
        if self.frames >= self.total_frames:
            self.done = "frames"
        elif now - START >= self.seconds:
            self.done = "seconds"
        if now - self.last_row >= self.report_interval or self.done is not None:
            self.row(now)
        return np.bool_(self.done is not None)

    def row(self, now: float) -> None:
        row: dict[str, Any] = {"wall": now, "time": now - START, "env_frames": self.frames,
                               "updates": self.updates}
        first = self.finished[self.keys[0]]
        for key in self.keys:
            if self.finished[key]:
                row[key] = float(np.mean(self.finished[key]))
        row["episodes"] = len(first)
        for key in self.keys:
            self.recent[key].extend(self.finished[key])
            row.update(recent_return_means(list(self.recent[key]), key=key))
            self.finished[key].clear()
        if self.target is not None and row.get(self.keys[0], -np.inf) >= self.target:
            self.done = "target"
        emit(row)
        self.last_row = now

    def finish(self) -> None:
        now = time.time()
        emit({"done": self.done, "wall": now, "time": now - START, "env_frames": self.frames})


def emit(row: dict[str, Any]) -> None:
    print(json.dumps(row), flush=True)


def report(progress: Progress, ended: jax.Array, figures: dict[str, jax.Array]) -> jax.Array:
    """Hand one update's finished episodes to `progress` from inside the jitted loop; the
    answer (stop or not) is the loop's condition."""
    return io_callback(progress, jax.ShapeDtypeStruct((), jnp.bool_), ended, figures,
                       ordered=True)


def linear_schedule(args: argparse.Namespace, num_updates: int) -> float | optax.Schedule:
    """PureJaxRL's lr: annealed linearly to 0 over the updates, stepped once per update."""
    if not args.anneal_lr:
        return args.learning_rate
    steps_per_update = args.num_minibatches * args.update_epochs
    return lambda count: args.learning_rate * (1.0 - (count // steps_per_update) / num_updates)


def gae(rewards: jax.Array, dones: jax.Array, values: jax.Array, last_value: jax.Array,
        gamma: float, lam: float) -> tuple[jax.Array, jax.Array]:
    """Advantages and value targets over a [T, ...] rollout; dones[t]: step t ended its
    episode, so nothing after it is bootstrapped into it."""

    def step(carry: tuple[jax.Array, jax.Array], x: tuple[jax.Array, ...]
             ) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
        advantage, next_value = carry
        reward, done, value = x
        delta = reward + gamma * next_value * (1 - done) - value
        advantage = delta + gamma * lam * (1 - done) * advantage
        return (advantage, value), advantage

    _, advantages = jax.lax.scan(step, (jnp.zeros_like(last_value), last_value),
                                 (rewards, dones, values), reverse=True, unroll=16)
    return advantages, advantages + values


def policy_loss(logprob: jax.Array, old_logprob: jax.Array, advantages: jax.Array,
                clip: float) -> jax.Array:
    """The clipped surrogate, advantages normalised over the minibatch."""
    ratio = jnp.exp(logprob - old_logprob)
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    return -jnp.minimum(ratio * advantages,
                        jnp.clip(ratio, 1.0 - clip, 1.0 + clip) * advantages).mean()


def value_loss(value: jax.Array, old_value: jax.Array, targets: jax.Array,
               clip: float) -> jax.Array:
    """The clipped value loss (PureJaxRL's and JaxMARL's)."""
    clipped = old_value + jnp.clip(value - old_value, -clip, clip)
    return 0.5 * jnp.maximum((value - targets) ** 2, (clipped - targets) ** 2).mean()


def log_probs(logits: jax.Array, actions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Log-probability of `actions` and the entropy of the categorical over `logits`."""
    logp = jax.nn.log_softmax(logits)
    chosen = jnp.take_along_axis(logp, actions[..., None], axis=-1)[..., 0]
    return chosen, -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def ppo_epochs(state: Any, data: Any, key: jax.Array, minibatch_step: Callable[[Any, Any], Any],
               epochs: int, minibatches: int) -> Any:
    """`epochs` passes over `data` (a pytree of [B, ...] arrays), each shuffled and cut into
    `minibatches`, `minibatch_step(state, minibatch) -> state` on each, as one scan."""
    size = jax.tree.leaves(data)[0].shape[0]

    def epoch(state: Any, key: jax.Array) -> tuple[Any, None]:
        perm = jax.random.permutation(key, size)
        shuffled = jax.tree.map(
            lambda x: jnp.take(x, perm, axis=0).reshape((minibatches, -1, *x.shape[1:])), data)
        return jax.lax.scan(lambda s, mb: (minibatch_step(s, mb), None), state, shuffled)[0], None

    return jax.lax.scan(epoch, state, jax.random.split(key, epochs))[0]


@struct.dataclass
class StickyState:
    env_state: Any
    last_action: jax.Array


class StickyActions(GymnaxWrapper):
    """minatar's sticky actions: with probability `prob` the env repeats the last action
    it took (`minatar.Environment.act`), kept across episodes as there."""

    def __init__(self, env: Any, prob: float) -> None:
        super().__init__(env)
        self.prob = prob

    def reset(self, key: jax.Array, params: Any = None) -> tuple[jax.Array, StickyState]:
        obs, state = self._env.reset(key, params)
        return obs, StickyState(state, jnp.int32(0))

    def step(self, key: jax.Array, state: StickyState, action: jax.Array, params: Any = None
             ) -> tuple[jax.Array, StickyState, jax.Array, jax.Array, dict]:
        key, sub = jax.random.split(key)
        action = jnp.where(jax.random.uniform(sub) < self.prob, state.last_action,
                           action).astype(jnp.int32)
        obs, env_state, reward, done, info = self._env.step(key, state.env_state, action,
                                                            params)
        return obs, StickyState(env_state, action), reward, done, info


class ActorCritic(nn.Module):
    """PureJaxRL's actor-critic: separate relu 64x64 towers, orthogonal init."""

    n_actions: int

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        def tower(out: int, head_std: float) -> jax.Array:
            h = x
            for _ in range(2):
                h = nn.relu(nn.Dense(64, kernel_init=nn.initializers.orthogonal(np.sqrt(2)),
                                     bias_init=nn.initializers.zeros)(h))
            return nn.Dense(out, kernel_init=nn.initializers.orthogonal(head_std),
                            bias_init=nn.initializers.zeros)(h)

        return tower(self.n_actions, 0.01), tower(1, 1.0)[..., 0]


def make_train(args: argparse.Namespace, progress: Progress) -> Callable[[jax.Array], Any]:
    """PureJaxRL's `make_train`: the whole of training as one function of the seed's key."""
    env, env_params = gymnax.make(args.env_id)
    if args.sticky_action_prob > 0:
        env = StickyActions(env, args.sticky_action_prob)
    env = LogWrapper(FlattenObservationWrapper(env))
    network = ActorCritic(env.action_space(env_params).n)
    num_updates = args.total_frames // (args.num_envs * args.num_steps)
    tx = optax.chain(optax.clip_by_global_norm(args.max_grad_norm),
                     optax.adam(linear_schedule(args, num_updates), eps=1e-5))

    def loss_fn(params: Params, mb: dict[str, jax.Array]) -> jax.Array:
        logits, value = network.apply(params, mb["obs"])
        logprob, entropy = log_probs(logits, mb["action"])
        return (policy_loss(logprob, mb["log_prob"], mb["advantages"], args.clip_coef)
                + args.vf_coef * value_loss(value, mb["value"], mb["targets"], args.clip_coef)
                - args.ent_coef * entropy.mean())

    def minibatch_step(state: TrainState, mb: dict[str, jax.Array]) -> TrainState:
        return state.apply_gradients(grads=jax.grad(loss_fn)(state.params, mb))

    def train(key: jax.Array) -> Any:
        key, init_key, reset_key = jax.random.split(key, 3)
        params = network.init(init_key, jnp.zeros(env.observation_space(env_params).shape))
        state = TrainState.create(apply_fn=network.apply, params=params, tx=tx)
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(
            jax.random.split(reset_key, args.num_envs), env_params)

        def env_step(runner: tuple, _: None) -> tuple[tuple, dict[str, jax.Array]]:
            state, env_state, obs, key = runner
            key, act_key, step_key = jax.random.split(key, 3)
            logits, value = network.apply(state.params, obs)
            action = jax.random.categorical(act_key, logits)
            obs_next, env_state, reward, done, info = jax.vmap(
                env.step, in_axes=(0, 0, 0, None))(
                jax.random.split(step_key, args.num_envs), env_state, action, env_params)
            step = {"obs": obs, "action": action, "value": value, "reward": reward,
                    "done": done.astype(jnp.float32),
                    "log_prob": log_probs(logits, action)[0],
                    "ended": info["returned_episode"],
                    "return": info["returned_episode_returns"]}
            return (state, env_state, obs_next, key), step

        def update(carry: tuple) -> tuple:
            runner, _ = carry
            runner, traj = jax.lax.scan(env_step, runner, None, args.num_steps)
            state, env_state, obs, key = runner
            advantages, targets = gae(traj["reward"], traj["done"], traj["value"],
                                      network.apply(state.params, obs)[1],
                                      args.gamma, args.gae_lambda)
            data = {k: traj[k] for k in ("obs", "action", "value", "log_prob")}
            data = jax.tree.map(lambda x: x.reshape((-1, *x.shape[2:])),
                                {**data, "advantages": advantages, "targets": targets})
            key, epoch_key = jax.random.split(key)
            state = ppo_epochs(state, data, epoch_key, minibatch_step, args.update_epochs,
                               args.num_minibatches)
            stop = report(progress, traj["ended"], {"episode_return_mean": traj["return"]})
            return (state, env_state, obs, key), stop

        runner = (state, env_state, obs, key)
        return jax.lax.while_loop(lambda carry: ~carry[1], update, (runner, jnp.bool_(False)))

    return train


def run(args: argparse.Namespace, keys: Sequence[str],
        make_train: Callable[[argparse.Namespace, Progress], Callable[[jax.Array], Any]]
        ) -> int:
    """Train once, the rows (on `keys`, the target on the first) from inside the loop."""
    frames_per_update = args.num_envs * args.num_steps
    stop = min(args.total_frames, args.stop_frames or args.total_frames)
    total = stop // frames_per_update * frames_per_update
    if total == 0:
        raise SystemExit(f"--total-frames and --stop-frames must be at least one update "
                         f"({frames_per_update})")
    progress = Progress(frames_per_update, total, args.seconds, args.report_interval,
                        args.target_return, keys)
    jax.block_until_ready(jax.jit(make_train(args, progress))(jax.random.PRNGKey(args.seed)))
    progress.finish()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run(parse_args(argv), ("episode_return_mean",), make_train)


if __name__ == "__main__":
    sys.exit(main())
