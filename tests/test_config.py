"""A bad config fails when the workflow loads, before any job, naming the field."""

import copy
import subprocess
import sys

import pytest
import yaml

from opcost.config import ConfigError, load_study, load_study_file


@pytest.fixture
def default_config(repo):
    with open(repo / "config" / "config.yaml") as f:
        return yaml.safe_load(f)


def test_default_config_loads_with_defaults_filled_in(repo):
    study = load_study_file(repo / "config" / "config.yaml")
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


def _broken(config, path, value):
    config = copy.deepcopy(config)
    node = config
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return config


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("modles",), [], "modles"),
        (("profile", "min_run_tme_s"), 1.0, "min_run_tme_s"),
        (("profile", "min_run_time_s"), "long", r"profile\.min_run_time_s"),
        (("profile", "min_run_time_s"), 0, r"profile\.min_run_time_s"),
        (("profile", "min_run_time_s"), -1.0, r"profile\.min_run_time_s"),
        (("gpus", "local", "tf32"), "yes", r"gpus\.local\.tf32"),
        (("gpus", "local", "settings"), ["sm-5"], r"gpus\.local\.settings\.0"),
        (("gpus", "local", "settings"), ["pl0"], r"gpus\.local\.settings\.0"),
        (("gpus", "local", "settings"), ["fast"], r"gpus\.local\.settings\.0"),
        (("models",), [], "models"),
        (("modes",), ["inferance"], r"modes\.0"),
        (("models", 0, "model"), "resnet_eighteen", r"models\.0\.model"),
        (("models", 0, "inputs"), [[4, 3, 64]], r"models\.0\.inputs\.0"),
        (("models", 0, "inputs"), [[4, 3, 0, 64]], r"models\.0\.inputs\.0\.2"),
        (("models", 0, "inputs"), [[4, 3, -64, 64]], r"models\.0\.inputs\.0\.2"),
        (("models", 0, "inputs"), [[4, 3, 64.5, 64]], r"models\.0\.inputs\.0\.2"),
        (("models", 1, "model"), "resnet18", r"models\.0\.inputs\.0.*duplicate|duplicate"),
        (("models", 0, "model"), "../x:y", r"models\.0\.model"),
        (("models", 0, "model"), "my model:f", r"models\.0\.model"),
    ],
)
def test_bad_config_names_the_field(default_config, path, value, message):
    if path == ("models", 1, "model"):
        default_config["models"][1]["inputs"] = default_config["models"][0]["inputs"]
    with pytest.raises(ConfigError, match=message):
        load_study(_broken(default_config, path, value))


@pytest.mark.parametrize("name", ["../x", "a b", "a/b", ".hidden", "x" * 65, ""])
def test_unsafe_gpu_configuration_names_are_refused(default_config, name):
    default_config["gpus"] = {name: {"device": "cpu"}}
    with pytest.raises(ConfigError, match="gpus"):
        load_study(default_config)


def test_snakemake_refuses_a_misspelt_key_before_any_job(repo, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("profile:\n  min_run_tme_s: 1.0\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-n",
            "--configfile",
            str(bad),
            "--directory",
            str(tmp_path / "wd"),
            "-s",
            str(repo / "Snakefile"),
        ],
        capture_output=True,
        text=True,
        cwd=repo,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "min_run_tme_s" in proc.stdout + proc.stderr
    assert not (tmp_path / "wd" / "results").exists()
