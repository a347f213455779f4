"""The study configuration: schema validation with defaults, then semantic checks.

``load_study`` is what the Snakefile calls when the workflow loads, so a bad config fails
before any job starts, with a message that names the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from opcost.config_opspace import check_op_space
from opcost.errors import ConfigError
from opcost.model_registry import factory_problem, is_torchvision_model
from opcost.names import MODES, ModelInput, NameError_, Setting, check_name, parse_setting

#: The config schema (package data): every key, its type and its default.
SCHEMA_PATH = Path(__file__).resolve().with_name("config.schema.yaml")
_IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


@dataclass(frozen=True)
class GpuConfig:
    """A GPU plus its numeric settings (TF32 on/off, dtype, cuDNN's algorithm choice) and
    the GPU settings to profile."""

    name: str
    device: str
    tf32: bool
    dtype: str
    settings: tuple[Setting, ...]
    slurm_gpu_model: str | None
    slurm_constraint: str | None
    #: Part of the GPU's name its measurements must run on (None: any GPU).
    gpu_name: str | None = None
    #: cuDNN times its convolution algorithms (``torch.backends.cudnn.benchmark``).
    cudnn_benchmark: bool = False


@dataclass(frozen=True)
class Study:
    """A study: what it profiles itself (``gpus`` on ``model_inputs`` in ``modes``) and
    the measurements made elsewhere that it includes (``included``, per GPU
    configuration), which it evaluates, trains on, validates and draws beside its own."""

    model_inputs: tuple[ModelInput, ...]
    modes: tuple[str, ...]
    gpus: dict[str, GpuConfig]
    config: dict[str, Any]
    included: dict[str, tuple[IncludedSource, ...]] = field(default_factory=dict)

    @property
    def evaluated_gpus(self) -> dict[str, GpuConfig]:
        """Every GPU configuration with a dataset: the study's own, then those it includes."""
        return {**self.gpus, **{name: s[0].gpu for name, s in self.included.items()}}

    def model_input(self, name: str) -> ModelInput:
        for mi in self.model_inputs:
            if mi.name == name:
                return mi
        raise KeyError(name)


@dataclass(frozen=True)
class IncludedSource:
    """One GPU configuration's measurements in one directory a study includes (config
    ``include``): made elsewhere with the study config ``study``, evaluated here.

    Attributes:
        where: the config field, e.g. ``include.0``.
        data: the directory. Layout ``dataset`` (as in data/): ``ops/{model_input}.parquet``
            and ``{gpu}/raw_and_logs.tar.gz`` (``{gpu}/traces.tar.gz`` optional); layout
            ``study`` (another study's working directory): ``results/ops`` and
            ``results/raw/{gpu}``.
    """

    where: str
    data: str
    layout: str
    study: Study
    gpu: GpuConfig

    @property
    def ops_dir(self) -> Path:
        return Path(self.data) / ("ops" if self.layout == "dataset" else "results/ops")

    @property
    def op_tables(self) -> list[str]:
        """The op table of each of its model-input sets."""
        return [str(self.ops_dir / f"{mi.name}.parquet") for mi in self.study.model_inputs]

    @property
    def archives(self) -> list[str]:
        """Its packed raw logs and traces (layout ``dataset``; none for ``study``)."""
        if self.layout != "dataset":
            return []
        base = Path(self.data) / self.gpu.name
        return [str(base / n) for n in ARCHIVES if n == ARCHIVES[0] or (base / n).is_file()]

    @property
    def raw_location(self) -> Path:
        """Where its measurements must be for it to count as holding any."""
        if self.layout == "dataset":
            return Path(self.data) / self.gpu.name / ARCHIVES[0]
        return Path(self.data) / "results" / "raw" / self.gpu.name


#: A dataset directory's archives per GPU configuration: the raw logs (and job logs), and
#: the traces (optional).
ARCHIVES = ("raw_and_logs.tar.gz", "traces.tar.gz")


@cache
def load_schema(path: Path = SCHEMA_PATH) -> dict[str, Any]:
    with open(path) as f:
        return yaml.safe_load(f)


def schema_defaults(section: str, *nested: str) -> dict[str, Any]:
    """The config schema's defaults of one top-level section (``train``, ...), or of an
    object within it (``schema_defaults("op_space", "model")``), by key."""
    properties = load_schema()["properties"][section]["properties"]
    for name in nested:
        properties = properties[name]["properties"]
    return {key: prop["default"] for key, prop in properties.items() if "default" in prop}


def _with_defaults(validator_class):
    """A validator that fills in defaults, as Snakemake's ``validate(set_default=True)``.

    A property missing from an object is set to (a copy of) its schema default before
    the object's properties are validated, so defaults nested in a default, in the items
    of an array and in ``additionalProperties`` (each GPU configuration) are filled in
    the same pass.
    """
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


#: More values than any study needs (a thousand model-input sets are about 6,000): a
#: config above is refused before validation, e.g. YAML anchors that expand into a huge
#: tree (an "alias bomb": 9 aliases 6 deep are 531,441 values).
MAX_CONFIG_VALUES = 100_000
#: Errors listed in a ConfigError; the rest are counted.
MAX_ERRORS = 5
#: Longest value quoted in an error message, characters.
MAX_QUOTED = 60


def _check_size(config: Any) -> None:
    """Refuse a config of more than :data:`MAX_CONFIG_VALUES` values, counting every
    occurrence (a value shared through a YAML alias counts each time it is used)."""
    count = 0
    stack = [config]
    while stack:
        node = stack.pop()
        count += 1
        if count > MAX_CONFIG_VALUES:
            raise ConfigError(
                f"the config holds more than {MAX_CONFIG_VALUES:,} values, far more than "
                "a study needs: YAML aliases expanding into a huge tree?"
            )
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list | tuple):
            stack.extend(node)


def _quote(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= MAX_QUOTED else text[: MAX_QUOTED - 3] + "..."


def _describe(error: jsonschema.ValidationError) -> list[str]:
    """One short line per problem: the field, what is wrong, what is allowed."""
    path = list(error.absolute_path)
    field = _field(path)
    kind, expected, value = error.validator, error.validator_value, error.instance
    if kind == "additionalProperties" and expected is False and isinstance(value, dict):
        allowed = list(error.schema.get("properties", {}))
        return [
            f"{_field([*path, key])}: unknown key; allowed here: {', '.join(allowed)}"
            for key in value
            if key not in allowed
        ]
    if kind == "type":
        types = expected if isinstance(expected, list) else [expected]
        return [f"{field}: expected {' or '.join(types)}, got {_quote(value)}"]
    if kind == "enum" and list(error.schema_path)[-2:] == ["propertyNames", "enum"]:
        return [f"{_field([*path, value])}: unknown key; allowed here: {', '.join(expected)}"]
    if kind == "enum":
        return [
            f"{field}: {_quote(value)} is not allowed; allowed: {', '.join(map(str, expected))}"
        ]
    if kind in ("minItems", "maxItems", "minProperties") and isinstance(value, list | dict):
        bound = "at least" if kind.startswith("min") else "at most"
        return [f"{field}: has {len(value)} entries; {bound} {expected} allowed"]
    message = error.message.replace(repr(value), _quote(value))
    return [f"{field}: {_quote_text(message)}"]


def _quote_text(text: str, limit: int = 3 * MAX_QUOTED) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def validate_config(config: dict[str, Any], schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """Check ``config`` against the JSON schema, filling in defaults in place.

    This is what the Snakefile calls (instead of ``snakemake.utils.validate``, whose
    message quotes the whole schema and config). Raises ``ConfigError`` listing up to
    :data:`MAX_ERRORS` problems, one short line each: the field, what is wrong and what
    is allowed.
    """
    _check_size(config)
    schema = schema or load_schema()
    validator = _with_defaults(jsonschema.Draft202012Validator)(schema)
    lines: list[str] = []
    for error in sorted(validator.iter_errors(config), key=lambda e: [str(p) for p in e.path]):
        lines += [line for line in _describe(error) if line not in lines]
    if lines:
        shown = lines[:MAX_ERRORS]
        if len(lines) > MAX_ERRORS:
            shown.append(f"... and {len(lines) - MAX_ERRORS} more")
        raise ConfigError("invalid config:\n" + "\n".join(f"  {line}" for line in shown))
    return config


def _check_factory(model: str, where: str) -> None:
    """Refuse an import path that is not a network factory (opcost.networks.check_factory);
    each path is checked once per process."""
    problem = factory_problem(model)
    if problem is not None:
        raise ConfigError(f"{where}: {problem}")


def load_study(config: dict[str, Any], *, check_models: bool = True) -> Study:
    """Validate a config (schema, then meaning) and return the study it describes.

    With ``check_models``, a torchvision name must be a torchvision model, and an import
    path ``package.module:factory`` is imported (a config names code to run, as a
    Snakefile is code) and checked to be a factory of a ``torch.nn.Module``
    (:func:`opcost.networks.check_factory`).

    Raises:
        ConfigError: naming the field, for a misspelt key, a wrong type, an unsafe name, an
            unknown model or an import path that is not a network factory, a malformed
            input shape or GPU setting, a GPU setting on ``device: cpu``, or a duplicate
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
            if check_models:
                _check_factory(model, where)
        elif check_models and not is_torchvision_model(model):
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
            if settings[-1].kind != "default" and g["device"] == "cpu":
                # Nothing could apply it: the job would measure the CPU under its name.
                # (device: auto may also resolve to the CPU: the profiling job refuses
                # that, opcost.profile.power_log.)
                raise ConfigError(
                    f"gpus.{name}.settings.{k}: setting {text!r} needs a CUDA device; "
                    f"gpus.{name}.device is 'cpu'"
                )
        if g.get("cudnn_benchmark") and g["device"] == "cpu":
            raise ConfigError(
                f"gpus.{name}.cudnn_benchmark: true needs a CUDA device (cuDNN's "
                f"convolutions); gpus.{name}.device is 'cpu'"
            )
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
            gpu_name=g.get("gpu_name"),
            cudnn_benchmark=bool(g.get("cudnn_benchmark", False)),
        )
    modes = tuple(m for m in MODES if m in config["modes"])
    check_op_space(config["op_space"], gpus)
    if gpus and not model_inputs and not any(config["op_space"]["samples"].values()):
        raise ConfigError(
            "models: give at least one model-input set to profile on gpus "
            "(or op_space.samples to sample the op space on them)"
        )
    included = _load_includes(config["include"], gpus)
    if not gpus and not included and config["op_space"]["data"] is None:
        raise ConfigError(
            "gpus: the study neither profiles (gpus) nor includes measurements (include "
            "or op_space.data): give at least one of them"
        )
    return Study(tuple(model_inputs), modes, gpus, config, included)


def _same_gpu(a: GpuConfig, b: GpuConfig) -> bool:
    def numerics(g: GpuConfig) -> tuple:
        return (g.device, g.tf32, g.dtype, g.cudnn_benchmark, g.settings)

    return numerics(a) == numerics(b)


def _load_includes(
    entries: list[dict[str, Any]], own: dict[str, GpuConfig]
) -> dict[str, tuple[IncludedSource, ...]]:
    """GPU configuration -> its included sources (config ``include``), checked: the files
    exist, a name is not one of the study's own, and sources merged under one name agree
    on the GPU configuration and share no model-input set."""
    out: dict[str, list[IncludedSource]] = {}
    for i, entry in enumerate(entries):
        where = f"include.{i}"
        config_path, data = Path(entry["config"]), Path(entry["data"])
        if not config_path.is_file():
            raise ConfigError(f"{where}.config: no such file {entry['config']!r}")
        if not data.is_dir():
            raise ConfigError(f"{where}.data: no such directory {entry['data']!r}")
        try:
            study = load_study_file(config_path, check_models=False)
        except ConfigError as e:
            raise ConfigError(f"{where}.config: {config_path}: {e}") from e
        if study.included:
            raise ConfigError(
                f"{where}.config: {config_path} includes measurements itself; include "
                "those directories here instead"
            )
        layout = "study" if (data / "results" / "raw").is_dir() else "dataset"
        wanted = entry["gpus"]
        found = 0
        for name in study.gpus if wanted is None else wanted:
            if name not in study.gpus:
                raise ConfigError(
                    f"{where}.gpus: {name!r} is not a GPU configuration of {config_path} "
                    f"({', '.join(study.gpus)})"
                )
            source = IncludedSource(where, str(data), layout, study, study.gpus[name])
            if not source.raw_location.exists():
                if wanted is None:
                    continue
                raise ConfigError(
                    f"{where}.gpus: {data} holds no measurements of {name!r} "
                    f"(no {source.raw_location})"
                )
            if name in own:
                raise ConfigError(
                    f"{where}: {name!r} is also one of this study's gpus; rename one of them"
                )
            missing = [t for t in source.op_tables if not Path(t).is_file()]
            if missing:
                raise ConfigError(
                    f"{where}.data: no op table {missing[0]} ({len(missing)} of "
                    f"{len(source.op_tables)} missing)"
                )
            for prior in out.get(name, []):
                if not _same_gpu(prior.gpu, source.gpu):
                    raise ConfigError(
                        f"{where}: {name!r} is another GPU configuration in {prior.where} "
                        "(device, tf32, dtype, cudnn_benchmark or settings differ); "
                        "include one of them"
                    )
                shared = set(prior.study.model_inputs) & set(study.model_inputs)
                if shared:
                    raise ConfigError(
                        f"{where}: {name!r} measured {min(m.name for m in shared)} in "
                        f"{prior.where} too; include one of them"
                    )
            out.setdefault(name, []).append(source)
            found += 1
        if not found:
            raise ConfigError(
                f"{where}.data: {data} holds measurements of none of the GPU configurations "
                f"of {config_path} ({', '.join(study.gpus)})"
            )
    return {name: tuple(sources) for name, sources in out.items()}


def load_study_file(path: str | Path, **kwargs: Any) -> Study:
    with open(path) as f:
        config = yaml.safe_load(f) or {}
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: the config must be a mapping")
    return load_study(config, **kwargs)


def traced_in_job(profile_config: dict[str, Any], device: str) -> bool:
    """Whether a profiling job on ``device`` also traces what it measured, right after
    its timed window (config ``profile.traces``): on a GPU, unless the study traces in
    jobs of their own (``separate_jobs``)."""
    return device == "cuda" and profile_config.get("traces") != "separate_jobs"
