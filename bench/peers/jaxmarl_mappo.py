"""Single-process baseline: JaxMARL-style MAPPO on SMAX 3m, training as one jitted program.

What it is: the MAPPO a JAX user would write on one machine instead of running srl_jax
(`smax_3m_mappo`), in the style of JaxMARL's `baselines/MAPPO/mappo_rnn_smax.py`: SMAX
(`HeuristicEnemySMAX` through `jaxmarl.make`, JaxMARL 0.2.0, with the baseline's env
kwargs: enemies' actions seen, walls kill, the heuristic enemy attacks the closest)
stepped inside the jitted program, 128 envs vmapped, and the whole of training
(rollouts of 128 steps, GAE on the global done, 4 epochs x 4 minibatches, every update
to the end) one `jax.jit` call, a `jax.lax.while_loop` over the updates. A centralised
critic on the world state (the env's `world_state` with the agent's one-hot id
appended, JaxMARL's `SMAXWorldStateWrapper` with OBS_WITH_AGENT_ID), one actor shared
by the agents on their own observations, unavailable actions masked out of the logits
(logits - 1e10). JaxMARL's SMAX MAPPO hyperparameters (`mappo_homogenous_rnn_smax.yaml`):
lr 2e-3 annealed linearly to 0 over `--total-frames` (its 1e7), actor and critic each
with its own Adam (eps 1e-5) and gradients clipped to global norm 0.25, gamma 0.99,
lambda 0.95, clip 0.2 (surrogate and value, unscaled), ent_coef 0.0, vf_coef 0.5,
advantages normalised per minibatch, relu, layers of 128, orthogonal init.

One change, to keep it short: the networks are MLPs, the baseline's GRU replaced by a
dense layer of the same width (Dense 128, relu, Dense 128, relu, Dense 128, relu,
head), so minibatches shuffle single steps rather than whole agent sequences. SMAX
observations carry every visible unit's health, position and last action, which is
the state an MLP needs on 3m; the recurrent baseline is the one JaxMARL's report
publishes.

Env steps: an env step is one joint step of the 3 allies (JaxMARL's `env_step` counts
NUM_ENVS x NUM_STEPS per update); agent steps are 3 times that.

Why it exists: the distributed system must beat one process on the same cores, and
JaxMARL's fully jitted loop is how that env is trained on one machine. The figures:
win rate and return against env steps and wall time.

Output: as `bench.peers.purejaxrl_ppo` (a JSON row per `--report-interval`, a last
`{"done": ...}` line), the rows `{"wall", "time", "env_frames", "updates", "win_rate",
"episode_return_mean", "episodes", "win_rate_last20", "win_rate_last100",
"episode_return_mean_last20", "episode_return_mean_last100"}`: `win_rate` the fraction
of the episodes finished since the previous row that the allies won (SMAXLogWrapper's
`returned_won_episode`), `episode_return_mean` their mean return (one agent's; the
agents share SMAX's team reward). `--target-return` is on `win_rate`.

    .venv/bin/python -m bench.peers.jaxmarl_mappo --total-frames 2000000 --seed 1
"""

from __future__ import annotations

import time

START = time.time()

import argparse  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from typing import Any  # noqa: E402

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jaxmarl  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax.training.train_state import TrainState  # noqa: E402
from jaxmarl.environments.smax import map_name_to_scenario  # noqa: E402
from jaxmarl.wrappers.baselines import SMAXLogWrapper  # noqa: E402

from bench.peers.purejaxrl_ppo import (  # noqa: E402
    Progress,
    add_ppo_arguments,
    gae,
    linear_schedule,
    log_probs,
    policy_loss,
    ppo_epochs,
    report,
    run,
    value_loss,
)

Params = Any
ENV_KWARGS = {"see_enemy_actions": True, "walls_cause_death": True, "attack_mode": "closest"}
"""JaxMARL's MAPPO SMAX config's env kwargs."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line; defaults are JaxMARL's SMAX MAPPO settings."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--map", default="3m", help="an SMAX scenario (3m, 2s3z, ...)")
    add_ppo_arguments(p, seconds=1200.0, target="win_rate", num_envs=128,
                      learning_rate=2e-3, minibatches=4, ent_coef=0.0, max_grad_norm=0.25)
    p.add_argument("--hidden", type=int, default=128)
    return p.parse_args(argv)


class Tower(nn.Module):
    """JaxMARL's actor / critic with its GRU as a dense layer: Dense, relu, Dense, relu,
    Dense (orthogonal 2), relu, head."""

    out: int
    head_std: float
    hidden: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        zeros = nn.initializers.zeros
        for scale in (np.sqrt(2), np.sqrt(2), 2.0):
            x = nn.relu(nn.Dense(self.hidden, kernel_init=nn.initializers.orthogonal(scale),
                                 bias_init=zeros)(x))
        return nn.Dense(self.out, kernel_init=nn.initializers.orthogonal(self.head_std),
                        bias_init=zeros)(x)


def masked_logits(logits: jax.Array, avail: jax.Array) -> jax.Array:
    return logits - (1.0 - avail) * 1e10


def make_train(args: argparse.Namespace, progress: Progress) -> Callable[[jax.Array], Any]:
    """JaxMARL's `make_train` with MLPs: the whole of training as one function of a key."""
    env = SMAXLogWrapper(jaxmarl.make("HeuristicEnemySMAX",
                                      scenario=map_name_to_scenario(args.map), **ENV_KWARGS))
    agents, n_agents = env.agents, env.num_agents
    n_actions = env.action_space(agents[0]).n
    actors = n_agents * args.num_envs
    actor, critic = Tower(n_actions, 0.01, args.hidden), Tower(1, 1.0, args.hidden)
    num_updates = args.total_frames // (args.num_envs * args.num_steps)

    def optimiser() -> optax.GradientTransformation:
        return optax.chain(optax.clip_by_global_norm(args.max_grad_norm),
                           optax.adam(linear_schedule(args, num_updates), eps=1e-5))

    def batchify(x: dict[str, jax.Array]) -> jax.Array:
        """{agent: [N, ...]} -> [A * N, ...], agent-major as JaxMARL's."""
        return jnp.stack([x[a] for a in agents]).reshape((actors, -1))

    def world_state(obs: dict[str, jax.Array]) -> jax.Array:
        """[A * N, state + A]: the env's world state with each agent's one-hot id."""
        ws = jnp.broadcast_to(obs["world_state"][None], (n_agents, *obs["world_state"].shape))
        ids = jnp.broadcast_to(jnp.eye(n_agents)[:, None], (n_agents, args.num_envs, n_agents))
        return jnp.concatenate([ws, ids], axis=-1).reshape((actors, -1))

    def actor_loss(params: Params, mb: dict[str, jax.Array]) -> jax.Array:
        logits = masked_logits(actor.apply(params, mb["obs"]), mb["avail"])
        logprob, entropy = log_probs(logits, mb["action"])
        return (policy_loss(logprob, mb["log_prob"], mb["advantages"], args.clip_coef)
                - args.ent_coef * entropy.mean())

    def critic_loss(params: Params, mb: dict[str, jax.Array]) -> jax.Array:
        value = critic.apply(params, mb["world_state"])[..., 0]
        return args.vf_coef * value_loss(value, mb["value"], mb["targets"], args.clip_coef)

    def minibatch_step(states: tuple[TrainState, TrainState], mb: dict[str, jax.Array]
                       ) -> tuple[TrainState, TrainState]:
        actor_state, critic_state = states
        return (actor_state.apply_gradients(grads=jax.grad(actor_loss)(actor_state.params, mb)),
                critic_state.apply_gradients(
                    grads=jax.grad(critic_loss)(critic_state.params, mb)))

    def train(key: jax.Array) -> Any:
        key, actor_key, critic_key, reset_key = jax.random.split(key, 4)
        obs_dim = env.observation_space(agents[0]).shape[0]
        states = tuple(
            TrainState.create(apply_fn=net.apply, params=net.init(k, jnp.zeros((1, dim))),
                              tx=optimiser())
            for net, k, dim in ((actor, actor_key, obs_dim),
                                (critic, critic_key, env.state_size + n_agents)))
        obs, env_state = jax.vmap(env.reset)(jax.random.split(reset_key, args.num_envs))

        def env_step(runner: tuple, _: None) -> tuple[tuple, dict[str, jax.Array]]:
            states, env_state, obs, key = runner
            key, act_key, step_key = jax.random.split(key, 3)
            avail = batchify(jax.vmap(env.get_avail_actions)(env_state.env_state))
            obs_batch, ws = batchify(obs), world_state(obs)
            logits = masked_logits(actor.apply(states[0].params, obs_batch), avail)
            action = jax.random.categorical(act_key, logits)
            value = critic.apply(states[1].params, ws)[..., 0]
            env_act = dict(zip(agents, action.reshape((n_agents, args.num_envs)), strict=True))
            obs_next, env_state, reward, done, info = jax.vmap(env.step)(
                jax.random.split(step_key, args.num_envs), env_state, env_act)
            step = {"obs": obs_batch, "world_state": ws, "avail": avail, "action": action,
                    "value": value, "log_prob": log_probs(logits, action)[0],
                    "reward": batchify(reward)[:, 0],
                    "done": jnp.tile(done["__all__"], n_agents).astype(jnp.float32),
                    "ended": info["returned_episode"][:, 0],
                    "return": info["returned_episode_returns"][:, 0],
                    "won": info["returned_won_episode"][:, 0]}
            return (states, env_state, obs_next, key), step

        def update(carry: tuple) -> tuple:
            runner, _ = carry
            runner, traj = jax.lax.scan(env_step, runner, None, args.num_steps)
            states, env_state, obs, key = runner
            last_value = critic.apply(states[1].params, world_state(obs))[..., 0]
            advantages, targets = gae(traj["reward"], traj["done"], traj["value"], last_value,
                                      args.gamma, args.gae_lambda)
            data = {k: traj[k] for k in ("obs", "world_state", "avail", "action", "value",
                                         "log_prob")}
            data = jax.tree.map(lambda x: x.reshape((-1, *x.shape[2:])),
                                {**data, "advantages": advantages, "targets": targets})
            key, epoch_key = jax.random.split(key)
            states = ppo_epochs(states, data, epoch_key, minibatch_step, args.update_epochs,
                                args.num_minibatches)
            stop = report(progress, traj["ended"], {"win_rate": traj["won"],
                                                    "episode_return_mean": traj["return"]})
            return (states, env_state, obs, key), stop

        runner = (states, env_state, obs, key)
        return jax.lax.while_loop(lambda carry: ~carry[1], update, (runner, jnp.bool_(False)))

    return train


def main(argv: Sequence[str] | None = None) -> int:
    return run(parse_args(argv), ("win_rate", "episode_return_mean"), make_train)


if __name__ == "__main__":
    sys.exit(main())
