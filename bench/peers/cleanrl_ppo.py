"""Single-process baseline: cleanrl-style JAX PPO on CartPole-v1, time to a target return.

What it is: the PPO a user would write on one machine instead of running srl_jax,
kept short and tuned as cleanrl tunes it (`ppo.py` / `ppo_envpool_jax_scan.py`):
a gymnasium `SyncVectorEnv` of `--num-envs` 4 CartPoles stepped in this process,
`--num-steps` 128 steps per rollout (512 frames per update), GAE (gamma 0.99,
lambda 0.95), advantages normalised per minibatch, clipped surrogate (0.2) and
clipped value loss, ent_coef 0.01, vf_coef 0.5, Adam (eps 1e-5) at lr 2.5e-4
annealed linearly to 0 over `--total-frames`, gradients clipped to global norm
0.5, 4 epochs x 4 minibatches. Actor and critic are separate tanh 64x64 MLPs
with cleanrl's orthogonal init (hidden std sqrt(2), policy head 0.01, value
head 1.0, zero biases). Done = terminated or truncated, no bootstrapping on
truncation (as cleanrl). The envs autoreset in `SAME_STEP` mode, so every step's
reward and done belong to a real transition; episode returns are summed here.

4 envs is cleanrl's own CartPole default. 8 envs x 128 steps runs about 1.4x
more frames/s here (~20k against ~14k on the 2-core machine) but halves the
updates per frame: with seeds 1-5 it needed 260-430k frames to a row of 475
and with seeds 1 and 5 did not get there within the 500k frames (the lr
anneals to 0 by then), while 4 envs got there with each of seeds 1-7, at
110-240k frames, about 24 s from start on an idle machine. `--num-envs 8`
runs the other setting.

The action sampling is one jitted call per vector step (only the actions leave
the device). The log-probabilities and values of the rollout are recomputed
inside the update from the stored observations with the same (unchanged)
parameters, which gives the same numbers as storing them while acting but
saves two device-to-host copies per step. The update (values, GAE, then
epochs x minibatches as one `jax.lax.scan`) is a single jitted function.

Why it exists: the distributed system must beat one process on the same cores.
This script gives the figures to beat: time to the target return from start,
frames at that point, steady frames/s and start-up time.

Output: one JSON line per `--report-interval` (1 s) on stdout,
`{"wall", "time", "env_frames", "episode_return_mean", "episodes",
"episode_return_mean_last20", "episode_return_mean_last100"}`, where
`time` counts from the top of this file (before the heavy imports),
`episode_return_mean` is the mean return of the episodes that finished since
the previous row (absent when none did), and `episode_return_mean_last<N>` the
mean of the last N episodes (all while fewer have finished; absent before the
first), as srl_jax's metrics rows carry them. It stops when that per-row mean
reaches `--target-return` (the rule of srl_jax's `stop.target_return`), or at
`--seconds` or `--total-frames` (both checked after each update, so a run can
pass them by one rollout and update), and prints a last line
`{"done": "target"|"seconds"|"frames", ...}`; it exits 0 in all three cases.

    .venv/bin/python -m bench.peers.cleanrl_ppo                # seed 1, stop at 475
    .venv/bin/python -m bench.peers.cleanrl_ppo --seed 2 --num-envs 8
    .venv/bin/python -m bench.peers.cleanrl_ppo --target-return none --seconds 30   # steady fps
"""

from __future__ import annotations

import time

START = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from collections import deque  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from typing import Any  # noqa: E402

import flax.linen as nn  # noqa: E402
import gymnasium as gym  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from srl_jax.dataflow.metrics_table import RETURN_WINDOWS, recent_return_means  # noqa: E402

Params = Any


class MLP(nn.Module):
    """tanh 64x64 MLP with cleanrl's orthogonal init and a linear head of `out` units."""

    out: int
    head_std: float

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        hidden = nn.initializers.orthogonal(np.sqrt(2))
        zeros = nn.initializers.zeros
        x = nn.tanh(nn.Dense(64, kernel_init=hidden, bias_init=zeros)(x))
        x = nn.tanh(nn.Dense(64, kernel_init=hidden, bias_init=zeros)(x))
        return nn.Dense(self.out, kernel_init=nn.initializers.orthogonal(self.head_std),
                        bias_init=zeros)(x)


def target_value(text: str) -> float | None:
    """`--target-return` parser: a number, or `none` / a negative number to disable."""
    if text.strip().lower() in ("none", "null", "off"):
        return None
    value = float(text)
    return None if value < 0 else value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line; defaults are cleanrl's CartPole PPO settings."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--env-id", default="CartPole-v1")
    p.add_argument("--num-envs", type=int, default=4)
    p.add_argument("--num-steps", type=int, default=128, help="steps per env per rollout")
    p.add_argument("--target-return", type=target_value, default=475.0,
                   help="stop when a row's episode_return_mean reaches it; none to disable")
    p.add_argument("--seconds", type=float, default=300.0, help="wall-time limit from start")
    p.add_argument("--total-frames", type=int, default=500_000,
                   help="frame limit; also the horizon of the lr annealing")
    p.add_argument("--report-interval", type=float, default=1.0, help="seconds between rows")
    p.add_argument("--learning-rate", type=float, default=2.5e-4)
    p.add_argument("--no-anneal-lr", dest="anneal_lr", action="store_false")
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--gae-lambda", type=float, default=0.95)
    p.add_argument("--num-minibatches", type=int, default=4)
    p.add_argument("--update-epochs", type=int, default=4)
    p.add_argument("--clip-coef", type=float, default=0.2)
    p.add_argument("--no-clip-vloss", dest="clip_vloss", action="store_false")
    p.add_argument("--ent-coef", type=float, default=0.01)
    p.add_argument("--vf-coef", type=float, default=0.5)
    p.add_argument("--max-grad-norm", type=float, default=0.5)
    return p.parse_args(argv)


def make_agent(args: argparse.Namespace, obs_dim: int, n_actions: int, key: jax.Array
               ) -> tuple[Params, optax.GradientTransformation, Callable, Callable]:
    """Initial params, the optimiser, the jitted `act` and the jitted `update`."""
    actor, critic = MLP(n_actions, 0.01), MLP(1, 1.0)

    @jax.jit  # one compiled init: op-by-op orthogonal init costs seconds of start-up
    def init(key: jax.Array) -> Params:
        k_actor, k_critic = jax.random.split(key)
        dummy = jnp.zeros((1, obs_dim), jnp.float32)
        return {"actor": actor.init(k_actor, dummy), "critic": critic.init(k_critic, dummy)}

    params = init(key)

    batch = args.num_envs * args.num_steps
    minibatch = batch // args.num_minibatches
    num_updates = max(1, args.total_frames // batch)
    lr: float | optax.Schedule = args.learning_rate
    if args.anneal_lr:  # cleanrl: lr * (1 - (update - 1) / num_updates), stepped per update
        steps_per_update = args.update_epochs * args.num_minibatches
        lr = lambda count: args.learning_rate * (  # noqa: E731
            1.0 - (count // steps_per_update) / num_updates)
    tx = optax.chain(optax.clip_by_global_norm(args.max_grad_norm),
                     optax.adam(learning_rate=lr, eps=1e-5))

    @jax.jit
    def act(actor_params: Params, obs: jax.Array, key: jax.Array
            ) -> tuple[jax.Array, jax.Array]:
        key, sub = jax.random.split(key)
        logits = actor.apply(actor_params, obs)
        return jax.random.categorical(sub, logits), key

    def evaluate(params: Params, obs: jax.Array, actions: jax.Array
                 ) -> tuple[jax.Array, jax.Array, jax.Array]:
        logits = jax.nn.log_softmax(actor.apply(params["actor"], obs))
        logprob = jnp.take_along_axis(logits, actions[..., None], axis=-1)[..., 0]
        entropy = -jnp.sum(jnp.exp(logits) * logits, axis=-1)
        value = critic.apply(params["critic"], obs)[..., 0]
        return logprob, entropy, value

    def loss_fn(params: Params, mb: dict[str, jax.Array]) -> jax.Array:
        logprob, entropy, value = evaluate(params, mb["obs"], mb["actions"])
        ratio = jnp.exp(logprob - mb["logprobs"])
        adv = mb["advantages"]
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        pg_loss = jnp.maximum(-adv * ratio,
                              -adv * jnp.clip(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                              ).mean()
        if args.clip_vloss:
            clipped = mb["values"] + jnp.clip(value - mb["values"], -args.clip_coef,
                                              args.clip_coef)
            v_loss = 0.5 * jnp.maximum((value - mb["returns"]) ** 2,
                                       (clipped - mb["returns"]) ** 2).mean()
        else:
            v_loss = 0.5 * ((value - mb["returns"]) ** 2).mean()
        return pg_loss - args.ent_coef * entropy.mean() + args.vf_coef * v_loss

    @jax.jit
    def update(params: Params, opt_state: optax.OptState, obs: jax.Array, actions: jax.Array,
               rewards: jax.Array, dones: jax.Array, next_obs: jax.Array, key: jax.Array
               ) -> tuple[Params, optax.OptState, jax.Array]:
        # obs [T, N, D], actions/rewards/dones [T, N]; dones[t]: step t ended an episode
        # (its next obs is already the reset obs), next_obs [N, D] follows the last step.
        logprobs, _, values = evaluate(params, obs, actions)
        next_value = critic.apply(params["critic"], next_obs)[..., 0]

        def gae_step(carry: tuple[jax.Array, jax.Array], x: tuple[jax.Array, ...]
                     ) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
            gae, next_v = carry
            reward, done, value = x
            nonterminal = 1.0 - done
            delta = reward + args.gamma * next_v * nonterminal - value
            gae = delta + args.gamma * args.gae_lambda * nonterminal * gae
            return (gae, value), gae

        _, advantages = jax.lax.scan(gae_step, (jnp.zeros_like(next_value), next_value),
                                     (rewards, dones, values), reverse=True)
        data = {"obs": obs, "actions": actions, "logprobs": logprobs, "values": values,
                "advantages": advantages, "returns": advantages + values}
        data = jax.tree.map(lambda x: x.reshape((batch, *x.shape[2:])), data)

        def epoch(carry: tuple, key: jax.Array) -> tuple[tuple, None]:
            perm = jax.random.permutation(key, batch)
            shuffled = jax.tree.map(
                lambda x: x[perm].reshape((args.num_minibatches, minibatch, *x.shape[1:])),
                data)

            def minibatch_step(carry: tuple, mb: dict[str, jax.Array]) -> tuple[tuple, None]:
                params, opt_state = carry
                grads = jax.grad(loss_fn)(params, mb)
                updates, opt_state = tx.update(grads, opt_state, params)
                return (optax.apply_updates(params, updates), opt_state), None

            return jax.lax.scan(minibatch_step, carry, shuffled)[0], None

        key, sub = jax.random.split(key)
        (params, opt_state), _ = jax.lax.scan(
            epoch, (params, opt_state), jax.random.split(sub, args.update_epochs))
        return params, opt_state, key

    return params, tx, act, update


def emit(row: dict[str, Any]) -> None:
    print(json.dumps(row), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make(args.env_id) for _ in range(args.num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    n_actions = int(envs.single_action_space.n)

    key = jax.random.PRNGKey(args.seed)
    key, agent_key, act_key = jax.random.split(key, 3)
    params, tx, act, update = make_agent(args, obs_dim, n_actions, agent_key)
    opt_state = tx.init(params)

    T, N = args.num_steps, args.num_envs
    obs_buf = np.zeros((T, N, obs_dim), np.float32)
    act_buf = np.zeros((T, N), np.int32)
    rew_buf = np.zeros((T, N), np.float32)
    done_buf = np.zeros((T, N), np.float32)

    next_obs, _ = envs.reset(seed=args.seed)
    ep_return = np.zeros(N, np.float64)
    finished: list[float] = []  # returns of episodes finished since the last row
    recent: deque[float] = deque(maxlen=max(RETURN_WINDOWS))  # the last episodes' returns
    frames = 0
    last_row = time.time()
    done_reason = None
    while done_reason is None:
        for t in range(T):
            obs_buf[t] = next_obs
            action, act_key = act(params["actor"], next_obs, act_key)
            action = np.asarray(action)
            next_obs, reward, terminated, truncated, _ = envs.step(action)
            done = np.logical_or(terminated, truncated)
            act_buf[t], rew_buf[t], done_buf[t] = action, reward, done
            ep_return += reward
            if done.any():
                finished.extend(ep_return[done].tolist())
                ep_return[done] = 0.0
        frames += T * N
        params, opt_state, key = update(params, opt_state, obs_buf, act_buf, rew_buf,
                                        done_buf, next_obs, key)
        # XLA:CPU may alias the numpy buffers instead of copying them: wait for the update
        # before the next rollout overwrites them (the next `act` would wait for it anyway).
        jax.block_until_ready(params)

        now = time.time()
        if frames >= args.total_frames:
            done_reason = "frames"
        elif now - START >= args.seconds:
            done_reason = "seconds"
        if now - last_row >= args.report_interval or done_reason is not None:
            row: dict[str, Any] = {"wall": now, "time": now - START, "env_frames": frames}
            if finished:
                row["episode_return_mean"] = float(np.mean(finished))
                if args.target_return is not None and \
                        row["episode_return_mean"] >= args.target_return:
                    done_reason = "target"
            row["episodes"] = len(finished)
            recent.extend(finished)
            row.update(recent_return_means(list(recent)))
            emit(row)
            finished.clear()
            last_row = now
    envs.close()
    now = time.time()
    emit({"done": done_reason, "wall": now, "time": now - START, "env_frames": frames})
    return 0


if __name__ == "__main__":
    sys.exit(main())
