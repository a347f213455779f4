"""The study configuration: defaults filled in from the schema.

What a bad config does (fails before any job, naming the field) is tested in
tests/test_bad_input.py.
"""

import copy
import time
from pathlib import Path

import pytest

from opcost.config import (
    MAX_ERRORS,
    SCHEMA_PATH,
    ConfigError,
    load_study,
    load_study_file,
    validate_config,
)


def test_default_config_loads_with_defaults_filled_in(repo):
    study = load_study_file(repo / "config" / "local.yaml")
    assert [mi.name for mi in study.model_inputs] == [
        "resnet18_4x3x64x64",
        "mobilenet_v3_small_4x3x64x64",
        "squeezenet1_1_4x3x64x64",
    ]
    assert study.modes == ("inference", "training")
    assert study.gpus["local"].settings[0].name == "default"
    # Defaults from the schema, not from the file:
    assert study.config["evaluate"]["min_power_updates"] == 10
    assert study.config["train"]["regressor"] == "random_forest"
    assert study.config["profile"]["power_interval_ms"] == 20


def test_empty_config_gets_every_default():
    study = load_study({})
    assert len(study.model_inputs) == 3
    assert study.config["profile"]["min_run_time_s"] == 1.0


def test_every_shipped_study_config_loads(repo):
    """The studies under config/ (run with --configfile) pass the schema and the checks."""
    paths = sorted((repo / "config").glob("*.yaml"))
    assert len(paths) >= 4
    for path in paths:
        study = load_study_file(path)
        # Each profiles networks, samples the op space (config/op-space.yaml), or (the
        # default) includes the shipped measurements.
        op_space = any(study.config["op_space"]["samples"].values())
        assert study.model_inputs or study.included or op_space, path
        if path.name in ("hopper.yaml", "hopper-large.yaml"):
            # issue #9: the two Hopper GPUs with TF32 on and off; eight networks at two
            # sizes, and the same eight at batch 64.
            assert {name: gpu.tf32 for name, gpu in study.gpus.items()} == {
                "h100": True,
                "h200": True,
                "h100-notf32": False,
                "h200-notf32": False,
            }
            models = {mi.model for mi in study.model_inputs}
            assert len(models) == 8
            if path.name == "hopper.yaml":
                assert len(study.model_inputs) == 16
            else:
                assert {mi.shape for mi in study.model_inputs} == {(64, 3, 224, 224)}
            assert study.config["profile"]["min_run_time_s"] >= 1.0


# --- issue 19: the config's own validation (opcost.config.validate_config) ---------------


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"gpus": {"a": {"device": "cpu"}, "b": {"settings": ["sm1410"], "tf32": False}}},
        {"models": [{"model": "resnet18", "inputs": [[2, 3, 8, 8]]}], "profile": {"warmup_s": 1}},
        {"sweep": {"gpu": "a"}, "train": {"seed": 3}, "extract": {}},
    ],
)
def test_defaults_are_filled_in_as_snakemake_validate_does(config):
    """The Snakefile calls validate_config instead of snakemake.utils.validate(set_default=
    True): the same defaults, nested ones included (in each GPU configuration under
    `gpus`' additionalProperties, in the default `models` list, in sections given empty)."""
    import snakemake.utils

    ours = validate_config(copy.deepcopy(config))
    theirs = copy.deepcopy(config)
    snakemake.utils.validate(theirs, str(SCHEMA_PATH))
    assert ours == theirs
    if "gpus" in config and "a" in config["gpus"]:
        assert ours["gpus"]["a"] == {
            "device": "cpu",
            "tf32": True,
            "cudnn_benchmark": False,
            "dtype": "float32",
            "settings": ["default"],
            "slurm_gpu_model": None,
            "slurm_constraint": None,
            "gpu_name": None,
        }


def _alias_bomb(path: Path, width: int = 9, depth: int = 6) -> Path:
    """A YAML file of `width` aliases nested `depth` deep: width**depth values (531,441)."""
    lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    for d in range(1, depth):
        lines.append(f"a{d}: &a{d} [{', '.join([f'*a{d - 1}'] * width)}]")
    lines.append(f"models: *a{depth - 1}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_yaml_alias_bomb_fails_fast_with_a_short_message(tmp_path):
    bomb = _alias_bomb(tmp_path / "bomb.yaml")
    started = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        load_study_file(bomb)
    assert time.perf_counter() - started < 2.0
    message = str(info.value)
    assert len(message) < 300, message[:1000]
    assert "100,000 values" in message


def test_misspelt_top_level_key_lists_the_allowed_keys():
    with pytest.raises(ConfigError) as info:
        load_study({"modles": []})
    lines = str(info.value).splitlines()
    assert lines == [
        "invalid config:",
        "  modles: unknown key; allowed here: models, modes, gpus, include, extract, profile, "
        "evaluate, train, sweep, op_space, figures",
    ]


def test_many_errors_are_cut_short():
    config = {f"key{i}": i for i in range(50)}
    with pytest.raises(ConfigError) as info:
        load_study(config)
    lines = str(info.value).splitlines()
    assert lines[0] == "invalid config:"
    assert len(lines) == 1 + MAX_ERRORS + 1
    assert lines[-1] == f"  ... and {50 - MAX_ERRORS} more"


def test_a_long_value_is_quoted_short():
    with pytest.raises(ConfigError) as info:
        load_study({"models": [{"model": "resnet18", "inputs": [[1] * 10_000]}]})
    message = str(info.value)
    assert "models.0.inputs.0: has 10000 entries; at most 5 allowed" in message
    assert len(message) < 200
    with pytest.raises(ConfigError) as info:
        load_study({"models": "x" * 10_000})
    message = str(info.value)
    assert f"models: expected array, got '{'x' * 56}..." in message
    assert len(message) < 200


def test_torchvision_names_read_from_its_source_are_its_registry():
    # The names checked at config load without importing torch are exactly those
    # torchvision registers (the quantized ones are registered under a given name).
    import torchvision

    from opcost.model_registry import torchvision_model_names

    names = torchvision_model_names()
    assert names == frozenset(torchvision.models.list_models())
    assert {"resnet18", "quantized_resnet18", "mobilenet_v3_small"} <= names


def test_a_model_missing_from_the_source_scan_is_checked_by_torchvision(repo, monkeypatch):
    # Should torchvision register a model some other way, the scan misses it and
    # torchvision itself is asked before the name is refused.
    import opcost.model_registry

    monkeypatch.setattr(opcost.model_registry, "torchvision_model_names", frozenset)
    study = load_study_file(repo / "config" / "local.yaml")
    assert study.model_inputs[0].name == "resnet18_4x3x64x64"


def test_op_model_settings_have_defaults_and_the_default_study_trains_the_shipped_data(repo):
    model = load_study({})
    assert model.config["op_space"]["data"] is None
    assert model.config["op_space"]["model"] == {
        "regressor": "extra_trees",
        "n_estimators": 25,
        "min_samples_leaf": 2,
        "pool_gpus": True,
        "holdout_fraction": 0.2,
        "seed": 0,
    }
    from opcost import opspace_workflow as osw

    assert osw.op_models_gpus(model) == []  # no samples, no data: no op models
    # The default study (config/config.yaml, run from the repository) trains the four
    # configurations of data/op-space.
    study = load_study_file(repo / "config" / "config.yaml")
    assert study.config["op_space"]["data"] == "data/op-space"
    assert osw.op_models_gpus(study) == ["h100", "h100-notf32", "h200", "h200-notf32"]
