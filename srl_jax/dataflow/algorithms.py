"""The algorithm registry: one `Algorithm` object per algorithm, found by name.

An algorithm is one module. It exports one `Algorithm`: its name, its own config
dataclass (its section `learner.<name>` of the experiment YAML, every field with a
one-line doc, checked in `__post_init__`), the builders of its optimizer and of its
pure (TrainState, Batch) -> (TrainState, metrics) update, which get that config and
the derived `Sizes` (never the whole experiment config), the fields the update
reads, the networks it trains (`Network`: each one's builder, beside the loss, and
the action spaces it acts in; `network.head` picks one by name), how it samples
replay if it learns from replay (`Replay`: otherwise it learns from fresh chunks on
`samples`), and the config fields that may change during a run (`live`: the update
reads their current values from `TrainState.hyper`, so changing one recompiles
nothing). The built-in ones (`BUILT_IN`) are imported on first use; any other module
registers its algorithm with `register(...)` when it is imported, which the
experiment's `plugins` list makes happen in every process.

This module imports no JAX: the launcher checks configs with it before any worker
starts. A built-in algorithm's `Algorithm` lives with its config in a module of its own
that imports no JAX either (`learners/algorithms/ppo_config.py` beside the math in
`learners/algorithms/ppo.py`),
and names its builders with `lazy`: the launcher, which imports JAX nowhere else, starts
about a second sooner. It sits with the config, below actors and learners, so that the
learner and the actors read the same declared source (`chunk_stream`).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from srl_jax.config.loader import build_dataclass
from srl_jax.config.schema import (
    ActorConfig,
    ConfigError,
    ExperimentConfig,
    LearnerConfig,
    NetworkConfig,
)
from srl_jax.dataflow.chunk_spec import CHUNK_FIELDS, batch_fields
from srl_jax.dataflow.env_spec import EnvSpec
from srl_jax.dataflow.replay_spec import ReplayField, replay_batch_fields, replay_fields
from srl_jax.dataflow.stream_table import INSERTS, REPLAY, SAMPLES, Stream

BUILT_IN = {"ppo": "learners.algorithms.ppo_config", "impala": "learners.algorithms.impala_config",
            "dqn": "learners.algorithms.dqn_config", "r2d2": "learners.algorithms.r2d2_config",
            "muzero": "learners.algorithms.muzero_config",
            "qmix": "learners.algorithms.qmix_config"}
"""Name -> module exporting `ALGORITHM` (imported on first use; it imports no JAX)."""
ACTION_SPACES = ("discrete", "continuous")
"""What a network may act in: a finite set of actions, or vectors of floats."""
SHARED_NETWORK_KEYS = ("kind", "hidden", "activation", "core", "core_size", "conv", "head")
"""The `network` keys every network reads; any other (`network.critic`, `layer_norm`, ...)
is read only by the networks that name it in `Network.options`."""
_REGISTERED: dict[str, Algorithm] = {}


@dataclass(frozen=True)
class Sizes:
    """What an algorithm needs of the rest of the experiment, derived once (`sizes`)."""

    trajectory_length: int
    """T: steps per chunk; a batch is [T+1, B]."""
    batch_envs: int
    """B: env columns per update (over all learner processes)."""
    total_updates: int
    """Updates in the whole run (stop.env_frames / (T * B)); 0 when the run has no
    frame limit."""
    reward_scale: float
    """Rewards are multiplied by this before the update (learner.reward_scale)."""
    reward_clip: float
    """Rewards are clipped to [-c, c] before the update (0: no clipping)."""
    recurrent: bool = False
    """The policy has a recurrent core (network.core): updates unroll whole columns."""
    burn_in: int = 0
    """Steps at the start of each column that only warm the state (learner.burn_in)."""
    overlap: int = 0
    """Steps each chunk repeats of the one before it (`Algorithm.overlap`; else the
    burn-in): the next chunk starts T - overlap steps after this one did."""
    shared_torso: bool = False
    """Policy and value share parameters (a Nature-CNN torso, a recurrent core): no
    separate critic MLP."""


@dataclass(frozen=True)
class Network:
    """A network an algorithm trains, declared beside its loss: what `network.head` names.
    Several algorithms may declare the same one (PPO's `actor_critic` is IMPALA's too)."""

    head: str
    """Its name in `network.head`."""
    build: Callable[[ExperimentConfig, EnvSpec], tuple[Any, Any]]
    """(config, spec) -> (policy, flax module): the `learners.models.networks.Policy` that
    acting and the update call, and the module whose parameters `init_policy_params`
    makes. Named with `lazy` where it lives in a module that imports JAX."""
    actions: tuple[str, ...] = ("discrete",)
    """The action spaces it acts in (`ACTION_SPACES`); an env with others is refused."""
    greedy: bool = False
    """It acts on the argmax of its outputs (Q-values): `actors.epsilon` explores around it,
    and its actors may compute replay priorities from them (`replay.initial_priority`)."""
    action_masks: bool = False
    """It reads the env's legal actions (`EnvSpec.action_masked`)."""
    options: tuple[str, ...] = ()
    """The `network` keys beyond `SHARED_NETWORK_KEYS` it reads (e.g. `critic`); a run that
    sets another to other than its default is refused."""
    check: Callable[[ExperimentConfig], None] | None = None
    """Its own checks of the experiment config (ConfigError with one line), if any."""
    search_act: Callable[[Any, Any, float], Any] | None = None
    """A network that acts by its own search (MuZero's model): (network, algorithm config,
    gumbel_scale) -> the servers' jitted acting call (`learners.models.outputs.Act`), whose
    outputs carry the search's policy (`EnvSpec.search_policy`); gumbel_scale 0 for
    evaluation. None: its distribution samples the actions."""


@dataclass(frozen=True)
class Replay:
    """How an algorithm that learns from replay samples it (its batches come on the
    `replay` stream, and the run needs replay servers)."""

    window: Callable[[Any], int]
    """(algorithm config) -> n: the steps of each sampled n-step window (with `sequences`,
    of the target's window within each sequence; with `positions`, the steps each sampled
    position carries)."""
    sequences: bool = False
    """It samples whole chunk columns with their stored recurrent state (R2D2's sequences,
    `SEQUENCE_FIELDS`), not n-step transitions (`REPLAY_FIELDS`)."""
    fields: tuple[str, ...] = ()
    """Chunk fields (`CHUNK_FIELDS`, one row per step) the replay servers keep for it beside
    the standard ones, sampled at each transition's first step (or along each sequence):
    e.g. `global_state` for a centralized critic, `logp` for an importance weight."""
    positions: bool = False
    """With `sequences`: it samples single positions of the stored sequences by their own
    priorities, each with the `window` steps after it (MuZero; replay/position_buffer.py),
    not whole sequences. The chunks then need a tail of window - 1 steps
    (`Algorithm.overlap`)."""
    teams: bool = False
    """With `sequences`: a row is not one column but a team, the columns of one env's agents
    side by side over the same steps (QMIX's mixer reads them together;
    replay/team_buffer.py). Sampled batches hold whole teams, `EnvSpec.agents` consecutive
    rows each, one item of the sum tree."""
    reanalysed_steps: Callable[[Any], int] | None = None
    """(algorithm config) -> the leading steps of each sampled window whose targets
    reanalysis renews (MuZero: the K + 1 policy targets an unroll reads); None: all."""
    reanalyse: Callable[[Any], float] | None = None
    """(algorithm config) -> the fraction of the sampled rows whose search targets
    the replay servers renew with the newest parameters before sending them (MuZero
    Reanalyze; replay/reanalysing_replay.py). None or 0: none."""


@dataclass(frozen=True)
class Algorithm:
    """One learning algorithm, as the learner worker and the config checks see it."""

    name: str
    """Its name in `learner.algorithm`, and its section `learner.<name>`."""
    config: type
    """Its config dataclass; every field has a default and a one-line doc, and
    `__post_init__` raises `srl_jax.config.schema.ConfigError` naming `learner.<name>.<key>`."""
    make_optimizer: Callable[[Any, Sizes], Any]
    """(config, sizes) -> optax.GradientTransformation over the network parameters."""
    make_update: Callable[[Any, Any, Any, Sizes], Callable]
    """(policy, optimizer, config, sizes) -> pure update (TrainState, Batch) ->
    (TrainState, metrics) for the learner to jit over its mesh."""
    fields: tuple[str, ...]
    """The batch fields its update reads (chunk fields, or sampled replay fields)."""
    networks: tuple[Network, ...]
    """The networks it can train; `network.head` names one."""
    replay: Replay | None = None
    """How it samples replay; None: it learns from the fresh chunks on `samples`."""
    check: Callable[[Any, Sizes], None] | None = None
    """Checks of its config against the sizes (ConfigError with one line), if any."""
    init_extra: Callable[[Any, Any], Any] | None = None
    """Its own train state beside params and optimizer (DQN's and R2D2's target network,
    PPO's value statistics), from the initial parameters and its config; kept in
    `TrainState.extra` and checkpointed (`extra_initializer`)."""
    live: tuple[str, ...] = ()
    """Float fields of its config that may change during a run (population-based
    training): kept in `TrainState.hyper` and read from there by the update, so a new
    value takes effect at the next update without recompiling."""
    sequence: Callable[[Any], tuple[int, int]] | None = None
    """(its config) -> (chunk length, burn-in), where its own section sets the sequences it
    replays (R2D2's burn-in plus trained steps): `resolve_algorithms` writes them into
    `actors.trajectory_length` and `learner.burn_in`, which every other part reads. None:
    those keys are the user's."""
    overlap: Callable[[Any, Sizes], int] | None = None
    """(its config, sizes) -> steps each chunk repeats of the one before (R2D2's sequence
    period, MuZero's tail of targets); None: the burn-in, so each step trains once."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.live) - {f.name for f in dataclasses.fields(self.config)})
        if unknown:
            raise ValueError(f"algorithm '{self.name}': live {unknown} are not fields of "
                             f"{self.config.__name__}")
        if not self.networks:
            raise ValueError(f"algorithm '{self.name}' declares no network")

    @property
    def source(self) -> str:
        """The stream it takes data from: `replay` with a `Replay`, else `samples`."""
        return SAMPLES.name if self.replay is None else REPLAY.name

    @property
    def heads(self) -> tuple[str, ...]:
        """The `network.head`s it can train."""
        return tuple(network.head for network in self.networks)


def lazy(module: str, name: str) -> Callable:
    """`module.name`, imported at its first call: how an algorithm's declaration names
    builders that live in a module that imports JAX."""

    def call(*args: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args)

    call.__qualname__ = f"{module}.{name}"
    return call


def live_values(algo: Algorithm, config: Any) -> dict[str, float]:
    """The starting values of `algo`'s live hyperparameters, from its `config`."""
    return {name: float(getattr(config, name)) for name in algo.live}


def with_live(config: Any, hyper: Any) -> Any:
    """`config` with the live fields set from `hyper` (name -> value; inside the update,
    traced scalars), the others kept. `__post_init__` is skipped: its checks need
    concrete values, and a population may set a step size of 0."""
    live = copy.copy(config)
    vars(live).update(hyper)
    return live


def register(algo: Algorithm) -> None:
    """Make `algo` known by its name (called by a plugin module when it is imported)."""
    reserved = {f.name for f in dataclasses.fields(LearnerConfig)} | set(BUILT_IN)
    if algo.name in reserved:
        raise ValueError(f"algorithm name '{algo.name}' is taken by 'learner.{algo.name}'")
    if _REGISTERED.get(algo.name, algo) is not algo:
        raise ValueError(f"another algorithm is registered as '{algo.name}'")
    _REGISTERED[algo.name] = algo


def known() -> list[str]:
    """Names of the built-in and the registered algorithms."""
    return sorted(set(BUILT_IN) | set(_REGISTERED))


def algorithm(name: str) -> Algorithm:
    """The algorithm called `name`; ConfigError naming `learner.algorithm` if none is."""
    if name not in _REGISTERED and name in BUILT_IN:
        _REGISTERED[name] = importlib.import_module(BUILT_IN[name]).ALGORITHM
    if name not in _REGISTERED:
        close = difflib.get_close_matches(name, known(), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"'learner.algorithm': unknown '{name}'{hint} (known: "
                          f"{', '.join(known())}; others register through 'plugins')")
    return _REGISTERED[name]


def replay_of(config: ExperimentConfig) -> Replay:
    """How the run's algorithm samples replay, for the parts that exist only where it learns
    from replay (replay servers, actors' priorities, the learner's replay intake)."""
    replay = algorithm(config.learner.algorithm).replay
    if replay is None:
        raise ValueError(f"'{config.learner.algorithm}' learns from fresh samples, not replay")
    return replay


def chunk_stream(config: ExperimentConfig) -> Stream:
    """Where the actors send their chunks, as the run's algorithm declares its source: to
    the learners (samples), or to the replay servers (inserts) for one that learns from
    replay."""
    return INSERTS if algorithm(config.learner.algorithm).source == REPLAY.name else SAMPLES


def sizes(config: ExperimentConfig) -> Sizes:
    """The sizes every algorithm may depend on, from the experiment config."""
    T, B = config.actors.trajectory_length, config.learner.batch_envs
    frames = config.stop.env_frames
    burn_in = config.learner.burn_in
    derived = Sizes(trajectory_length=T, batch_envs=B,
                    total_updates=max(1, frames // (T * B)) if frames else 0,
                    reward_scale=config.learner.reward_scale,
                    reward_clip=config.learner.reward_clip,
                    recurrent=config.network.core != "none", burn_in=burn_in, overlap=burn_in,
                    shared_torso=config.network.kind != "mlp" or config.network.core != "none")
    algo = algorithm(config.learner.algorithm)
    if algo.overlap is None:
        return derived
    return dataclasses.replace(derived,
                               overlap=algo.overlap(_section(config, algo.name), derived))


def sampled_window(config: ExperimentConfig) -> int:
    """The steps of each row the run's replay servers sample: a whole sequence's T, or the
    algorithm's window (`Replay.window`) after a transition or a position."""
    replay = replay_of(config)
    if replay.sequences and not replay.positions:
        return config.actors.trajectory_length
    return replay.window(algorithm_config(config))


def chunk_overlap(config: ExperimentConfig) -> int:
    """Steps each of the run's chunks repeats of the one before (`Sizes.overlap`): what the
    actors copy forward and what a learner does not count as new."""
    return sizes(config).overlap


def check_chunks(algo: Algorithm, config: ExperimentConfig) -> None:
    """The chunks hold what the algorithm trains on: a burn-in that the previous chunk
    trained on, and a next chunk that starts after this one did."""
    derived = sizes(config)
    T, burn_in, overlap = derived.trajectory_length, derived.burn_in, derived.overlap
    if burn_in and not derived.recurrent:
        raise ConfigError("'learner.burn_in' warms a recurrent state: it needs 'network.core' "
                          "lstm or gru")
    if algo.overlap is None and 2 * burn_in > T:
        raise ConfigError(f"'learner.burn_in' ({burn_in}) must be at most half of "
                          f"'actors.trajectory_length' ({T}): each chunk repeats the last "
                          "burn_in steps of the one before, which trained on them")
    if not 0 <= overlap < T:
        raise ConfigError(f"'{algo.name}' repeats {overlap} steps of each chunk in the next, "
                          f"which must be fewer than 'actors.trajectory_length' ({T})")


def _section(config: ExperimentConfig, name: str) -> Any:
    """Section `learner.<name>` built with its algorithm's config class."""
    values = config.learner.algorithms.get(name, {})
    return build_dataclass(algorithm(name).config, values, f"learner.{name}")


def sampled_fields(algo: Algorithm) -> tuple[ReplayField, ...]:
    """The fields of the batches `algo` samples from replay (n-step transitions or
    sequences, with the chunk fields its `Replay` keeps); () if it learns from samples."""
    if algo.replay is None:
        return ()
    return replay_fields(algo.replay.sequences, algo.replay.fields)


def check_inputs(algo: Algorithm) -> None:
    """ConfigError unless the learner can feed `algo`: the chunk fields its replay keeps
    are per-step chunk fields, and the fields it reads are declared for its batch
    (srl_jax/dataflow/chunk_spec.py, srl_jax/dataflow/replay_spec.py)."""
    if algo.replay is not None:
        per_step = {f.name for f in CHUNK_FIELDS if f.extent != "1"}
        standard = {f.name for f in replay_fields(algo.replay.sequences)}
        kept = set(algo.replay.fields)
        odd = sorted((kept - per_step) | (kept & standard))
        if odd:
            raise ConfigError(f"'learner.algorithm': '{algo.name}' keeps {odd} in replay: "
                              "only chunk fields of one row per step that a sampled batch "
                              f"does not already carry ({', '.join(sorted(per_step - standard))})")
    available = (batch_fields() if algo.replay is None
                 else replay_batch_fields(sampled_fields(algo)))
    missing = sorted(set(algo.fields) - set(available))
    if missing:
        raise ConfigError(f"'learner.algorithm': '{algo.name}' reads fields {missing} that "
                          f"the {algo.source} batch does not carry (it has "
                          f"{', '.join(available)})")


def network_of(config: ExperimentConfig) -> Network:
    """The network the run trains: the one of its algorithm that `network.head` names;
    ConfigError naming the ones it has otherwise."""
    algo, head = algorithm(config.learner.algorithm), config.network.head
    for network in algo.networks:
        if network.head == head:
            return network
    raise ConfigError(f"'network.head': '{algo.name}' trains {' or '.join(algo.heads)}, "
                      f"not '{head}'")


def check_spaces(network: Network, spec: EnvSpec, env_id: str) -> None:
    """ConfigError unless `network` acts in `env_id`'s action space (`spec`, as one policy
    sees it) and reads its action masks if it has them."""
    space = "continuous" if spec.continuous else "discrete"
    if space not in network.actions:
        raise ConfigError(f"'network.head': '{network.head}' acts in "
                          f"{' or '.join(network.actions)} action spaces; '{env_id}' has "
                          f"{space} actions")
    if spec.action_masked and not network.action_masks:
        raise ConfigError(f"'network.head': '{network.head}' does not read action masks, and "
                          f"'{env_id}' has them: use a network that does")


def check_network_options(network: Network, config: NetworkConfig) -> None:
    """ConfigError for a `network` key set that `network` does not read."""
    default = NetworkConfig()
    for field in dataclasses.fields(NetworkConfig):
        key = field.name
        if key in SHARED_NETWORK_KEYS or key in network.options:
            continue
        if getattr(config, key) != getattr(default, key):
            raise ConfigError(f"'network.{key}' is not read by 'network.head' "
                              f"'{network.head}'; leave it unset")


def check_dataflow(algo: Algorithm, config: ExperimentConfig) -> None:
    """ConfigError unless the run is built for `algo`: a network it trains, set as that
    network reads it, replay servers exactly when it learns from replay, epsilon only for
    a greedy network."""
    network, replay = network_of(config), config.replay.count
    check_network_options(network, config.network)
    if network.check is not None:
        network.check(config)
    if algo.replay is not None and replay < 1:
        raise ConfigError(f"'replay.count': '{algo.name}' learns from replay; it needs at "
                          "least 1 replay server")
    if algo.replay is None and replay:
        raise ConfigError(f"'replay.count': '{algo.name}' learns from fresh samples; replay "
                          f"servers would get no data (set it to 0, not {replay})")
    if config.network.critic == "global" and "global_state" not in algo.fields:
        raise ConfigError(f"'network.critic': 'global' is for an algorithm that reads the "
                          f"global state; '{algo.name}' does not")
    sequences = algo.replay is not None and algo.replay.sequences
    if algo.replay is not None and not sequences and config.network.core != "none":
        raise ConfigError(f"'network.core': '{algo.name}' replays n-step transitions, which "
                          "carry no recurrent state; a recurrent Q network learns with 'r2d2'")
    if sequences and config.replay.initial_priority == "actor":
        raise ConfigError(f"'replay.initial_priority': '{algo.name}' starts each sequence at "
                          "the largest priority seen ('max'); the actors' per-step TD errors "
                          "do not make a sequence's")
    if algo.replay is not None and config.replay.initial_priority == "actor" \
            and not network.greedy:
        raise ConfigError("'replay.initial_priority': 'actor' computes TD errors from a greedy "
                          f"network's Q-values; a '{network.head}' head has none (use 'max')")
    if config.actors.epsilon and not network.greedy:
        raise ConfigError("'actors.epsilon' explores around a greedy network (a Q network's "
                          f"best action); a '{network.head}' head samples its own actions")


def algorithm_config(config: ExperimentConfig) -> Any:
    """The chosen algorithm's config, built from `learner.<name>` (defaults for what is not
    written) and checked against the sizes and the learner's inputs; ConfigError with one
    line naming the key."""
    algo = algorithm(config.learner.algorithm)
    check_inputs(algo)
    check_dataflow(algo, config)
    built = _section(config, algo.name)
    if algo.check is not None:
        algo.check(built, sizes(config))
    check_chunks(algo, config)  # after the algorithm's own, which name its keys
    return built


def resolve_algorithms(config: ExperimentConfig) -> ExperimentConfig:
    """`config` with every algorithm section written, and the chosen one's, built and
    checked and written back whole (defaults filled in), as the run's config.yaml keeps
    it; ConfigError for a section no algorithm owns or a bad value in one."""
    sections = dict(config.learner.algorithms)
    for name in sections:
        if name not in known():
            close = difflib.get_close_matches(name, known(), n=1)
            hint = f" (did you mean 'learner.{close[0]}'?)" if close else ""
            raise ConfigError(f"unknown key 'learner.{name}'{hint}: not a learner setting nor "
                              f"an algorithm (known: {', '.join(known())})")
    chosen = config.learner.algorithm
    resolved = {name: dataclasses.asdict(_section(config, name)) for name in sections}
    config = with_sequence(config)
    resolved[chosen] = dataclasses.asdict(algorithm_config(config))
    return dataclasses.replace(
        config, learner=dataclasses.replace(config.learner, algorithms=resolved))


def with_sequence(config: ExperimentConfig) -> ExperimentConfig:
    """`config` with the chunk length and burn-in its algorithm's section sets
    (`Algorithm.sequence`) written into `actors.trajectory_length` and `learner.burn_in`;
    ConfigError where the user set those keys to something else."""
    algo = algorithm(config.learner.algorithm)
    if algo.sequence is None:
        return config
    length, burn_in = algo.sequence(_section(config, algo.name))
    written = {  # (as set, as the section sets it, the schema's default: left unset)
        "actors.trajectory_length": (config.actors.trajectory_length, length,
                                     ActorConfig.trajectory_length),
        "learner.burn_in": (config.learner.burn_in, burn_in, LearnerConfig.burn_in)}
    for key, (value, wanted, default) in written.items():
        if value not in (wanted, default):
            raise ConfigError(f"'{key}' ({value}) is set by 'learner.{algo.name}' for "
                              f"'{algo.name}' (to {wanted}); leave it unset")
    return dataclasses.replace(
        config, actors=dataclasses.replace(config.actors, trajectory_length=length),
        learner=dataclasses.replace(config.learner, burn_in=burn_in))


def reanalyse_fraction(config: ExperimentConfig) -> float:
    """The fraction of sampled rows the run's replay servers reanalyse
    (`Replay.reanalyse`; 0: none)."""
    replay = algorithm(config.learner.algorithm).replay
    if replay is None or replay.reanalyse is None:
        return 0.0
    return replay.reanalyse(algorithm_config(config))


def reanalysed_steps(config: ExperimentConfig) -> int:
    """The leading steps of each sampled window that the run's replay servers reanalyse
    (`Replay.reanalysed_steps`; else the whole window)."""
    replay = replay_of(config)
    if replay.reanalysed_steps is None:
        return sampled_window(config)
    return replay.reanalysed_steps(algorithm_config(config))


def reanalyses(config: ExperimentConfig) -> bool:
    """Whether the run's replay servers reanalyse what they sample."""
    return reanalyse_fraction(config) > 0


def extra_initializer(algo: Algorithm, algo_config: Any) -> Callable[[Any], Any] | None:
    """(initial params) -> the algorithm's own train state under `algo_config`, or None."""
    init_extra = algo.init_extra
    if init_extra is None:
        return None
    return lambda params: init_extra(params, algo_config)
