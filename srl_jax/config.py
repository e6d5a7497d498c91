"""Experiment configuration: typed dataclasses, YAML loading, overrides, validation.

One config describes the whole dataflow graph. Every field has a default and a
docstring; `load_config` turns a YAML file plus `--set key=value` overrides into
an `ExperimentConfig`, and `validate` rejects anything that cannot run before a
single worker starts. Errors are `ConfigError` with one line naming the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ALGORITHMS = ("ppo", "impala")
NETWORKS = ("mlp", "nature_cnn")
ENV_BACKENDS = ("gymnasium", "envpool")
DEFAULT_POLICY = "default"
PETTINGZOO_PREFIX = "pettingzoo:"
POLICY_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
RESERVED_POLICY_NAMES = ("best", "evaluated")
"""Directories of `checkpoints/` that a policy's own checkpoints would collide with."""


def is_pettingzoo(env_id: str) -> bool:
    """Whether `env_id` names a PettingZoo parallel environment ('pettingzoo:<module>')."""
    return env_id.startswith(PETTINGZOO_PREFIX)


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
    PettingZoo parallel environment as 'pettingzoo:<module>' (a module with `parallel_env`)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments passed to `gymnasium.make` (or to PettingZoo's `parallel_env`)."""
    atari: AtariConfig = field(default_factory=AtariConfig)
    """Atari preprocessing (used for 'ALE/...' ids)."""
    backend: str = "gymnasium"
    """How actors step a split: 'gymnasium' (one env object each) or 'envpool' (one C++ batch)."""
    policies: dict[str, list[str]] = field(default_factory=dict)
    """Multi-agent envs: policy name -> patterns (fnmatch) of the agents it acts for; an
    agent goes to the first policy that matches it. Each policy has its own learner and
    inference servers. Empty: one policy, 'default', shared by every agent."""
    agent_id: bool = True
    """Multi-agent envs: append a one-hot of the agent's place among its policy's agents
    to its observations, so that a shared policy can tell its agents apart."""


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


@dataclass
class InferenceConfig:
    count: int = 1
    """Number of inference server processes."""
    max_batch: int = 64
    """Largest number of observations one forward pass serves."""
    max_wait_ms: float = 0.0
    """After the first request of a batch, wait at most this long for more (zmq polls
    in whole milliseconds, so a fraction of one rounds up). 0: serve what has arrived;
    on CPU with cheap envs waiting cost throughput (bench/README.md, e2e_fps.py)."""
    min_padded_batch: int = 8
    """Smallest padded batch; padded sizes are powers of two from here to max_batch."""
    request_queue: int = 64
    """Requests queued per connection on the inference stream, each way (ZMQ high-water
    mark). An actor has at most `actors.splits` in flight; past the bound its send fails
    and it tries again, a server's reply to a full actor is dropped and sent again later."""


@dataclass
class PPOConfig:
    learning_rate: float = 2.5e-4
    """Adam step size."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    clip_coef: float = 0.2
    """PPO ratio clipping."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.01
    """Weight of the entropy bonus."""
    epochs: int = 4
    """Passes over each batch."""
    minibatches: int = 4
    """Minibatches per epoch."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    normalize_advantages: bool = True
    """Normalize advantages per minibatch."""
    clip_value_loss: bool = True
    """Clip the value update around the acting policy's value, as cleanrl does."""
    anneal_lr: bool = False
    """Decay the step size linearly to 0 over the run (needs stop.env_frames)."""
    target_kl: float | None = None
    """Stop an update's remaining epochs once an epoch's approximate KL exceeds this."""


@dataclass
class ImpalaConfig:
    learning_rate: float = 6e-4
    """Adam step size."""
    gamma: float = 0.99
    """Discount factor."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.01
    """Weight of the entropy bonus."""
    rho_bar: float = 1.0
    """Truncation of importance weights in the V-trace targets."""
    c_bar: float = 1.0
    """Truncation of the trace-cutting coefficients."""
    pg_rho_bar: float = 1.0
    """Truncation of importance weights in the policy-gradient advantages."""
    max_grad_norm: float = 40.0
    """Global gradient-norm clip."""
    minibatches: int = 1
    """SGD steps per batch (one pass, split on the env axis)."""


@dataclass
class LearnerConfig:
    algorithm: str = "ppo"
    """Learning algorithm; one file in `learners/`."""
    batch_envs: int = 32
    """B: env columns per update; a batch is [T+1, B]."""
    staleness_cap: int = 4
    """Drop samples acted by a policy more than this many versions behind the learner."""
    sample_queue: int = 64
    """Chunks the learner holds before dropping the oldest (counted)."""
    republish_interval_s: float = 1.0
    """Parameters are re-sent at least this often so late joiners catch up."""
    param_queue: int = 4
    """Parameter messages queued per inference server, each way (ZMQ high-water mark);
    past it the oldest are not sent: only the newest version matters."""
    devices: int = 0
    """Devices per learner process to train on, data-parallel (0: all local ones)."""
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
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """PPO hyperparameters (used when algorithm is 'ppo')."""
    impala: ImpalaConfig = field(default_factory=ImpalaConfig)
    """IMPALA / V-trace hyperparameters (used when algorithm is 'impala')."""


@dataclass
class NetworkConfig:
    kind: str = "mlp"
    """'mlp' (separate actor and critic MLPs) or 'nature_cnn' (image observations)."""
    hidden: list[int] = field(default_factory=lambda: [64, 64])
    """Hidden layer widths of the actor and the critic MLPs."""
    activation: str = "tanh"
    """Activation function: 'tanh' or 'relu'."""


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


@dataclass
class EvaluationConfig:
    every_updates: int = 0
    """Evaluate the latest parameters every this many learner updates (0: no evaluator)."""
    episodes: int = 5
    """Deterministic episodes per evaluation; `eval_return_mean` is their mean."""


@dataclass
class CheckpointConfig:
    enabled: bool = True
    """Write orbax checkpoints of the learner to `<run_dir>/checkpoints/`."""
    interval_s: float = 30.0
    """Seconds between checkpoints (0: not by time)."""
    every_updates: int = 0
    """Also checkpoint every this many learner updates (0: not by updates)."""
    keep: int = 3
    """Newest checkpoints kept; older ones are deleted."""
    keep_best: bool = True
    """Also keep the checkpoint with the best training return, under `checkpoints/best/`."""
    async_save: bool = True
    """Write in a background thread; the learner only waits for the copy off the devices."""
    final_save_timeout_s: float = 120.0
    """On stop, how long the controller waits for the learner's final checkpoint."""


@dataclass
class TransportConfig:
    bind_host: str = "127.0.0.1"
    """Interface every socket binds (a launch backend may give each worker its node's)."""
    advertise_host: str = ""
    """Address peers dial ('': the bind address, or this host's address for 0.0.0.0)."""
    curve: bool | None = None
    """ZMQ CURVE authentication and encryption. null: on unless bound to loopback;
    true (on): always; false (off): never, so a network port is open to whoever reaches
    it (only on a network you trust)."""


def _one_cpu() -> dict[str, float]:
    return {"CPU": 1.0}


@dataclass
class RayConfig:
    address: str = ""
    """The Ray cluster `--backend ray` joins ('': start a local Ray instance, sized to
    hold every worker); `--ray-address` overrides."""
    actor: dict[str, float] = field(default_factory=_one_cpu)
    """Ray resources each actor asks for: CPU, GPU, TPU or a node type's custom
    resource ({CPU: 1, actor_node: 1}). Likewise for the kinds below."""
    learner: dict[str, float] = field(default_factory=_one_cpu)
    inference: dict[str, float] = field(default_factory=_one_cpu)
    evaluator: dict[str, float] = field(default_factory=_one_cpu)
    placement_timeout_s: float = 120.0
    """A worker Ray cannot place this long (no node has its resources) fails the run."""


@dataclass
class RuntimeConfig:
    log_interval_s: float = 1.0
    """Seconds between rows of metrics.jsonl (and status.json rewrites)."""
    stats_interval_s: float = 0.5
    """Seconds between a worker's heartbeats (which carry its counters)."""
    stats_queue: int = 64
    """Heartbeats queued per worker, each way (ZMQ high-water mark); a worker whose
    controller is behind skips heartbeats (each carries running totals) rather than grow."""
    heartbeat_timeout_s: float = 60.0
    """A worker silent this long is killed and restarted (start-up gets twice as long)."""
    busy_timeout_s: float = 1800.0
    """How long a worker blocked in slow device work (an XLA compile, a Nature-CNN
    update on a CPU) keeps heartbeating from a helper thread; past it,
    `heartbeat_timeout_s` applies again (0: never)."""
    max_restarts: int = 3
    """Restarts allowed per worker before the run fails."""
    restart_backoff_s: float = 1.0
    """Delay before the first restart; doubles with each restart of the same worker."""
    max_message_mb: float = 256.0
    """Largest message frame (one array) a worker or the controller accepts; a peer that
    sends a larger one is disconnected before anything is allocated."""
    stall_timeout_s: float = 60.0
    """With no new env frames and no learner step for this long, the controller logs
    who waits on what, again every as long while it lasts (0: never)."""
    stop_grace_s: float = 5.0
    """Seconds workers get to exit after SIGTERM before SIGKILL."""
    compilation_cache_dir: str = "~/.cache/srl_jax/jax"
    """JAX's persistent compilation cache: later runs skip compiling ('' disables it)."""


@dataclass
class ExperimentConfig:
    name: str = "experiment"
    """Experiment name; the run directory defaults to runs/<name>/<timestamp>/."""
    seed: int = 0
    """Seed for parameters, environments and action sampling."""
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
    stop: StopConfig = field(default_factory=StopConfig)
    """Stop condition; the first limit reached ends the run."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Learner checkpoints: how often, how many kept."""
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    """An evaluator worker playing deterministic episodes with the latest parameters."""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    """Heartbeats, restarts, logging."""
    transport: TransportConfig = field(default_factory=TransportConfig)
    """Where sockets bind and whether they authenticate."""
    ray: RayConfig = field(default_factory=RayConfig)
    """Placement on a Ray cluster (`--backend ray`)."""


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`, converting the few safe cases."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(value, option, key)
            except ConfigError as error:
                errors.append(error)
        raise errors[0]
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"'{key}' must be a mapping, got {value!r}")
        return _build(tp, value, key)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"'{key}' must be a list, got {value!r}")
        (item_type,) = typing.get_args(tp)
        return [_convert(v, item_type, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"'{key}' must be a mapping, got {value!r}")
        value_type = typing.get_args(tp)[1]
        if value_type in (bool, int, float, str):  # structured values: their section checks
            return {k: _convert(v, value_type, f"{key}.{k}") for k, v in value.items()}
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"'{key}' must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"'{key}' must be an integer, got {value!r}")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"'{key}' must be a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"'{key}' must be a string, got {value!r}")
    raise ConfigError(f"'{key}' has an unsupported type {_type_name(tp)}")


def _build(cls: type, values: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for name, value in values.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if name not in names:
            close = difflib.get_close_matches(str(name), names, n=1)
            hint = f" (did you mean '{prefix + '.' if prefix else ''}{close[0]}'?)" if close else ""
            raise ConfigError(f"unknown key '{key}'{hint}")
        kwargs[name] = _convert(value, hints[name], key)
    return cls(**kwargs)


def config_from_dict(values: dict[str, Any]) -> ExperimentConfig:
    """Build a typed config from plain data; raises ConfigError."""
    if not isinstance(values, dict):
        raise ConfigError("the config file must hold a mapping at its top level")
    return _build(ExperimentConfig, values)


def config_to_dict(config: ExperimentConfig) -> dict[str, Any]:
    """Plain data for YAML and the wire."""
    return dataclasses.asdict(config)


def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like key=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def apply_overrides(values: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b=value` overrides to plain config data (values parsed as YAML)."""
    for text in overrides:
        path, value = _parse_override(text)
        node = values
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override '{text}': '{part}' is not a section")
            node = child
        node[path[-1]] = value
    return values


def resolve_experiment_path(experiment: str, search_dirs: list[Path]) -> Path:
    """A config name in one of `search_dirs` or a path to a YAML file."""
    candidate = Path(experiment)
    if candidate.suffix in (".yaml", ".yml") and candidate.is_file():
        return candidate
    for directory in search_dirs:
        for suffix in (".yaml", ".yml"):
            path = directory / f"{experiment}{suffix}"
            if path.is_file():
                return path
    known = sorted({p.stem for d in search_dirs if d.is_dir() for p in d.glob("*.y*ml")})
    raise ConfigError(f"unknown experiment '{experiment}' (known: {', '.join(known) or 'none'})")


def load_config(path: Path, overrides: list[str] = ()) -> ExperimentConfig:
    """Read a YAML config, apply overrides, type-check and validate it."""
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        first = str(error).splitlines()[0]
        raise ConfigError(f"{path} is not valid YAML: {first}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{path} must hold a mapping at its top level")
    values.setdefault("name", path.stem)
    config = config_from_dict(apply_overrides(values, list(overrides)))
    validate(config)
    return config


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _validate_multi_agent(config: ExperimentConfig) -> None:
    from actors.multi_agent import check_pettingzoo_id

    check_pettingzoo_id(config.env.id)
    for name, patterns in config.env.policies.items():
        _require(bool(POLICY_NAME.fullmatch(str(name))) and name not in RESERVED_POLICY_NAMES,
                 f"'env.policies': policy name '{name}' must start with a letter, hold only "
                 f"letters, digits or _, and not be {' or '.join(RESERVED_POLICY_NAMES)}")
        _require(isinstance(patterns, list) and bool(patterns)
                 and all(isinstance(p, str) for p in patterns),
                 f"'env.policies.{name}' must be a list of agent name patterns")
    _require(config.env.backend == "gymnasium",
             "'env.backend': PettingZoo environments step with 'gymnasium'")
    _require(not config.actors.inline_inference,
             "'actors.inline_inference' is for single-agent environments")


def validate(config: ExperimentConfig) -> None:
    """Reject configs that cannot run; each message names the offending key."""
    import gymnasium

    from actors.atari import is_atari, register_atari

    if is_atari(config.env.id):
        register_atari(config.env.id)
    if is_pettingzoo(config.env.id):
        _validate_multi_agent(config)
    else:
        _require(not config.env.policies,
                 "'env.policies' is for multi-agent (PettingZoo 'pettingzoo:...') environments")
    env_id = config.env.id
    if not is_pettingzoo(env_id) and ":" in env_id:  # gymnasium's "module:EnvId"
        module, _, env_id = env_id.partition(":")
        try:
            importlib.import_module(module)  # registers the environment
        except Exception as error:
            raise ConfigError(f"'env.id': cannot import '{module}' for '{config.env.id}': "
                              f"{error}") from None
    if not is_pettingzoo(env_id) and env_id not in gymnasium.envs.registry:
        close = difflib.get_close_matches(env_id, list(gymnasium.envs.registry), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"'env.id': unknown gymnasium environment '{env_id}'{hint}")
    _require(config.env.backend in ENV_BACKENDS,
             f"'env.backend': unknown '{config.env.backend}' (known: {', '.join(ENV_BACKENDS)})")
    atari = config.env.atari
    _require(atari.noop_max >= 0, "'env.atari.noop_max' must not be negative")
    _require(atari.frame_skip >= 1, "'env.atari.frame_skip' must be at least 1")
    _require(atari.frame_stack >= 1, "'env.atari.frame_stack' must be at least 1")
    _require(0 <= atari.sticky_actions <= 1, "'env.atari.sticky_actions' must be in [0, 1]")
    actors, inference, learner = config.actors, config.inference, config.learner
    _require(actors.count >= 1, f"'actors.count' must be at least 1, got {actors.count}")
    _require(actors.envs >= 1, f"'actors.envs' must be at least 1, got {actors.envs}")
    _require(actors.splits >= 1, f"'actors.splits' must be at least 1, got {actors.splits}")
    _require(
        actors.envs % actors.splits == 0,
        f"'actors.splits' ({actors.splits}) must divide 'actors.envs' ({actors.envs})",
    )
    _require(actors.trajectory_length >= 1, "'actors.trajectory_length' must be at least 1")
    _require(actors.inference_timeout_s > 0, "'actors.inference_timeout_s' must be positive")
    _require(
        actors.send_policy in ("block", "drop"),
        f"'actors.send_policy' must be 'block' or 'drop', got '{actors.send_policy}'",
    )
    _require(actors.send_queue >= 1, "'actors.send_queue' must be at least 1")
    _require(
        inference.count >= 1 or actors.inline_inference,
        f"'inference.count' must be at least 1 (or actors.inline_inference true), "
        f"got {inference.count}",
    )
    _require(inference.max_wait_ms >= 0, "'inference.max_wait_ms' must not be negative")
    _require(inference.min_padded_batch >= 1, "'inference.min_padded_batch' must be at least 1")
    split_size = actors.envs // actors.splits
    _require(
        inference.max_batch >= split_size,
        f"'inference.max_batch' ({inference.max_batch}) must hold one split of "
        f"{split_size} envs (actors.envs / actors.splits)",
    )
    _require(learner.algorithm in ALGORITHMS,
             f"'learner.algorithm': unknown '{learner.algorithm}' (known: {', '.join(ALGORITHMS)})")
    _require(learner.devices >= 0, "'learner.devices' must not be negative")
    _require(
        learner.devices == 0 or learner.batch_envs % learner.devices == 0,
        f"'learner.batch_envs' ({learner.batch_envs}) must divide evenly over "
        f"'learner.devices' ({learner.devices})",
    )
    _require(learner.reward_scale > 0, "'learner.reward_scale' must be positive")
    _require(learner.reward_clip >= 0, "'learner.reward_clip' must not be negative")
    _require(learner.batch_envs >= 1, "'learner.batch_envs' must be at least 1")
    _require(learner.processes >= 1, "'learner.processes' must be at least 1")
    _require(
        learner.batch_envs % (split_size * learner.processes) == 0,
        f"'learner.batch_envs' ({learner.batch_envs}) must be a multiple of the split size "
        f"{split_size} (actors.envs / actors.splits: actors send one chunk per split) "
        f"times 'learner.processes' ({learner.processes})",
    )
    _require(learner.staleness_cap >= 0, "'learner.staleness_cap' must not be negative")
    _require(
        learner.sample_queue * split_size * learner.processes >= learner.batch_envs,
        f"'learner.sample_queue' ({learner.sample_queue}) chunks cannot hold one batch of "
        f"{learner.batch_envs} envs",
    )
    ppo = learner.ppo
    samples = learner.batch_envs * actors.trajectory_length
    _require(
        not (learner.algorithm == "ppo" and ppo.anneal_lr and config.stop.env_frames == 0),
        "'learner.ppo.anneal_lr' needs 'stop.env_frames' to know the length of the run",
    )
    impala = learner.impala
    _require(
        impala.minibatches >= 1 and learner.batch_envs % impala.minibatches == 0,
        f"'learner.impala.minibatches' ({impala.minibatches}) must divide "
        f"'learner.batch_envs' ({learner.batch_envs})",
    )
    _require(0 < impala.gamma <= 1, "'learner.impala.gamma' must be in (0, 1]")
    _require(impala.learning_rate > 0, "'learner.impala.learning_rate' must be positive")
    _require(impala.max_grad_norm > 0, "'learner.impala.max_grad_norm' must be positive")
    for key in ("rho_bar", "c_bar", "pg_rho_bar"):
        _require(getattr(impala, key) > 0, f"'learner.impala.{key}' must be positive")
    _require(ppo.minibatches >= 1, "'learner.ppo.minibatches' must be at least 1")
    _require(ppo.epochs >= 1, "'learner.ppo.epochs' must be at least 1")
    _require(
        samples % ppo.minibatches == 0,
        f"'learner.ppo.minibatches' ({ppo.minibatches}) must divide the batch of {samples} "
        "samples (learner.batch_envs * actors.trajectory_length)",
    )
    _require(0 < ppo.gamma <= 1, "'learner.ppo.gamma' must be in (0, 1]")
    _require(0 <= ppo.gae_lambda <= 1, "'learner.ppo.gae_lambda' must be in [0, 1]")
    _require(ppo.learning_rate > 0, "'learner.ppo.learning_rate' must be positive")
    _require(config.network.kind in NETWORKS,
             f"'network.kind': unknown '{config.network.kind}' (known: {', '.join(NETWORKS)})")
    _require(not (config.network.kind == "nature_cnn" and learner.normalize_obs),
             "'learner.normalize_obs' is for vector observations; 'nature_cnn' scales pixels "
             "itself")
    _require(len(config.network.hidden) >= 1, "'network.hidden' needs at least one layer")
    _require(all(h >= 1 for h in config.network.hidden), "'network.hidden' widths must be >= 1")
    _require(
        config.network.activation in ("tanh", "relu"),
        f"'network.activation' must be 'tanh' or 'relu', got '{config.network.activation}'",
    )
    stop = config.stop
    _require(stop.env_frames >= 0, "'stop.env_frames' must not be negative")
    _require(stop.wall_time_s >= 0, "'stop.wall_time_s' must not be negative")
    _require(
        stop.env_frames > 0 or stop.wall_time_s > 0 or stop.target_return is not None
        or stop.target_eval_return is not None,
        "'stop' needs at least one of env_frames, wall_time_s, target_return or "
        "target_eval_return",
    )
    _require(stop.target_eval_return is None or config.evaluation.every_updates > 0,
             "'stop.target_eval_return' needs the evaluator: set 'evaluation.every_updates'")
    _require(config.evaluation.every_updates >= 0,
             "'evaluation.every_updates' must not be negative")
    _require(config.evaluation.episodes >= 1, "'evaluation.episodes' must be at least 1")
    checkpoint = config.checkpoint
    _require(checkpoint.interval_s >= 0, "'checkpoint.interval_s' must not be negative")
    _require(checkpoint.every_updates >= 0, "'checkpoint.every_updates' must not be negative")
    _require(checkpoint.keep >= 1, f"'checkpoint.keep' must be at least 1, got {checkpoint.keep}")
    _require(checkpoint.final_save_timeout_s > 0,
             "'checkpoint.final_save_timeout_s' must be positive")
    runtime = config.runtime
    _require(runtime.log_interval_s > 0, "'runtime.log_interval_s' must be positive")
    _require(runtime.stats_interval_s > 0, "'runtime.stats_interval_s' must be positive")
    for key, bound in (("inference.request_queue", config.inference.request_queue),
                       ("learner.param_queue", config.learner.param_queue),
                       ("runtime.stats_queue", runtime.stats_queue)):
        _require(bound >= 1, f"'{key}' must be at least 1")
    _require(runtime.max_restarts >= 0, "'runtime.max_restarts' must not be negative")
    _require(runtime.max_message_mb > 0, "'runtime.max_message_mb' must be positive")
    _require(runtime.stall_timeout_s >= 0, "'runtime.stall_timeout_s' must not be negative")
    _require(runtime.busy_timeout_s >= 0, "'runtime.busy_timeout_s' must not be negative")
    _require(bool(config.transport.bind_host), "'transport.bind_host' must not be empty")
    for kind in ("actor", "learner", "inference", "evaluator"):
        resources = getattr(config.ray, kind)
        _require(all(amount >= 0 for amount in resources.values()),
                 f"'ray.{kind}': resource amounts must not be negative")
    _require(config.ray.placement_timeout_s > 0, "'ray.placement_timeout_s' must be positive")
