"""The JaxMARL family: 'jaxmarl:<env>' ids, multi-agent, a split stepped as one jitted call.

`jaxmarl:smax`, `jaxmarl:overcooked` and `jaxmarl:hanabi` name JaxMARL's environments;
`env.scenario` picks the SMAX map ('3m', '2s3z', ...), the Overcooked layout
('cramped_room', ...) or the Hanabi table ('2p' .. '5p'); empty: the env's default, and
`env.kwargs` go to the env's constructor. SMAX is JaxMARL's `HeuristicEnemySMAX`, as its
MAPPO and QMIX baselines play it: the allies are the agents, the enemies a built-in
heuristic.

A `JaxSplit` of `count` envs steps them as one jitted, vmapped call on the actor's CPU,
which resets an env inside the call where its episode ended, and hands back per policy
the same `StepResult`s and `RingStep` as a PettingZoo `MultiAgentSplit`
(actors/env_families/multi_agent.py says what they mean): env-major columns, agent ids,
padding for dead SMAX units (active false, zeros, every action legal), legal actions
(SMAX `get_avail_actions`, Hanabi's legal moves), a global state for a centralized
critic (SMAX's `world_state`; else every agent's observation side by side), final
observations where a time limit cut the episode, returns per agent and per team, and
SMAX's wins (`RingStep.episode_wins`).

This is the one actor module that imports JAX, lazily (`_jax`): where it is the first to
import it, the backend starts on the CPU with one thread, so that actors do not fight
over the cores.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from actors.env_families.implementation import EnvFamilyImplementation
from actors.env_families.parallel_envs import agent_policies, policy_of
from actors.env_ring import RingStep, StepResult
from srl_jax.config.schema import ConfigError, EnvConfig
from srl_jax.dataflow.env_spec import EnvSpec

INSTALL_HINT = "pip install 'srl-jax[jaxmarl]'"


@contextlib.contextmanager
def _one_core() -> Iterator[None]:
    """The process may run on one core only, for as long as the block lasts.

    XLA's CPU client sizes its thread pool by the cores the process may run on as the
    backend starts; with jax 0.12 the flags that used to limit it
    (`--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1`) no longer do (a
    jitted matmul still took two cores' time). Started within this block, JAX computes on
    one thread, and afterwards the process runs on any core again."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    if allowed:
        os.sched_setaffinity(0, {min(allowed)})
    try:
        yield
    finally:
        if allowed:
            os.sched_setaffinity(0, allowed)


def _jax() -> ModuleType:
    """JAX and JaxMARL imported. Where JAX was not imported yet, its backend starts now on
    the CPU, with one thread: an actor is one process among many on the host's cores."""
    try:
        if "jax" not in sys.modules:
            import jax

            jax.config.update("jax_platforms", "cpu")
            with _one_core():
                jax.devices()
        import jax

        streams = sys.stdout, sys.stderr
        try:  # its import prints a note, and sets sys.stdout back to the process's own
            with contextlib.redirect_stdout(io.StringIO()):
                import jaxmarl  # noqa: F401
        finally:
            sys.stdout, sys.stderr = streams
    except ModuleNotFoundError as error:
        raise ConfigError(f"'env.id': JaxMARL environments need '{error.name}', which is not "
                          f"installed: {INSTALL_HINT}") from None
    return jax


@dataclass(frozen=True)
class Game:
    """How one JaxMARL environment is made and read."""

    scenarios: Callable[[], dict[str, Any]]
    """`env.scenario` name -> what the constructor takes for it (imports JaxMARL)."""
    default: str
    make: Callable[[Any, dict[str, Any]], Any]
    """(scenario, env.kwargs) -> the env."""
    legal: Callable[[Any, Any], dict] | None = None
    """(env, state) -> each agent's legal actions; None: every action is legal."""
    world_state: bool = False
    """Its observations carry a 'world_state' (SMAX): the global state."""
    alive: Callable[[Any, Any], Any] | None = None
    """(env, state) -> whether each agent is still in play; None: all are until the end."""
    cut: Callable[[Any, Any], Any] = lambda env, state: False
    """(env, state at an episode's end) -> whether a time limit ended it (truncated)."""
    won: Callable[[Any, Any], Any] | None = None
    """(env, state at an episode's end) -> whether the agents won; None: no wins."""


def _smax_scenarios() -> dict[str, Any]:
    from jaxmarl.environments.smax import smax_env

    return dict(smax_env.MAP_NAME_TO_SCENARIO)


def _make_smax(scenario: Any, kwargs: dict[str, Any]) -> Any:
    from jaxmarl.environments.smax import HeuristicEnemySMAX

    return HeuristicEnemySMAX(scenario=scenario, **kwargs)


def _smax_ended(env: Any, state: Any) -> tuple[Any, Any]:
    """(every ally dead, every enemy dead) in a HeuristicEnemySMAX state."""
    alive = state.state.unit_alive
    return ~alive[:env.num_allies].any(), ~alive[env.num_allies:].any()


def _smax_cut(env: Any, state: Any) -> Any:
    lost, won = _smax_ended(env, state)
    return ~(lost | won)  # ended by neither side: the time limit


def _smax_won(env: Any, state: Any) -> Any:
    lost, won = _smax_ended(env, state)
    return won & ~lost  # a draw (both sides dead) is no win, as SMAX's reward counts it


def _overcooked_layouts() -> dict[str, Any]:
    from jaxmarl.environments.overcooked import overcooked_layouts

    return dict(overcooked_layouts)


def _make_overcooked(layout: Any, kwargs: dict[str, Any]) -> Any:
    import warnings

    from jaxmarl.environments.overcooked import Overcooked

    with warnings.catch_warnings():  # it recommends OvercookedV2; the report used this one
        warnings.simplefilter("ignore", DeprecationWarning)
        return Overcooked(layout=layout, **kwargs)


def _make_hanabi(players: int, kwargs: dict[str, Any]) -> Any:
    from jaxmarl.environments.hanabi import Hanabi

    return Hanabi(num_agents=players, **kwargs)


GAMES = {
    "smax": Game(_smax_scenarios, "3m", _make_smax,
                 legal=lambda env, state: env.get_avail_actions(state), world_state=True,
                 alive=lambda env, state: state.state.unit_alive[:env.num_allies],
                 cut=_smax_cut, won=_smax_won),
    # Overcooked's episodes end only at max_steps: every one is cut by the time limit.
    "overcooked": Game(_overcooked_layouts, "cramped_room", _make_overcooked,
                       cut=lambda env, state: True),
    "hanabi": Game(lambda: {f"{n}p": n for n in range(2, 6)}, "2p", _make_hanabi,
                   legal=lambda env, state: env.get_legal_moves(state)),
}
"""The JaxMARL environments this family plays, by the name after 'jaxmarl:'."""


def _game(config: EnvConfig) -> Game:
    name = config.id.partition(":")[2]
    if name not in GAMES:
        raise ConfigError(f"'env.id': '{config.id}' is no JaxMARL environment this family "
                          f"plays (ids: {', '.join('jaxmarl:' + g for g in GAMES)})")
    return GAMES[name]


def _scenario(config: EnvConfig) -> Any:
    """What `env.scenario` names for the env's constructor; ConfigError listing the known
    ones for a name it does not know."""
    game = _game(config)
    _jax()
    known = game.scenarios()
    name = config.scenario or game.default
    if name not in known:
        raise ConfigError(f"'env.scenario': '{config.id}' has no scenario '{name}' (known: "
                          f"{', '.join(known)})")
    return known[name]


def make_jax_env(config: EnvConfig) -> Any:
    """A new JaxMARL environment of `config` (its `env.scenario`, `env.kwargs`)."""
    scenario = _scenario(config)
    try:
        return _game(config).make(scenario, dict(config.kwargs))
    except TypeError as error:  # an unknown keyword
        raise ConfigError(f"'env.kwargs': cannot make '{config.id}': {error}") from None


def _obs_shape(env: Any, agent: str) -> tuple[int, ...]:
    shape = env.observation_space(agent).shape  # Hanabi's is an int
    return tuple(int(s) for s in np.atleast_1d(shape))


@dataclass(frozen=True)
class _Layout:
    """Where each policy's agents sit among the env's, and what its columns observe."""

    env: Any
    agents: list[str]
    policies: dict[str, list[int]]
    """Policy name -> the indices of its agents (in the env's order)."""
    specs: dict[str, EnvSpec]


def _layout(config: EnvConfig, global_state: bool) -> _Layout:
    env = make_jax_env(config)
    game, agents = _game(config), list(env.agents)  # HeuristicEnemySMAX's: the allies
    shape = _obs_shape(env, agents[0])
    if any(_obs_shape(env, a) != shape for a in agents):
        raise ConfigError(f"'env.id': the agents of '{config.id}' observe spaces of different "
                          "shapes, which one batch of columns cannot hold")
    from_state = game.world_state and config.global_state == "state"
    state_size = (int(env.state_size) if from_state else len(agents) * int(np.prod(shape))) \
        if global_state else 0
    policies, specs = {}, {}
    for name, members in agent_policies(config, agents).items():
        actions = {int(env.action_space(a).n) for a in members}
        if len(actions) != 1:
            raise ConfigError(f"'env.policies': the agents of policy '{name}' of '{config.id}' "
                              f"have different numbers of actions ({sorted(actions)})")
        spec = EnvSpec(shape, np.dtype(np.float32), actions.pop(), continuous=False,
                       agents=len(members), action_masked=game.legal is not None,
                       global_state_size=state_size)
        if config.agent_id and len(members) > 1:  # the ids ride after the flat view
            spec = dataclasses.replace(spec, obs_shape=(int(np.prod(shape)) + len(members),),
                                       frame_shape=shape if len(shape) != 1 else ())
        policies[name] = [agents.index(a) for a in members]
        specs[name] = spec
    return _Layout(env, agents, policies, specs)


_SPECS: dict[tuple, dict[str, EnvSpec]] = {}


def jax_specs(config: EnvConfig) -> dict[str, EnvSpec]:
    """Policy name -> its EnvSpec (global state sized for a centralized critic), cached
    per (id, scenario, kwargs, policies, agent_id, global_state)."""
    key = (config.id, config.scenario, repr(config.kwargs), repr(config.policies),
           config.agent_id, config.global_state)
    if key not in _SPECS:
        _SPECS[key] = _layout(config, global_state=True).specs
    return dict(_SPECS[key])


def _stack(values: dict, agents: list[str]) -> Any:
    import jax.numpy as jnp

    return jnp.stack([values[a] for a in agents])


def _step_function(game: Game, env: Any, agents: list[str],
                   from_state: bool) -> tuple[Callable, Callable]:
    """The jitted step of `count` envs at once, (keys, states, actions [count, N], in play
    [count, N]) -> (keys, states, what the step gives, see `JaxSplit.step`), in which an env
    whose episode ended starts anew; and the jitted reset, keys -> (keys, states, the first
    observations, legal actions and global states)."""
    jax = _jax()
    jnp = jax.numpy

    def global_state(obs: dict) -> Any:
        if from_state:
            return obs["world_state"].astype(jnp.float32)
        return _stack(obs, agents).reshape(-1).astype(jnp.float32)

    def legal(state: Any) -> Any:
        """Each agent's legal actions ([N, A]; [0] where the env masks none)."""
        if game.legal is None:
            return jnp.zeros((0,), bool)
        return _stack(game.legal(env, state), agents).astype(bool)

    def first(key: Any) -> tuple[Any, Any, Any]:
        obs, state = env.reset(key)
        # Types as the step gives them back (none weak): the step compiles once, not twice.
        state = jax.tree.map(lambda x: jax.lax.convert_element_type(x, x.dtype), state)
        return state, _stack(obs, agents), global_state(obs)

    def one(key: Any, state: Any, actions: Any, playing: Any) -> tuple:
        key, step_key, reset_key = jax.random.split(key, 3)
        if game.legal is not None:  # out of play: its env's own idle action (SMAX: stop)
            actions = jnp.where(playing, actions, jnp.argmax(legal(state), -1))
        obs, after, rewards, dones, _ = env.step_env(
            step_key, state, {a: actions[i] for i, a in enumerate(agents)})
        done = dones["__all__"]
        alive = jnp.ones(len(agents), bool) if game.alive is None else game.alive(env, after)
        cut = done & game.cut(env, after)
        won = done & game.won(env, after) if game.won is not None else jnp.zeros((), bool)
        final_obs, final_state = _stack(obs, agents), global_state(obs)
        new_state, new_obs, new_global = first(reset_key)
        state = jax.tree.map(lambda new, old: jnp.where(done, new, old), new_state, after)
        return key, state, (
            jnp.where(done, new_obs, final_obs).astype(jnp.float32),
            final_obs.astype(jnp.float32), _stack(rewards, agents).astype(jnp.float32),
            alive, done, cut, won, jnp.where(done, jnp.ones_like(alive), alive), legal(state),
            jnp.where(done, new_global, final_state), final_state)

    def reset(keys: Any) -> tuple:
        def start(key: Any) -> tuple:
            key, reset_key = jax.random.split(key)
            state, obs, state_vector = first(reset_key)
            return key, state, obs.astype(jnp.float32), legal(state), state_vector
        return jax.vmap(start)(keys)

    return jax.jit(jax.vmap(one)), jax.jit(reset)


_STEPS: dict[tuple, tuple[Callable, Callable]] = {}
"""The jitted step and reset of each env (id, scenario, kwargs, global state from its
state), made once a process."""


class JaxSplit:
    """`count` JaxMARL envs stepped together, cut into one batch of columns per policy
    (the JAX-native counterpart of `MultiAgentSplit`, whose docstring says what each
    policy's `StepResult` holds; see the module docstring for what differs)."""

    def __init__(self, config: EnvConfig, count: int, seeds: list[int],
                 global_state: bool = False) -> None:
        layout = _layout(config, global_state)
        game = _game(config)
        self.env_id, self.count = config.id, count
        self.agents = {name: [layout.agents[i] for i in members]
                       for name, members in layout.policies.items()}
        """Policy name -> its agents, in column order within one env."""
        self.policies = list(layout.specs)
        self._members = [np.asarray(layout.policies[p]) for p in self.policies]
        self._n_agents = len(layout.agents)
        self._ids = [np.tile(np.eye(len(m), dtype=np.float32), (count, 1))
                     if config.agent_id and len(m) > 1 else None for m in self._members]
        self._masked = game.legal is not None
        self._wins = game.won is not None
        self._global = global_state
        from_state = game.world_state and config.global_state == "state"
        key = (config.id, config.scenario, repr(config.kwargs), from_state)
        if key not in _STEPS:  # splits of one size then share one compiled step
            _STEPS[key] = _step_function(game, layout.env, layout.agents, from_state)
        self._step, self._reset = _STEPS[key]
        self.reset(seeds)

    def reset(self, seeds: list[int]) -> None:
        """Start every env anew from `seeds`, dropping the episodes in play."""
        jax = _jax()
        keys = jax.vmap(jax.random.PRNGKey)(np.asarray([s % 2**32 for s in seeds], np.uint32))
        self._keys, self._states, obs, mask, state = self._reset(keys)
        obs, mask, state = (np.asarray(a) for a in (obs, mask, state))
        self._playing = np.ones((self.count, self._n_agents), bool)
        self._returns = np.zeros((self.count, self._n_agents), np.float64)
        self._lengths = np.zeros((self.count, self._n_agents), np.int64)
        self._env_lengths = np.zeros(self.count, np.int64)
        self._set_current(obs, mask, state, self._playing)

    def __len__(self) -> int:
        return self.count

    def _columns(self, p: int, per_agent: np.ndarray) -> np.ndarray:
        """Policy p's columns (env-major) of a [count, N, ...] array."""
        picked = per_agent[:, self._members[p]]
        return picked.reshape(-1, *picked.shape[2:])

    def _rows(self, p: int, obs: np.ndarray) -> np.ndarray:
        """Observations [count, N, ...] as policy p's request rows (ids appended)."""
        rows = self._columns(p, obs)
        if self._ids[p] is None:
            return rows
        return np.concatenate([rows.reshape(len(rows), -1), self._ids[p]], axis=1)

    def _set_current(self, obs: np.ndarray, mask: np.ndarray, state: np.ndarray,
                     playing: np.ndarray) -> None:
        obs = np.where(playing.reshape(*playing.shape, *[1] * (obs.ndim - 2)), obs, 0.0)
        self.obs = [self._rows(p, obs) for p in range(len(self.policies))]
        """Per policy: the observations the next actions answer, [count * n_agents, ...]."""
        self.masks: list[np.ndarray | None] = [None] * len(self.policies)
        """Per policy: the legal actions of `obs` (None: unmasked); out of play: all."""
        if self._masked:
            mask = mask | ~playing[..., None]
            self.masks = [self._columns(p, mask) for p in range(len(self.policies))]
        self.global_state = state if self._global else np.zeros((self.count, 0), np.float32)

    def step(self, actions: list[list]) -> RingStep:
        """Step every env: `actions[p]` holds one action per column of policy p."""
        chosen = np.zeros((self.count, self._n_agents), np.int32)
        for p, members in enumerate(self._members):
            chosen[:, members] = np.asarray(actions[p], np.int32).reshape(self.count, -1)
        acted = self._playing
        self._keys, self._states, out = self._step(self._keys, self._states, chosen, acted)
        (obs, final_obs, rewards, alive, done, cut, won, playing, mask, state,
         final_state) = (np.asarray(a) for a in out)
        killed = acted & ~alive
        truncated = acted & cut[:, None] & ~killed
        terminated = ~acted | killed | (acted & done[:, None] & ~cut[:, None])
        rewards = np.where(acted, rewards, 0.0).astype(np.float32)
        self._returns += rewards
        self._lengths += acted
        self._env_lengths += 1
        self._playing = playing
        self._set_current(obs, mask, state, playing)
        final_global = np.where(cut[:, None], final_state, 0.0).astype(np.float32) \
            if self._global else self.global_state
        finished = np.flatnonzero(done)
        results = []
        for p, members in enumerate(self._members):
            cut_columns = np.flatnonzero(self._columns(p, truncated))
            results.append(StepResult(
                self._columns(p, rewards), self._columns(p, terminated),
                self._columns(p, truncated), self.obs[p], cut_columns.astype(np.int64),
                self._rows(p, final_obs)[cut_columns],
                self._returns[finished][:, members].reshape(-1).tolist(),
                self._lengths[finished][:, members].reshape(-1).tolist(),
                active=self._columns(p, acted), action_mask=self.masks[p],
                global_state=self.global_state, final_global_state=final_global))
        step = RingStep(results, self._returns[finished].sum(1).tolist(),
                        self._env_lengths[finished].tolist(),
                        won[finished].astype(float).tolist() if self._wins else [])
        self._returns[finished], self._lengths[finished] = 0.0, 0
        self._env_lengths[finished] = 0
        return step

    def render(self) -> Any:
        """JaxMARL's envs draw with matplotlib, not into frames: no video of them."""
        raise ValueError(f"'{self.env_id}' does not render frames")

    def close(self) -> None:
        """Nothing to release: the envs are arrays."""


class JaxMARLEnvs(EnvFamilyImplementation):
    """JaxMARL's environments, each policy's agents a batch of columns."""

    def check_id(self, env: EnvConfig) -> None:
        _scenario(env)

    def spec(self, env: EnvConfig, policy: str) -> EnvSpec:
        return policy_of(jax_specs(env), env, policy)

    def make_split(self, env: EnvConfig, count: int, seeds: list[int],
                   global_state: bool = False) -> JaxSplit:
        return JaxSplit(env, count, seeds, global_state)


JAXMARL = JaxMARLEnvs()
