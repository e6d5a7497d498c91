"""Experiment configuration loading: YAML, `--set key=value` overrides, plain data.

`load_config` turns a YAML file plus overrides into an `ExperimentConfig`: every
value is checked against its field's type (a wrong type or an unknown key is one
`ConfigError` line, with "did you mean"), the `plugins` are imported, and
`srl_jax.config.checks.validate` runs. `build_dataclass` is the same converter for
sections whose schema lives elsewhere (an algorithm's, under `learner`).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from srl_jax.config.checks import validate
from srl_jax.config.schema import SECTIONS, ConfigError, ExperimentConfig

EXIT_CONFIG = 2
"""The exit code of a run refused for its config, before any worker starts."""
SHIPPED_CONFIGS = Path(__file__).resolve().parent.parent / "configs"
"""The experiments that come with srl_jax: the repository's configs/ (srl_jax/configs links
there) or, installed, the package data that carries them."""


def config_dirs() -> list[Path]:
    """Where experiment names are looked up: ./configs, then the shipped experiments."""
    dirs = [Path.cwd() / "configs", SHIPPED_CONFIGS]
    return list(dict.fromkeys(d.resolve() for d in dirs))


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
    if origin is typing.Literal:
        choices = typing.get_args(tp)
        if isinstance(value, bool) and {"on", "off"} <= set(choices):
            value = "on" if value else "off"  # YAML 1.1 reads a bare on/off as a bool
        if value in choices:
            return value
        raise ConfigError(f"'{key}' must be one of {', '.join(map(str, choices))}, "
                          f"got {value!r}")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"'{key}' must be a mapping, got {value!r}")
        return build_dataclass(tp, value, key)
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


def _sections_field(cls: type) -> str | None:
    """The field of `cls` that gathers its algorithm-style sections (SECTIONS metadata)."""
    return next((f.name for f in dataclasses.fields(cls) if f.metadata.get(SECTIONS)), None)


def build_dataclass(cls: type, values: dict[str, Any], prefix: str = "") -> Any:
    """`cls` built from plain `values`, each converted to its field's type; ConfigError
    with "did you mean" for an unknown key. `prefix` is the section's dotted key."""
    hints = typing.get_type_hints(cls)
    sections = _sections_field(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.name != sections]
    kwargs: dict[str, Any] = {sections: {}} if sections else {}
    for name, value in values.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if name in names:
            kwargs[name] = _convert(value, hints[name], key)
        elif sections and isinstance(value, dict):
            kwargs[sections][str(name)] = dict(value)
        else:
            close = difflib.get_close_matches(str(name), names, n=1)
            hint = f" (did you mean '{prefix + '.' if prefix else ''}{close[0]}'?)" if close else ""
            raise ConfigError(f"unknown key '{key}'{hint}")
    return cls(**kwargs)


def config_from_dict(values: dict[str, Any]) -> ExperimentConfig:
    """Build a typed config from plain data; raises ConfigError."""
    if not isinstance(values, dict):
        raise ConfigError("the config file must hold a mapping at its top level")
    return build_dataclass(ExperimentConfig, values)


def config_to_dict(config: ExperimentConfig) -> dict[str, Any]:
    """Plain data for YAML and the wire; sections are written under their own names."""
    return _to_dict(config)


def _to_dict(value: Any) -> Any:
    if not dataclasses.is_dataclass(value):
        return copy.deepcopy(value)
    sections = _sections_field(type(value))
    data = {f.name: _to_dict(getattr(value, f.name)) for f in dataclasses.fields(value)
            if f.name != sections}
    if sections:
        data.update(_to_dict(getattr(value, sections)))
    return data


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


def load_config(path: Path, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """Read a YAML config, apply overrides, type-check it, import its plugins and check
    every section that needs neither an environment nor an algorithm."""
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        first = str(error).splitlines()[0]
        raise ConfigError(f"{path} is not valid YAML: {first}") from None
    except OSError as error:
        raise ConfigError(f"{path}: {error.strerror or error}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{path} must hold a mapping at its top level")
    values.setdefault("name", path.stem)
    config = config_from_dict(apply_overrides(values, list(overrides)))
    import_plugins(config)
    validate(config)
    return config


def import_plugins(config: ExperimentConfig) -> None:
    """Import the modules of `plugins`, which register what they add; ConfigError if one
    cannot be imported."""
    for i, module in enumerate(config.plugins):
        if "/" in module or module.endswith(".py"):
            raise ConfigError(f"'plugins[{i}]': '{module}' is a path; a plugin is a module "
                              "name, as `import` takes it from the PYTHONPATH (my_package.algo)")
        try:
            importlib.import_module(module)
        except Exception as error:
            first = (str(error).splitlines() or [type(error).__name__])[0]
            raise ConfigError(f"'plugins[{i}]': cannot import '{module}': {first}") from None
