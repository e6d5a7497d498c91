"""Per-section checks of an experiment config that need neither an environment nor JAX.

`validate` rejects what cannot run before a single worker starts, each message
one line naming the key. Checks that must build or import an environment live
with the actors (`actors.envs.check_env_id`), and each algorithm checks its own
section (`srl_jax/dataflow/algorithms.py`); the launcher runs all three.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from srl_jax.config.checkpoint_location import BUCKET_SCHEMES, location_problem
from srl_jax.config.env_families import backends, families, family_of, implementation_name
from srl_jax.config.schema import (
    CONVS,
    CORES,
    CRITICS,
    DEFAULT_BACKEND,
    NAME_SERVICES,
    NETWORKS,
    POLICY_NAME,
    RESERVED_POLICY_NAMES,
    ConfigError,
    ExperimentConfig,
    NetworkConfig,
    policy_names,
    request_rows,
)
from srl_jax.wire.shm.bell import MAX_SLOTS
from srl_jax.wire.shm.layout import REQUEST_SLOTS
from srl_jax.wire.transport import is_loopback

RAY_AUTH_MODE = "RAY_AUTH_MODE"
"""Ray's switch for its token authentication ('token': on, the default of Ray 2.60 for a
new local instance; 'disabled': off)."""


def require(condition: bool, message: str) -> None:
    """ConfigError(`message`) unless `condition`."""
    if not condition:
        raise ConfigError(message)


def validate(config: ExperimentConfig) -> None:
    """Reject configs that cannot run; each message names the offending key."""
    require(config.seed >= 0, "'seed' must not be negative (numpy and gymnasium refuse it)")
    for check in (check_env, check_actors, check_inference, check_learner, check_replay,
                  check_network, check_stop, check_checkpoint, check_runtime, check_ray,
                  check_placement_keys, check_selfplay):
        check(config)


def check_env(config: ExperimentConfig) -> None:
    env = config.env
    known = backends()
    require(env.backend in known,
            f"'env.backend': unknown '{env.backend}' (known: {', '.join(known)})")
    implementation_name(env)  # ConfigError unless the family steps with this backend
    if family_of(env).multi_agent:
        for name, patterns in env.policies.items():
            require(bool(POLICY_NAME.fullmatch(str(name))) and name not in RESERVED_POLICY_NAMES,
                    f"'env.policies': policy name '{name}' must start with a letter, hold only "
                    f"letters, digits or _, and not be {' or '.join(RESERVED_POLICY_NAMES)}")
            require(isinstance(patterns, list) and bool(patterns)
                    and all(isinstance(p, str) for p in patterns),
                    f"'env.policies.{name}' must be a list of agent name patterns")
        require(not config.actors.inline_inference,
                "'actors.inline_inference' is for single-agent environments")
        require(not env.mask_obs, "'env.mask_obs' is for single-agent gymnasium environments")
    elif env.policies:
        ids = ", ".join(f"'{pattern}'" for family in families() if family.multi_agent
                        for pattern in family.ids)
        raise ConfigError(f"'env.policies' is for multi-agent environments ({ids})")
    require(not env.mask_obs or env.backend == DEFAULT_BACKEND,
            "'env.mask_obs' is applied by gymnasium envs: it needs 'env.backend' gymnasium")
    atari = env.atari
    require(atari.noop_max >= 0, "'env.atari.noop_max' must not be negative")
    require(atari.frame_skip >= 1, "'env.atari.frame_skip' must be at least 1")
    require(atari.frame_stack >= 1, "'env.atari.frame_stack' must be at least 1")
    require(0 <= atari.sticky_actions <= 1, "'env.atari.sticky_actions' must be in [0, 1]")


def check_actors(config: ExperimentConfig) -> None:
    actors = config.actors
    require(actors.count >= 1, f"'actors.count' must be at least 1, got {actors.count}")
    require(actors.envs >= 1, f"'actors.envs' must be at least 1, got {actors.envs}")
    require(actors.splits >= 1, f"'actors.splits' must be at least 1, got {actors.splits}")
    require(actors.envs % actors.splits == 0,
            f"'actors.splits' ({actors.splits}) must divide 'actors.envs' ({actors.envs})")
    require(actors.trajectory_length >= 1, "'actors.trajectory_length' must be at least 1")
    require(actors.inference_timeout_s > 0, "'actors.inference_timeout_s' must be positive")
    require(actors.send_policy in ("block", "drop"),
            f"'actors.send_policy' must be 'block' or 'drop', got '{actors.send_policy}'")
    require(actors.send_queue >= 1, "'actors.send_queue' must be at least 1")
    require(actors.send_queue <= MAX_SLOTS and REQUEST_SLOTS * actors.splits <= MAX_SLOTS,
            f"'actors.send_queue' and {REQUEST_SLOTS} x 'actors.splits' must be at most "
            f"{MAX_SLOTS}: a shared-memory doorbell names a slot in 16 bits")


def check_inference(config: ExperimentConfig) -> None:
    actors, inference = config.actors, config.inference
    require(inference.count >= 1 or actors.inline_inference,
            f"'inference.count' must be at least 1 (or actors.inline_inference true), "
            f"got {inference.count}")
    require(inference.max_wait_ms >= 0, "'inference.max_wait_ms' must not be negative")
    require(inference.min_padded_batch >= 1, "'inference.min_padded_batch' must be at least 1")
    require(inference.request_queue >= 1, "'inference.request_queue' must be at least 1")
    require(inference.servers_per_actor >= 0, "'inference.servers_per_actor' must be 0 "
            f"(every server) or more, got {inference.servers_per_actor}")
    check_request_rows(config)


def check_request_rows(config: ExperimentConfig, agents: int = 1,
                       policy: str | None = None) -> None:
    """`inference.max_batch` holds the largest request of `policy`'s `agents` per env
    (before launch, `actors.envs.check_policies` asks again with each policy's agents).
    With inline inference no server batches, and the actor compiles its own sizes."""
    if config.actors.inline_inference:
        return
    rows, max_batch = request_rows(config.actors, agents), config.inference.max_batch
    split = config.actors.envs // config.actors.splits
    columns = (f"{split} envs a split x {agents} agents" if policy
               else f"{split} envs a split (actors.envs / actors.splits)")
    require(max_batch >= rows,
            f"'inference.max_batch' ({max_batch}) must hold the {rows} rows of one request"
            f"{f' for policy {policy!r}' if policy else ''}: {columns}, twice over when a "
            f"time limit ends episodes (their final observations ride along)")


def check_learner(config: ExperimentConfig) -> None:
    """The learner's batch and processes; its algorithm section is the algorithm's to check."""
    learner = config.learner
    split_size = config.actors.envs // config.actors.splits
    require(bool(learner.algorithm), "'learner.algorithm' must name an algorithm")
    if isinstance(learner.devices, list):
        require(bool(learner.devices), "'learner.devices' must list at least one device id")
        require(min(learner.devices) >= 0 and len(set(learner.devices)) == len(learner.devices),
                f"'learner.devices' {learner.devices} must list distinct device ids (0 and up)")
        per_process = len(learner.devices)
    else:
        require(learner.devices >= 0, "'learner.devices' must not be negative")
        per_process = learner.devices
    require(per_process == 0 or learner.batch_envs % per_process == 0,
            f"'learner.batch_envs' ({learner.batch_envs}) must divide evenly over "
            f"'learner.devices' ({learner.devices})")
    require(learner.reward_scale > 0, "'learner.reward_scale' must be positive")
    require(learner.reward_clip >= 0, "'learner.reward_clip' must not be negative")
    require(learner.batch_envs >= 1, "'learner.batch_envs' must be at least 1")
    require(learner.processes >= 1, "'learner.processes' must be at least 1")
    require(learner.param_queue >= 1, "'learner.param_queue' must be at least 1")
    require(learner.publish_every_updates >= 1,
            "'learner.publish_every_updates' must be at least 1")
    if config.replay.count:  # the batch is sampled rows, not whole chunks (check_replay)
        return
    require(learner.batch_envs % (split_size * learner.processes) == 0,
            f"'learner.batch_envs' ({learner.batch_envs}) must be a multiple of the split size "
            f"{split_size} (actors.envs / actors.splits: actors send one chunk per split) "
            f"times 'learner.processes' ({learner.processes})")
    require(learner.staleness_cap >= 0, "'learner.staleness_cap' must not be negative")
    require(learner.sample_queue * split_size * learner.processes >= learner.batch_envs,
            f"'learner.sample_queue' ({learner.sample_queue}) chunks cannot hold one batch of "
            f"{learner.batch_envs} envs")


def check_replay(config: ExperimentConfig) -> None:
    """Replay servers, their rate control and priorities; the epsilon ladder."""
    replay, learner, actors = config.replay, config.learner, config.actors
    require(0 <= actors.epsilon <= 1, "'actors.epsilon' must be in [0, 1]")
    require(actors.epsilon_alpha >= 0, "'actors.epsilon_alpha' must not be negative")
    require(replay.count >= 0, "'replay.count' must not be negative")
    if not replay.count:
        return
    chunk_steps = actors.trajectory_length * (actors.envs // actors.splits)
    require(replay.capacity >= chunk_steps,
            f"'replay.capacity' ({replay.capacity}) must hold one chunk of {chunk_steps} "
            "transitions (actors.trajectory_length x actors.envs / actors.splits)")
    require(1 <= replay.min_size <= replay.capacity,
            f"'replay.min_size' must be in [1, replay.capacity], got {replay.min_size}")
    require(replay.samples_per_insert >= 0, "'replay.samples_per_insert' must not be negative")
    require(replay.tolerance >= 0, "'replay.tolerance' must not be negative")
    require(replay.batches_per_request >= 1, "'replay.batches_per_request' must be at least 1")
    require(replay.priority_exponent >= 0, "'replay.priority_exponent' must not be negative")
    require(replay.importance_exponent >= 0,
            "'replay.importance_exponent' must not be negative")
    local_envs = learner.batch_envs // learner.processes
    require(learner.batch_envs % learner.processes == 0 and local_envs % replay.count == 0,
            f"'learner.batch_envs' ({learner.batch_envs}) sampled rows must split evenly over "
            f"'learner.processes' ({learner.processes}) and then over 'replay.count' "
            f"({replay.count}): each learner process asks each server for an equal part")


def check_network(config: ExperimentConfig) -> None:
    network = config.network
    require(network.kind in NETWORKS,
            f"'network.kind': unknown '{network.kind}' (known: {', '.join(NETWORKS)})")
    require(not (network.kind == "nature_cnn" and config.learner.normalize_obs),
            "'learner.normalize_obs' is for vector observations; 'nature_cnn' scales pixels "
            "itself")
    require(len(network.hidden) >= 1, "'network.hidden' needs at least one layer")
    require(all(h >= 1 for h in network.hidden), "'network.hidden' widths must be >= 1")
    require(network.activation in ("tanh", "relu"),
            f"'network.activation' must be 'tanh' or 'relu', got '{network.activation}'")
    require(network.core in CORES,
            f"'network.core': unknown '{network.core}' (known: {', '.join(CORES)})")
    require(network.core_size >= 1, "'network.core_size' must be at least 1")
    require(network.conv in CONVS,
            f"'network.conv': unknown '{network.conv}' (known: {', '.join(CONVS)})")
    require(network.critic in CRITICS,
            f"'network.critic': unknown '{network.critic}' (known: {', '.join(CRITICS)})")
    if network.critic == "global":
        require(family_of(config.env).multi_agent,
                "'network.critic': 'global' reads a multi-agent env's global state; "
                f"'{config.env.id}' is a single-agent env")
    if network.critic_own_first:
        require(network.critic == "global" and config.env.global_state == "observations"
                and not config.env.policies,
                "'network.critic_own_first' turns a global state of every agent's "
                "observation to each agent: it needs 'network.critic' global, "
                "'env.global_state' observations and one policy for every agent "
                "(no 'env.policies')")
    require(config.learner.burn_in >= 0, "'learner.burn_in' must not be negative")


def check_fixed_cnn_layers(network: NetworkConfig) -> None:
    """The Nature-CNN's layers are fixed: a network built on it refuses `hidden` and
    `activation` (a network that reads them beside the CNN, as MuZero's, does not call this)."""
    if network.kind == "nature_cnn":
        for key in ("hidden", "activation"):
            require(getattr(network, key) == getattr(NetworkConfig(), key),
                    f"'network.{key}' is not used by 'nature_cnn' (its layers are fixed); "
                    f"leave it unset")


def check_stop(config: ExperimentConfig) -> None:
    """The stop condition, and the evaluator that `stop.target_eval_return` needs."""
    stop, evaluation = config.stop, config.evaluation
    require(stop.env_frames >= 0, "'stop.env_frames' must not be negative")
    require(stop.wall_time_s >= 0, "'stop.wall_time_s' must not be negative")
    require(stop.env_frames > 0 or stop.wall_time_s > 0 or stop.target_return is not None
            or stop.target_eval_return is not None,
            "'stop' needs at least one of env_frames, wall_time_s, target_return or "
            "target_eval_return")
    require(stop.target_eval_return is None or evaluation.every_updates > 0,
            "'stop.target_eval_return' needs the evaluator: set 'evaluation.every_updates'")
    if stop.policy is not None:
        require(not config.population.members, "'stop.policy': a population stops when "
                "every member reaches the target; there is no policy to choose")
        require(family_of(config.env).multi_agent, "'stop.policy' chooses among a multi-agent "
                "run's policies; a single-agent run has one return")
        known = policy_names(config.env)
        require(stop.policy in known, f"'stop.policy': no policy '{stop.policy}' "
                                      f"(env.policies: {', '.join(known)})")
    require(evaluation.every_updates >= 0, "'evaluation.every_updates' must not be negative")
    require(evaluation.episodes >= 1, "'evaluation.episodes' must be at least 1")


def check_checkpoint(config: ExperimentConfig) -> None:
    checkpoint = config.checkpoint
    require(checkpoint.interval_s >= 0, "'checkpoint.interval_s' must not be negative")
    require(checkpoint.every_updates >= 0, "'checkpoint.every_updates' must not be negative")
    require(checkpoint.keep >= 1, f"'checkpoint.keep' must be at least 1, got {checkpoint.keep}")
    require(checkpoint.final_save_timeout_s > 0,
            "'checkpoint.final_save_timeout_s' must be positive")
    problem = location_problem(checkpoint.dir)
    require(problem is None, f"'checkpoint.dir': {problem}")


def check_runtime(config: ExperimentConfig) -> None:
    """Heartbeats, restarts, message bounds and where sockets bind."""
    runtime = config.runtime
    require(runtime.log_interval_s > 0, "'runtime.log_interval_s' must be positive")
    require(runtime.stats_interval_s > 0, "'runtime.stats_interval_s' must be positive")
    require(runtime.stats_queue >= 1, "'runtime.stats_queue' must be at least 1")
    require(runtime.max_restarts >= 0, "'runtime.max_restarts' must not be negative")
    require(runtime.param_fanout >= 1, "'runtime.param_fanout' must be at least 1")
    require(runtime.max_message_mb > 0, "'runtime.max_message_mb' must be positive")
    require(runtime.stall_timeout_s >= 0, "'runtime.stall_timeout_s' must not be negative")
    require(runtime.busy_timeout_s >= 0, "'runtime.busy_timeout_s' must not be negative")
    require(bool(config.transport.bind_host), "'transport.bind_host' must not be empty")
    require(config.transport.shared_memory in ("auto", "on", "off"),
            f"'transport.shared_memory' must be auto, on or off, got "
            f"{config.transport.shared_memory!r}")
    require(runtime.names in NAME_SERVICES,
            f"'runtime.names': unknown '{runtime.names}' (known: {', '.join(NAME_SERVICES)})")
    coordinator = config.learner.coordinator_address.rpartition(":")[0]
    require(config.learner.processes == 1 or not coordinator or is_loopback(coordinator)
            or config.transport.allow_unauthenticated,
            f"'learner.coordinator_address' {config.learner.coordinator_address}: the "
            f"jax.distributed coordinator has no authentication; bind it to loopback or set "
            f"'transport.allow_unauthenticated: true' (a network you trust)")


def check_exposure(config: ExperimentConfig, backend: str, ray_address: str,
                   environ: Mapping[str, str]) -> None:
    """Refuse a run whose coordinator or local Ray instance would listen off loopback
    unauthenticated, unless `transport.allow_unauthenticated` says so; it needs the
    backend and the launcher's environment, which `validate` does not see."""
    if backend != "ray" or config.transport.allow_unauthenticated:
        return
    opt_in = "set 'transport.allow_unauthenticated: true' (a network you trust)"
    require(config.learner.processes == 1 or not spans_hosts(config, backend, ray_address),
            f"'learner.processes' {config.learner.processes} across a Ray cluster: the "
            f"jax.distributed coordinator (gRPC, no authentication) would listen on the "
            f"network; {opt_in}")
    mode = environ.get(RAY_AUTH_MODE, "token")
    require(spans_hosts(config, backend, ray_address) or mode.lower() == "token",
            f"{RAY_AUTH_MODE}={mode}: the local Ray instance would listen on every interface "
            f"without token authentication; unset it or {opt_in}")


def spans_hosts(config: ExperimentConfig, backend: str, ray_address: str) -> bool:
    """Whether the run's workers may be placed on several hosts: on a Ray cluster given by
    address (a local Ray instance, like the local backend, is this host alone)."""
    return backend == "ray" and bool(ray_address or config.ray.address)


def check_checkpoint_hosts(config: ExperimentConfig, backend: str, ray_address: str) -> None:
    """Learners that may run on several hosts checkpoint where every one of them sees the
    steps: orbax writes each step from a learner's first process alone, and after a restart
    every process restores the newest one; a population's loser loads its donor's."""
    checkpoint, processes = config.checkpoint, config.learner.processes
    members = config.population.members if config.population.exploit else 0
    if (processes == 1 and not members) or not checkpoint.enabled or checkpoint.shared or \
            urlsplit(checkpoint.dir).scheme in BUCKET_SCHEMES or \
            not spans_hosts(config, backend, ray_address):
        return
    where = f"'{checkpoint.dir}'" if checkpoint.dir else "'' (the run directory)"
    who, what = (f"'learner.processes' {processes}", "the checkpoints they all restore") \
        if processes > 1 else (f"the learners of 'population.members' {members}",
                               "the donors' checkpoints the losers copy")
    raise ConfigError(
        f"'checkpoint.dir' {where} is on one host's disk, but {who} may run on several hosts "
        f"of the Ray cluster, and only one host's disk would hold {what}: give a bucket "
        f"(gs://... or s3://...), or set 'checkpoint.shared: true' if every learner host "
        f"mounts it at the same path")


def check_ray(config: ExperimentConfig) -> None:
    for kind in ("actor", "learner", "inference", "evaluator", "replay"):
        resources = getattr(config.ray, kind)
        require(all(amount >= 0 for amount in resources.values()),
                f"'ray.{kind}': resource amounts must not be negative")
    require(config.ray.placement_timeout_s > 0, "'ray.placement_timeout_s' must be positive")


def _check_memory_share(key: str, value: str | float) -> None:
    if isinstance(value, str):
        require(value in ("auto", "on_demand"),
                f"'{key}' must be a fraction in (0, 1], 'on_demand' or 'auto', got {value!r}")
    else:
        require(0 < value <= 1, f"'{key}' must be a fraction in (0, 1], got {value:g}")


def check_placement_keys(config: ExperimentConfig) -> None:
    """The placement keys' own values; what the host can give is srl_jax.runtime.placement's."""
    _check_memory_share("learner.device_memory", config.learner.device_memory)
    for section in ("inference", "evaluation"):
        keys = getattr(config, section)
        if isinstance(keys.device, str):
            require(keys.device in ("auto", "cpu"), f"'{section}.device' must be 'auto', "
                    f"'cpu' or a GPU id, got {keys.device!r}")
        else:
            require(keys.device >= 0, f"'{section}.device' must not be negative")
        _check_memory_share(f"{section}.device_memory", keys.device_memory)


def check_selfplay(config: ExperimentConfig) -> None:
    """Frozen policies name policies of `env.policies`, at least one policy trains, and
    each opponent pool is drawn from a trained policy."""
    selfplay = config.selfplay
    require(selfplay.snapshot_every >= 1, "'selfplay.snapshot_every' must be at least 1")
    require(selfplay.pool >= 1, "'selfplay.pool' must be at least 1")
    if not (selfplay.frozen or selfplay.opponents):
        return
    policies = list(config.env.policies)
    require(family_of(config.env).multi_agent and bool(policies),
            "'selfplay' needs a multi-agent env with named policies ('env.policies')")
    require(not config.population.members, "'selfplay' and 'population' do not mix")
    for name in selfplay.frozen:
        require(name in policies, f"'selfplay.frozen': unknown policy '{name}' (policies: "
                                  f"{', '.join(policies)})")
    require(len(set(selfplay.frozen)) == len(selfplay.frozen),
            "'selfplay.frozen' lists a policy twice")
    trained = [name for name in policies if name not in selfplay.frozen]
    require(bool(trained), "'selfplay.frozen': every policy is frozen; at least one must train")
    for frozen, source in selfplay.opponents.items():
        require(frozen in selfplay.frozen, f"'selfplay.opponents': '{frozen}' is not a frozen "
                                           f"policy (selfplay.frozen: {selfplay.frozen})")
        require(source in trained, f"'selfplay.opponents.{frozen}': '{source}' is no trained "
                                   f"policy (trained: {', '.join(trained)})")
    require(not config.evaluation.every_updates,
            "'evaluation.every_updates': the evaluator does not play frozen policies "
            "('selfplay.frozen') yet; set it to 0")
