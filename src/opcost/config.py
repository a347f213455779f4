"""The study configuration: schema validation with defaults, then semantic checks.

``load_study`` is what the Snakefile calls when the workflow loads, so a bad config fails
before any job starts, with a message that names the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from opcost.names import MODES, ModelInput, NameError_, Setting, check_name, parse_setting

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"
_IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


class ConfigError(ValueError):
    """The config is invalid; the message names the field."""


@dataclass(frozen=True)
class GpuConfig:
    """A GPU plus its numeric settings (TF32 on/off, dtype) and the GPU settings to profile."""

    name: str
    device: str
    tf32: bool
    dtype: str
    settings: tuple[Setting, ...]
    slurm_gpu_model: str | None
    slurm_constraint: str | None


@dataclass(frozen=True)
class Study:
    model_inputs: tuple[ModelInput, ...]
    modes: tuple[str, ...]
    gpus: dict[str, GpuConfig]
    config: dict[str, Any]

    def model_input(self, name: str) -> ModelInput:
        for mi in self.model_inputs:
            if mi.name == name:
                return mi
        raise KeyError(name)


@cache
def load_schema(path: Path = SCHEMA_PATH) -> dict[str, Any]:
    with open(path) as f:
        return yaml.safe_load(f)


def _with_defaults(validator_class):
    """A validator that fills in defaults, as Snakemake's ``validate(set_default=True)``."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for prop, sub in properties.items():
                if "default" in sub and prop not in instance:
                    instance[prop] = _copy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


def _copy(value: Any) -> Any:
    return yaml.safe_load(yaml.safe_dump(value))


def _field(path) -> str:
    return ".".join(str(p) for p in path) or "<top level>"


def validate_config(config: dict[str, Any], schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """Check ``config`` against the JSON schema, filling in defaults in place."""
    schema = schema or load_schema()
    validator = _with_defaults(jsonschema.Draft202012Validator)(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.path))
    if errors:
        lines = [f"  {_field(e.path)}: {e.message}" for e in errors]
        raise ConfigError("invalid config:\n" + "\n".join(lines))
    # Nested defaults inside additionalProperties (the GPU configurations) are filled by a
    # second pass, once the parent objects exist.
    validator.validate(config)
    return config


@cache
def _torchvision_models() -> frozenset[str]:
    import torchvision

    return frozenset(torchvision.models.list_models())


def load_study(config: dict[str, Any], *, check_models: bool = True) -> Study:
    """Validate a config (schema, then meaning) and return the study it describes.

    Raises:
        ConfigError: naming the field, for a misspelt key, a wrong type, an unsafe name, an
            unknown model, a malformed input shape or GPU setting, or a duplicate
            model-input set.
    """
    validate_config(config)
    model_inputs: list[ModelInput] = []
    seen: dict[str, str] = {}
    for i, entry in enumerate(config["models"]):
        model = entry["model"]
        where = f"models.{i}.model"
        if ":" in model:
            if not _IMPORT_PATH.fullmatch(model):
                raise ConfigError(
                    f"{where}: {model!r} is not an import path package.module:factory"
                )
        elif check_models and model not in _torchvision_models():
            raise ConfigError(
                f"{where}: unknown model {model!r}; use a torchvision model name "
                "(torchvision.models.list_models()) or an import path package.module:factory"
            )
        for j, shape in enumerate(entry["inputs"]):
            swhere = f"models.{i}.inputs.{j}"
            if ":" not in model and len(shape) != 4:
                raise ConfigError(
                    f"{swhere}: torchvision models take (batch, channels, height, width), "
                    f"got {shape}"
                )
            try:
                mi = ModelInput(model, tuple(int(d) for d in shape))
                name = mi.name
            except NameError_ as e:
                raise ConfigError(f"{where}: {e}") from e
            if name in seen:
                raise ConfigError(f"{swhere}: duplicate model-input set {name} (also {seen[name]})")
            seen[name] = swhere
            model_inputs.append(mi)
    gpus: dict[str, GpuConfig] = {}
    for name, g in config["gpus"].items():
        try:
            check_name(name, f"gpus.{name}")
        except NameError_ as e:
            raise ConfigError(str(e)) from e
        settings = []
        for k, text in enumerate(g["settings"]):
            try:
                settings.append(parse_setting(text))
            except ValueError as e:
                raise ConfigError(f"gpus.{name}.settings.{k}: {e}") from e
        for key in ("slurm_gpu_model", "slurm_constraint"):
            value = g.get(key)
            if value is not None:
                try:
                    check_name(value, f"gpus.{name}.{key}")
                except NameError_ as e:
                    raise ConfigError(str(e)) from e
        gpus[name] = GpuConfig(
            name=name,
            device=g["device"],
            tf32=g["tf32"],
            dtype=g["dtype"],
            settings=tuple(settings),
            slurm_gpu_model=g.get("slurm_gpu_model"),
            slurm_constraint=g.get("slurm_constraint"),
        )
    modes = tuple(m for m in MODES if m in config["modes"])
    return Study(tuple(model_inputs), modes, gpus, config)


def load_study_file(path: str | Path, **kwargs: Any) -> Study:
    with open(path) as f:
        config = yaml.safe_load(f) or {}
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: the config must be a mapping")
    return load_study(config, **kwargs)
