"""Experiment configuration schema: typed dataclasses, their defaults and one-line docs.

One config describes the whole dataflow graph. Every field has a default and a
docstring. `srl_jax.config.loader` turns YAML plus `--set key=value` overrides
into an `ExperimentConfig`, `srl_jax.config.checks` rejects what cannot run, and
the sections about operating a run are in `srl_jax.config.operations`;
each algorithm owns the schema of its section under `learner`
(`srl_jax/dataflow/algorithms.py`). Errors are `ConfigError` with one line naming the key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from srl_jax.config.operations import CheckpointConfig, RayConfig, RuntimeConfig, TransportConfig
from srl_jax.wire.names import DEFAULT_POLICY

NETWORKS = ("mlp", "nature_cnn")
CORES = ("none", "lstm", "gru")
CRITICS = ("local", "global")
CONVS = ("auto", "xla", "matmul")
DEFAULT_BACKEND = "gymnasium"
"""The `env.backend` that every env family has (others: `srl_jax.config.env_families`)."""
NAME_SERVICES = ("auto", "files", "network")
POLICY_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
RESERVED_POLICY_NAMES = ("best", "evaluated", "pool")
"""Directories of `checkpoints/` that a policy's own checkpoints would collide with."""
SECTIONS = "sections"
"""Field metadata: a `dict[str, dict]` field that gathers the section's other mappings
(`learner.ppo: {...}`) by name, for a plugin to build; it has no key of its own."""


class ConfigError(ValueError):
    """A config that cannot run; the message is one line naming the key."""


@dataclass
class AtariConfig:
    noop_max: int = 30
    """Up to this many no-op actions after a reset (random starts)."""
    frame_skip: int = 4
    """Each action is repeated this many frames; the max of the last two is observed."""
    frame_stack: int = 4
    """Observations stack this many preprocessed frames (the last axis)."""
    sticky_actions: float = 0.25
    """Probability that the previous action repeats (ALE v5 default; 0 for v4-style)."""
    episodic_life: bool = False
    """A lost life ends the episode for learning (the game goes on; scores stay whole)."""
    full_action_space: bool = False
    """All 18 actions instead of the game's minimal set."""


@dataclass
class EnvConfig:
    id: str = "CartPole-v1"
    """A registered gymnasium environment id, an Atari game as 'ALE/<Game>-v5', or a
    PettingZoo parallel environment as 'pettingzoo:<module>' (a module with `parallel_env`):
    an id of a family of `srl_jax.config.env_families` (plugins may add families)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments passed to `gymnasium.make` (or to PettingZoo's `parallel_env`)."""
    scenario: str = ""
    """JaxMARL envs ('jaxmarl:<env>'): the SMAX map ('3m', '2s3z', ...), the Overcooked
    layout ('cramped_room', ...) or the Hanabi table ('2p' .. '5p'). Empty: the env's
    default (3m, cramped_room, 2p)."""
    atari: AtariConfig = field(default_factory=AtariConfig)
    """Atari preprocessing (used for 'ALE/...' ids)."""
    backend: str = DEFAULT_BACKEND
    """How actors step a split: 'gymnasium' (one env object each) or 'envpool' (one C++ batch)."""
    policies: dict[str, list[str]] = field(default_factory=dict)
    """Multi-agent envs: policy name -> patterns (fnmatch) of the agents it acts for; an
    agent goes to the first policy that matches it. Each policy has its own learner and
    inference servers. Empty: one policy, 'default', shared by every agent."""
    agent_id: bool = True
    """Multi-agent envs: append a one-hot of the agent's place among its policy's agents
    to its observations, so that a shared policy can tell its agents apart."""
    global_state: Literal["state", "observations"] = "state"
    """Multi-agent envs with a centralized critic: its global state is the env's `state()`
    (every agent's observation side by side where the env has none), or always the
    observations side by side, which costs no extra call a step (MPE's `state()` is
    exactly those)."""
    mask_obs: list[int] = field(default_factory=list)
    """Gymnasium envs: indices (into the flattened observation) replaced by zeros, to make
    a partially observable task (CartPole without velocities: [1, 3])."""


def member_names(members: int) -> list[str]:
    """The policy names of a population's members: m0, m1, ..."""
    return [f"m{i}" for i in range(members)]


def run_policies(config: ExperimentConfig) -> list[str]:
    """Every policy that has its own learner in the run: a population's members, else
    the env's policies (`policy_names`) less the frozen ones (`selfplay.frozen`)."""
    return member_names(config.population.members) or [
        policy for policy in policy_names(config.env) if policy not in config.selfplay.frozen]


def acting_policies(config: ExperimentConfig) -> list[str]:
    """Every policy that has its own inference servers: `run_policies` and the frozen
    policies, in the order actors serve them."""
    return member_names(config.population.members) or policy_names(config.env)


def policy_names(env: EnvConfig) -> list[str]:
    """The policies that act in `env`, in the order actors serve them: those of
    `env.policies`, else 'default' alone (`actors.envs.check_policies` makes sure that
    each one gets agents)."""
    return list(env.policies) or [DEFAULT_POLICY]


@dataclass
class ActorConfig:
    count: int = 2
    """Number of actor processes."""
    envs: int = 16
    """Environments per actor (the size K of the env ring)."""
    splits: int = 2
    """Inference splits S: the ring is cut in S groups; one steps while the others wait."""
    trajectory_length: int = 32
    """T: steps per trajectory chunk (each chunk carries T+1 observations)."""
    inference_timeout_s: float = 5.0
    """A request unanswered for this long is sent again (to any live server)."""
    send_policy: str = "block"
    """When the learner cannot keep up: 'block' the actor, or 'drop' the chunk (counted)."""
    send_queue: int = 4
    """Chunks an actor may have in flight on the sample stream (ZMQ high-water mark)."""
    inline_inference: bool = False
    """Run the policy inside the actor on CPU from the latest parameters, no servers."""
    epsilon: float = 0.0
    """Value-based policies (`network.head` q or dueling): the base of Ape-X's epsilon
    ladder; env column i of N (over all actors) acts at random with probability
    epsilon ** (1 + epsilon_alpha * i / (N - 1)), else greedily. 0: always greedy."""
    epsilon_alpha: float = 7.0
    """Exponent spread of the epsilon ladder (Ape-X: 7)."""


def request_rows(actors: ActorConfig, agents: int = 1) -> int:
    """The most rows one inference request can carry: a split's columns (its envs x
    `agents` of the policy per env), twice over on a step where a time limit ends
    episodes, whose final observations ride along for bootstrapping (`actors/actor_core.py`)."""
    return 2 * (actors.envs // actors.splits) * agents


@dataclass
class InferenceConfig:
    count: int = 1
    """Number of inference server processes."""
    max_batch: int = 64
    """Most rows one forward pass serves; requests stay whole, so one that would overflow
    a batch starts the next. Must hold the largest request (`request_rows`)."""
    max_wait_ms: float = 0.0
    """After the first request of a batch, wait at most this long for more (zmq polls
    in whole milliseconds, so a fraction of one rounds up). 0: serve what has arrived;
    on CPU with cheap envs waiting cost throughput (bench/README.md, e2e_fps.py)."""
    min_padded_batch: int = 8
    """Smallest padded batch; padded sizes are powers of two from here to max_batch."""
    device: str | int = "auto"
    """Where the servers run: 'auto' (the placement plan's), 'cpu', or a GPU id."""
    device_memory: str | float = "auto"
    """Share of its GPU's memory each server takes: a fraction (0, 1], 'on_demand' or
    'auto' (the placement plan's)."""
    request_queue: int = 64
    """Requests queued per connection on the inference stream, each way (ZMQ high-water
    mark). An actor has at most `actors.splits` in flight; past the bound its send fails
    and it tries again, a server's reply to a full actor is dropped and sent again later."""
    servers_per_actor: int = 2
    """Servers each actor connects to (0: every one): those of its host first, then the
    others from its index on (`rank % count`), each lost one replaced by the next live one
    (srl_jax/dataflow/fan_in.py). Bounds a server's connections, and the handshakes after
    its restart, to about actors x this / count."""


@dataclass
class LearnerConfig:
    algorithm: str = "ppo"
    """Learning algorithm: a name in the registry of `srl_jax/dataflow/algorithms.py` (built in:
    'ppo', 'impala', 'dqn', 'r2d2', 'muzero', 'qmix'; more from `plugins`). Its hyperparameters are
    `learner.<name>`."""
    batch_envs: int = 32
    """B: env columns per update, a batch of [T+1, B]; for an algorithm that learns from
    replay (`replay.count`), the transitions sampled per update, [B]."""
    staleness_cap: int = 4
    """Drop samples acted by a policy more than this many versions behind the learner."""
    sample_queue: int = 64
    """Chunks the learner holds before dropping the oldest (counted)."""
    republish_interval_s: float = 1.0
    """Parameters are re-sent at least this often so late joiners catch up."""
    publish_every_updates: int = 1
    """Send new parameters to the servers every this many updates (1: after each). A
    replay learner making hundreds of small updates a second spares most transfers so
    (Ape-X's actors fetched parameters every 400 frames)."""
    param_queue: int = 4
    """Parameter messages queued per inference server, each way (ZMQ high-water mark);
    past it the oldest are not sent: only the newest version matters."""
    devices: int | list[int] = 0
    """Devices to train on, data-parallel: a count per learner process (0: what the
    placement plan gives it, all local devices on a CPU), or a list of this host's
    device ids (split among the host's learner processes). See `srl_jax/runtime/placement.py`."""
    device_memory: str | float = "auto"
    """Share of each of its GPUs' memory a learner process takes: a fraction (0, 1],
    'on_demand' (no preallocation; grows as needed), or 'auto' (the placement plan's)."""
    processes: int = 1
    """Learner processes (one per host) joined by jax.distributed; B is split among them."""
    coordinator_address: str = ""
    """host:port of learner process 0's jax.distributed coordinator ('' : pick one)."""
    normalize_obs: bool = False
    """Normalize observations with running statistics that travel with the parameters."""
    reward_scale: float = 1.0
    """Rewards are multiplied by this before the update."""
    reward_clip: float = 0.0
    """Rewards are clipped to [-c, c] before the update (0: no clipping; Atari: 1)."""
    burn_in: int = 0
    """Recurrent policies: the first K steps of each chunk column only warm up the
    stored state (no loss, no gradient), R2D2's remedy for stale states. Each chunk then
    starts with the last K steps of the one before (which trained on them), so no step is
    lost; at most half of `actors.trajectory_length`. R2D2 sets it, and the chunk length,
    from `learner.r2d2` (its burn-in, trained length and period)."""
    algorithms: dict[str, dict[str, Any]] = field(
        default_factory=dict, metadata={SECTIONS: True})
    """Algorithm sections as written, `learner.<name>: {...}` (e.g. `learner.ppo`), by
    name; `srl_jax.dataflow.algorithms.algorithm_config` builds and checks the chosen one with
    that algorithm's own config class. Not a key of its own in the YAML."""


@dataclass
class NetworkConfig:
    kind: str = "mlp"
    """'mlp' (separate actor and critic MLPs) or 'nature_cnn' (image observations)."""
    hidden: list[int] = field(default_factory=lambda: [64, 64])
    """Hidden layer widths of the actor and the critic MLPs."""
    activation: str = "tanh"
    """Activation function: 'tanh' or 'relu'."""
    core: str = "none"
    """Recurrent core between the torso and the heads: 'none', 'lstm' or 'gru'. With a
    core the MLP torso (`hidden`) is shared by the policy and value heads."""
    core_size: int = 128
    """Units of the recurrent core."""
    conv: str = "auto"
    """How the Nature-CNN's convolutions are computed: 'xla' (XLA's convolution),
    'matmul' (space-to-depth, im2col and matmuls, `learners/models/conv.py`: about 16x faster
    through the update on XLA:CPU) or 'auto' (matmul where the worker's JAX runs on the
    CPU, xla on a GPU or TPU). Both have the same parameters."""
    critic: str = "local"
    """What the value head reads: 'local' (the agent's own observation) or 'global' (a
    centralized critic, as MAPPO's: the env's global state, PettingZoo's `state()`, or
    all agents' observations side by side where the env has none; plus the agent's
    one-hot id where its policy acts for several agents). Multi-agent envs, PPO and
    IMPALA, no recurrent core. Actors carry the state once per env step; the learner
    computes the values from it."""
    critic_own_first: bool = False
    """With `critic: global` over `env.global_state: observations` and one policy for
    every agent: each agent's critic reads the observations from its own on (its own,
    then the next agent's, and round), an agent-centric global state in place of one
    fixed order that only the agent id tells apart."""
    layer_norm: bool = False
    """MAPPO's MLP (Yu et al. 2022, `use_feature_normalization` and its MLP layers): a
    LayerNorm over the inputs and after each hidden layer's activation, in the actor's
    and the critic's MLPs. A centralized critic's inputs span several agents' views at
    several scales; normalized, one step size fits them. 'mlp' actor-critics without a
    recurrent core."""
    head: str = "actor_critic"
    """Which of the algorithm's networks it trains (each algorithm declares its own,
    `srl_jax.dataflow.algorithms.Network`). Built in: 'actor_critic' (policy and value, for
    PPO and IMPALA), 'q' (action values) or 'dueling' (action values as value plus
    advantages, Wang et al. 2016), for DQN and R2D2: a Q head acts greedily, and
    `actors.epsilon` explores; 'muzero': a learned model (representation, dynamics,
    prediction) that acts by search, for MuZero (learners/models/muzero_model.py); 'qmix':
    each agent's recurrent Q network and the monotonic mixer of a team's, for QMIX
    (learners/models/mixer.py)."""


@dataclass
class ReplayConfig:
    count: int = 0
    """Replay servers per policy (each its own process); an algorithm that learns from
    replay (dqn) needs at least 1, one that learns from fresh samples 0. Actors spread
    their chunks over them; the learner samples from all of them."""
    capacity: int = 100_000
    """Transitions each replay server holds; the oldest are overwritten first."""
    min_size: int = 1_000
    """Transitions a replay server holds before it serves its first sample."""
    samples_per_insert: float = 8.0
    """Transitions sampled per transition inserted, held by each server (Reverb's
    SampleToInsertRatio): whichever side runs ahead waits. 0: no rate control."""
    tolerance: float = 0.1
    """How far sampling may run ahead of or behind the ratio, as Acme's tolerance rate:
    min_size * tolerance * samples_per_insert samples either way (plus one batch or
    one chunk, the units it moves in)."""
    priority_exponent: float = 0.6
    """alpha of prioritized replay: transitions are sampled in proportion to
    priority ** alpha (0: uniform)."""
    importance_exponent: float = 0.4
    """beta: the loss weights transitions by (N * P(i)) ** -beta, normalized by the
    batch's largest weight (0: unweighted)."""
    batches_per_request: int = 1
    """Batches the learner draws from each server in one request, and updates whose new
    priorities go back in one message: k updates share a round trip, and their batches
    are drawn with priorities up to k updates old (Ape-X's learner samples ahead too).
    More than 1 where an update costs about as much as a round trip (small networks on
    CPU); each batch still spans the whole priority range."""
    initial_priority: Literal["actor", "max"] = "max"
    """A new transition's priority: `actor`, its n-step TD error as the actor computes it
    from the acting network's Q-values (Ape-X: with many actors, max-priority
    initialisation focuses on the newest data), which the inference server's replies then
    carry; `max`, the largest priority seen (Schaul et al. 2016)."""


@dataclass
class StopConfig:
    env_frames: int = 0
    """Stop after this many env frames (0: no limit)."""
    wall_time_s: float = 0.0
    """Stop after this many seconds (0: no limit)."""
    target_return: float | None = None
    """Stop once `episode_return_mean` of a metrics window reaches this."""
    target_eval_return: float | None = None
    """Stop once an evaluation's `eval_return_mean` reaches this (needs the evaluator)."""
    policy: str | None = None
    """A multi-agent run: the policy whose own return (`policy/<name>/episode_return_mean`,
    `policy/<name>/eval_return_mean`) the targets are read from, e.g. the side of a
    competitive game that should win. None: every policy's own return must reach them
    (with one policy: its agents' mean return, as `episode_return_mean`)."""


@dataclass
class EvaluationConfig:
    every_updates: int = 0
    """Evaluate the latest parameters every this many learner updates (0: no evaluator)."""
    episodes: int = 5
    """Deterministic episodes per evaluation; `eval_return_mean` is their mean."""
    device: str | int = "auto"
    """Where the evaluator runs: 'auto' (the placement plan's), 'cpu', or a GPU id."""
    device_memory: str | float = "auto"
    """Share of its GPU's memory the evaluator takes: a fraction (0, 1], 'on_demand' or
    'auto' (the placement plan's)."""


@dataclass
class PopulationConfig:
    members: int = 0
    """Members trained side by side, each a whole pipeline of its own (learner, inference
    servers, actors, sized by the rest of the config) under the policy name m0, m1, ...;
    0: no population."""
    explore: dict[str, Any] = field(default_factory=dict)
    """Live hyperparameters to explore (`learner.<algorithm>.<name>`, one of the
    algorithm's `live` ones) and how to draw one: `{log_uniform: [lo, hi]}`,
    `{uniform: [lo, hi]}`, or a list of choices. Members start from a draw each."""
    initial: dict[str, list[float]] = field(default_factory=dict)
    """Start values per member (a list of `members` values) for a key, instead of a draw."""
    exploit: bool = True
    """Copy winners into losers at their ready points (false: a sweep, fixed values)."""
    ready_after_updates: int = 50
    """A member is ranked again after this many updates since its last change."""
    window: int = 10
    """Metrics rows whose member return since its last change (its evaluation return,
    when the evaluator runs) make its score."""
    exploit_fraction: float = 0.2
    """A ready member in the bottom fraction copies one of the top fraction (Jaderberg et
    al. 2017: the bottom and top 20%)."""
    perturb: list[float] = field(default_factory=lambda: [0.8, 1.2])
    """Explore: each explored value is multiplied by one of these, drawn at random, and
    kept inside its `explore` range (a 0 moves by the factor less 1 of the range; a listed
    value steps to the next choice up or down) ..."""
    resample_probability: float = 0.25
    """... or, with this probability, drawn anew from its `explore` spec."""
    seed: int = 0
    """Seed of the draws and the exploit choices (with the run's `seed`)."""


@dataclass
class SelfPlayConfig:
    frozen: list[str] = field(default_factory=list)
    """Policies of `env.policies` that only act: no learner trains them, actors send them
    no chunks. One not in `opponents` acts with version 0 (the seed's parameters) forever."""
    opponents: dict[str, str] = field(default_factory=dict)
    """Frozen policy -> the trained policy whose snapshots it plays: each episode (per env)
    the actor draws one of the snapshot pool, and the frozen agents act with it."""
    snapshot_every: int = 10
    """A trained policy of `opponents` adds its parameters to its pool every this many
    versions (version 0, the seed's, first)."""
    pool: int = 8
    """Snapshots a pool keeps: the newest ones (saved under the policy's checkpoints'
    `pool/`, so a restarted learner keeps its pool)."""


@dataclass
class ExperimentConfig:
    name: str = "experiment"
    """Experiment name; the run directory defaults to runs/<name>/<timestamp>/."""
    seed: int = 0
    """Seed for parameters, environments and action sampling."""
    plugins: list[str] = field(default_factory=list)
    """Modules imported (by the launcher and by every worker process) before the config
    is checked: importing one registers what it adds, e.g. an algorithm
    (`srl_jax.dataflow.algorithms.register`). Every process imports them, actors included."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """Environment."""
    actors: ActorConfig = field(default_factory=ActorConfig)
    """Actor workers and their env ring."""
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    """Inference servers."""
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    """Learner and algorithm."""
    network: NetworkConfig = field(default_factory=NetworkConfig)
    """Actor-critic network."""
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    """Replay servers, for algorithms that learn from replay (off-policy)."""
    stop: StopConfig = field(default_factory=StopConfig)
    """Stop condition; the first limit reached ends the run."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Learner checkpoints: how often, how many kept."""
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    """An evaluator worker playing deterministic episodes with the latest parameters."""
    population: PopulationConfig = field(default_factory=PopulationConfig)
    """Population-based training, or a sweep: several members trained side by side."""
    selfplay: SelfPlayConfig = field(default_factory=SelfPlayConfig)
    """Frozen policies and the opponent pools they play from (multi-agent envs)."""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    """Heartbeats, restarts, logging."""
    transport: TransportConfig = field(default_factory=TransportConfig)
    """Where sockets bind and whether they authenticate."""
    ray: RayConfig = field(default_factory=RayConfig)
    """Placement on a Ray cluster (`--backend ray`)."""
