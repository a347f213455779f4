"""Reliability, bad input: each case fails before any job starts, naming the field or file.

Issue #8, category 1. Per case, the guard (file:function) that catches it; the schema is
``src/opcost/config.schema.yaml``, applied by ``src/opcost/config.py:validate_config``
(which the Snakefile calls) before the checks of meaning in
``src/opcost/config.py:load_study``, which ``workflow/rules/common.smk`` runs when the
workflow loads.

Study config (``ConfigError`` naming the field; ``test_bad_config_names_the_field``):

- unknown key, top level or nested: schema ``additionalProperties: false``
- wrong type (a string for a number, for a boolean): schema ``type``
- empty model list: schema ``models.minItems``
- unknown torchvision model: config.py:load_study (``model_registry.is_torchvision_model``)
- input shape of the wrong rank: config.py:load_study (4 dimensions for torchvision)
  and schema ``minItems``/``maxItems``
- input shape with a zero, negative or non-integer dimension: schema ``minimum: 1`` and
  ``type: integer``
- duplicate model-input set: config.py:load_study (``seen``)
- unknown mode: schema ``modes.items.enum``
- malformed GPU setting (``sm-5``, ``pl0``, ``fast``): names.py:parse_setting, called by
  config.py:load_study
- ``min_run_time_s`` <= 0: schema ``exclusiveMinimum: 0``
- unsafe model name (``../x``, spaces, slashes; as torchvision name or import path):
  config.py:load_study (``_IMPORT_PATH``, the torchvision list) and
  names.py:model_input_name
- unsafe GPU configuration name or SLURM GPU model: names.py:check_name, called by
  config.py:load_study (``test_unsafe_gpu_configuration_names_are_refused``,
  ``test_unsafe_slurm_names_are_refused``)
- through Snakemake: the run stops before any job and creates no ``results/``
  (``test_snakemake_refuses_a_bad_config_before_any_job``): Snakefile ``validate_config`` and
  workflow/rules/common.smk (``load_study``)

Command line (exit code 2, one line on stderr naming the argument or file):

- malformed ``--input`` (empty, not a number, zero, negative): cli.py:parse_shape
- unknown model, import path that does not resolve, factory that returns no module:
  networks.py:build_model (``ExtractionError`` via extract.py:extract_model_input)
- ``opcost predict`` with a missing predictor directory, or one that holds none:
  predict.py:load_predictors
- incompatible feature schema (the models' columns differ from features.json):
  features.py:check_schema, called by predict.py:load_predictor
- corrupt features.json: predict.py:load_predictor
- corrupt Parquet op table, one that lacks columns, a missing file:
  io.py:read_parquet (via predict.py:read_ops_table)
- unknown ``--mode``: argparse ``choices`` (cli.py:build_parser)
- ``--model`` and ``--ops`` both or neither, ``--model`` without ``--input``:
  cli.py:cmd_predict
- ``opcost train`` with a misspelt config key or a missing dataset:
  config.py:validate_config, io.py:read_parquet
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import reseal

from opcost.cli import CliError, main, parse_shape
from opcost.config import ConfigError, load_study
from opcost.model.format import TIME_FILE

TESTS = Path(__file__).parent
H100 = TESTS / "data" / "h100"
RESNET18_OPS = H100 / "ops" / "resnet18_4x3x64x64.parquet"
TINY = ["--model", "toymodels.nets:tiny_mlp", "--input", "8,16"]


# --- the study config --------------------------------------------------------------------


@pytest.fixture
def default_config(repo):
    with open(repo / "config" / "local.yaml") as f:
        return yaml.safe_load(f)


def _broken(config, path, value):
    config = copy.deepcopy(config)
    node = config
    for key in path[:-1]:
        node = node.setdefault(key, {}) if isinstance(key, str) else node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return config


def case(case_id: str, path: tuple, value: object, message: str):
    return pytest.param(path, value, message, id=case_id)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        case("unknown-key", ("modles",), [], "modles"),
        case("unknown-nested-key", ("profile", "min_run_tme_s"), 1.0, "min_run_tme_s"),
        case("unknown-gpu-key", ("gpus", "local", "clock"), 1410, "clock"),
        case("wrong-type-number", ("profile", "min_run_time_s"), "long", r"min_run_time_s"),
        case("wrong-type-bool", ("gpus", "local", "tf32"), "yes", r"gpus\.local\.tf32"),
        case("wrong-type-models", ("models",), "resnet18", r"models"),
        case("min-run-time-zero", ("profile", "min_run_time_s"), 0, r"profile\.min_run_time_s"),
        case("min-run-time-negative", ("profile", "min_run_time_s"), -1.0, r"min_run_time_s"),
        case("setting-sm-5", ("gpus", "local", "settings"), ["sm-5"], r"gpus\.local\.settings\.0"),
        case("setting-pl0", ("gpus", "local", "settings"), ["pl0"], r"gpus\.local\.settings\.0"),
        case("setting-fast", ("gpus", "local", "settings"), ["fast"], r"gpus\.local\.settings\.0"),
        case("setting-not-str", ("gpus", "local", "settings"), [1410], r"gpus\.local\.settings\.0"),
        case("empty-models", ("models",), [], "models"),
        case("unknown-mode", ("modes",), ["inferance"], r"modes\.0"),
        case("unknown-model", ("models", 0, "model"), "resnet_eighteen", r"models\.0\.model"),
        case("shape-rank-3", ("models", 0, "inputs"), [[4, 3, 64]], r"models\.0\.inputs\.0"),
        case("shape-rank-1", ("models", 0, "inputs"), [[4]], r"models\.0\.inputs\.0"),
        case("shape-zero", ("models", 0, "inputs"), [[4, 3, 0, 64]], r"models\.0\.inputs\.0\.2"),
        case("shape-negative", ("models", 0, "inputs"), [[4, 3, -64, 64]], r"inputs\.0\.2"),
        case("shape-float", ("models", 0, "inputs"), [[4, 3, 64.5, 64]], r"inputs\.0\.2"),
        case("shape-string", ("models", 0, "inputs"), [[4, 3, "64", 64]], r"inputs\.0\.2"),
        case("shape-empty-list", ("models", 0, "inputs"), [], r"models\.0\.inputs"),
        case("duplicate", ("models", 1, "model"), "resnet18", r"models\.1\.inputs\.0.*duplicate"),
        case("model-dotdot-import", ("models", 0, "model"), "../x:y", r"models\.0\.model"),
        case("model-space-import", ("models", 0, "model"), "my model:f", r"models\.0\.model"),
        case("model-slash-import", ("models", 0, "model"), "a/b:f", r"models\.0\.model"),
        case("model-dotdot", ("models", 0, "model"), "../x", r"models\.0\.model"),
        case("model-slash", ("models", 0, "model"), "a/b", r"models\.0\.model"),
        case("model-space", ("models", 0, "model"), "resnet 18", r"models\.0\.model"),
        case("time-target", ("train", "time_target"), "roofline", r"train\.time_target"),
        case("roofline-rate", ("train", "roofline_flops_per_s"), 0, r"roofline_flops_per_s"),
    ],
)
def test_bad_config_names_the_field(default_config, path, value, message):
    if path == ("models", 1, "model"):
        default_config["models"][1]["inputs"] = default_config["models"][0]["inputs"]
    with pytest.raises(ConfigError, match=message):
        load_study(_broken(default_config, path, value))


@pytest.mark.parametrize("name", ["../x", "a b", "a/b", ".hidden", "x" * 65, "", "a\nb", ".."])
def test_unsafe_gpu_configuration_names_are_refused(default_config, name):
    default_config["gpus"] = {name: {"device": "cpu"}}
    with pytest.raises(ConfigError, match="gpus"):
        load_study(default_config)


@pytest.mark.parametrize("key", ["slurm_gpu_model", "slurm_constraint"])
def test_unsafe_slurm_names_are_refused(default_config, key):
    # They reach sbatch's command line through the SLURM plugin.
    default_config["gpus"]["local"][key] = "h100;rm -rf ~"
    with pytest.raises(ConfigError, match=rf"gpus\.local\.{key}"):
        load_study(default_config)


@pytest.mark.parametrize("value", ["", 100])
def test_a_gpu_name_that_is_no_name_is_refused(default_config, value):
    default_config["gpus"]["local"]["gpu_name"] = value
    with pytest.raises(ConfigError, match=r"gpus\.local\.gpu_name"):
        load_study(default_config)


def test_a_gpu_name_reaches_the_configuration(default_config):
    default_config["gpus"]["local"]["gpu_name"] = "H200"
    assert load_study(default_config).gpus["local"].gpu_name == "H200"


def _snakemake_dry_run(repo: Path, workdir: Path, config_text: str):
    config = workdir.parent / "bad.yaml"
    config.write_text(config_text)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-n",
            "--configfile",
            str(config),
            "--directory",
            str(workdir),
            "-s",
            str(repo / "Snakefile"),
        ],
        capture_output=True,
        text=True,
        cwd=repo,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("config_text", "message"),
    [
        # Caught by the Snakefile's schema validation.
        pytest.param("profile:\n  min_run_tme_s: 1.0\n", "min_run_tme_s", id="misspelt-key"),
        # Caught by load_study in workflow/rules/common.smk.
        pytest.param(
            "gpus:\n  local:\n    settings: [sm-5]\n", "gpus.local.settings.0", id="bad-setting"
        ),
        pytest.param('gpus:\n  "../x": {device: cpu}\n', "gpus.../x", id="unsafe-gpu-name"),
    ],
)
def test_snakemake_refuses_a_bad_config_before_any_job(repo, tmp_path, config_text, message):
    proc = _snakemake_dry_run(repo, tmp_path / "wd", config_text)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr
    assert not (tmp_path / "wd" / "results").exists()
    assert "Job stats" not in proc.stdout + proc.stderr  # no job was even planned


# --- the command line --------------------------------------------------------------------


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_clean_error(code: int, err: str, *fragments: str) -> None:
    """Exit code 2 and exactly one line on stderr, holding every fragment."""
    assert code == 2
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[0], err


@pytest.mark.parametrize("text", ["", "3,x", "3,0,4", "-1,2", "3,,4", "2.5,3", "1e3"])
def test_parse_shape_rejects(text):
    with pytest.raises(CliError, match="--input"):
        parse_shape(text)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["predict", *TINY, "--predictors", "/nonexistent/dir"], "no such predictor directory"),
        (["predict", "--model", "no_such_net", "--input", "1,3,8,8"], "unknown model"),
        (["predict", "--model", "resnet18", "--input", "1,3,x"], "--input"),
        (["predict", "--model", "resnet18"], "--model needs --input"),
        (["predict"], "either --model"),
        (["predict", "--model", "resnet18", "--input", "1,3,8,8", "--ops", "x"], "either"),
        (["predict", "--ops", "/nonexistent.parquet"], "/nonexistent.parquet: no such file"),
        (["extract", "--model", "toymodels.nets:not_a_module", "--input", "2"], "not a torch"),
        (["extract", "--model", "toymodels.nets:no_such_factory", "--input", "2"], "resolve"),
        (["extract", "--model", "no_such_package.mod:f", "--input", "2"], "does not resolve"),
        (["extract", "--model", "resnet_eighteen", "--input", "1,3,8,8"], "unknown model"),
        (["extract", "--model", "resnet18", "--input", "1,3,0,8"], "--input"),
        (["extract", "--model", "resnet18", "--input", "1,3,-8,8"], "--input"),
        (["extract", "--model", "resnet18", "--input", "one"], "--input"),
    ],
)
def test_errors_end_with_one_line_and_exit_2(capsys, predictors, argv, fragment):
    if "--predictors" not in argv and argv[0] == "predict":
        argv = [*argv, "--predictors", str(predictors)]
    code, _, err = run_cli(capsys, *argv)
    assert_clean_error(code, err, fragment)


def test_extract_does_not_write_an_output_for_bad_input(capsys, tmp_path):
    out = tmp_path / "ops.parquet"
    code, _, err = run_cli(
        capsys, "extract", "--model", "resnet_eighteen", "--input", "1,3,8,8", "--out", str(out)
    )
    assert_clean_error(code, err, "resnet_eighteen")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_predictor_directory_without_predictors(capsys, tmp_path):
    empty = tmp_path / "predictors"
    (empty / "h100").mkdir(parents=True)
    code, _, err = run_cli(capsys, "predict", *TINY, "--predictors", str(empty))
    assert_clean_error(code, err, str(empty), "holds no trained predictor")


def test_corrupt_op_table(capsys, predictors, tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    code, _, err = run_cli(capsys, "predict", "--ops", str(bad), "--predictors", str(predictors))
    assert_clean_error(code, err, str(bad), "not a readable Parquet file")


def test_op_table_without_its_columns(capsys, predictors, tmp_path):
    import pandas as pd

    table = tmp_path / "no_spec.parquet"
    pd.read_parquet(RESNET18_OPS).drop(columns=["spec"]).to_parquet(table)
    code, _, err = run_cli(capsys, "predict", "--ops", str(table), "--predictors", str(predictors))
    assert_clean_error(code, err, str(table), "missing columns ['spec']")


def _copy_predictor(source: Path, target: Path) -> dict:
    target.mkdir(parents=True)
    for file in source.iterdir():
        (target / file.name).write_bytes(file.read_bytes())
    return json.loads((source / "features.json").read_text())


def _write_features(directory: Path, doc: dict | str) -> None:
    """Edit features.json and its manifest entry, so that the check behind the manifest's
    is the one tested."""
    text = doc if isinstance(doc, str) else json.dumps(doc)
    (directory / "features.json").write_text(text)
    reseal(directory)


def test_incompatible_feature_schema_names_the_model_file(capsys, predictors, tmp_path):
    other = tmp_path / "predictors" / "h100"
    doc = _copy_predictor(predictors / "h100", other)
    # features.json consistent in itself (a type fewer in both its schema and its column
    # list), but the models were fitted on the full columns: they must be refused at
    # load time, naming the model file, not fail later on a column mismatch.
    dropped = f"type[{doc['schema']['op_types'].pop()}]"
    assert dropped in doc["columns"]
    doc["columns"].remove(dropped)
    _write_features(other, doc)
    code, _, err = run_cli(capsys, "predict", *TINY, "--predictors", str(other.parent))
    assert_clean_error(code, err, str(other / TIME_FILE), "retrain")


def test_features_version_mismatch(capsys, predictors, tmp_path):
    other = tmp_path / "predictors" / "h100"
    doc = _copy_predictor(predictors / "h100", other)
    doc["schema"]["version"] = 10_000
    _write_features(other, doc)
    code, _, err = run_cli(capsys, "predict", *TINY, "--predictors", str(other.parent))
    assert_clean_error(code, err, "features version 10000", "retrain")


def test_corrupt_features_json(capsys, predictors, tmp_path):
    other = tmp_path / "predictors" / "h100"
    _copy_predictor(predictors / "h100", other)
    _write_features(other, '{"schema": ')
    code, _, err = run_cli(capsys, "predict", *TINY, "--predictors", str(other.parent))
    assert_clean_error(code, err, str(other / "features.json"), "not readable JSON")


def test_unknown_mode_is_refused(capsys, predictors):
    with pytest.raises(SystemExit) as exit_info:
        main(
            ["predict", "--ops", str(RESNET18_OPS), "--predictors", str(predictors), "--mode", "x"]
        )
    assert exit_info.value.code == 2
    assert "invalid choice: 'x'" in capsys.readouterr().err


def test_train_errors_are_one_line(capsys, tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("train: {n_trees: 5}\n")
    dataset = str(H100 / "dataset" / "h100.parquet")
    code, _, err = run_cli(
        capsys, "train", "--dataset", dataset, "--gpu", "h100", "--config", str(config)
    )
    assert_clean_error(code, err, "invalid config", "n_trees")
    missing = tmp_path / "none.parquet"
    code, _, err = run_cli(capsys, "train", "--dataset", str(missing), "--gpu", "x")
    assert_clean_error(code, err, str(missing), "no such file")


# --- issue 19: GPU settings, network factories, short config errors -----------------------


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        pytest.param("sm99999", "SM clock 99999 MHz is outside 100..4000 MHz", id="sm99999"),
        pytest.param("sm99", "SM clock 99 MHz is outside 100..4000 MHz", id="sm99"),
        pytest.param("pl19", "power limit 19 W is outside 20..2000 W", id="pl19"),
        pytest.param("pl5000", "power limit 5000 W is outside 20..2000 W", id="pl5000"),
    ],
)
def test_implausible_gpu_setting_is_refused(default_config, setting, message):
    default_config["gpus"] = {"h100": {"device": "cuda", "settings": ["default", setting]}}
    with pytest.raises(ConfigError) as info:
        load_study(default_config)
    assert str(info.value).startswith("gpus.h100.settings.1: ")
    assert message in str(info.value)


def test_gpu_settings_at_the_bounds_are_accepted(default_config):
    default_config["gpus"] = {
        "h100": {"device": "auto", "settings": ["sm100", "sm4000", "pl20", "pl2000"]}
    }
    study = load_study(default_config)
    assert [s.value for s in study.gpus["h100"].settings] == [100, 4000, 20, 2000]


def test_gpu_setting_on_the_cpu_is_refused(default_config):
    default_config["gpus"] = {"local": {"device": "cpu", "settings": ["default", "sm1410", "pl50"]}}
    with pytest.raises(ConfigError) as info:
        load_study(default_config)
    assert str(info.value) == (
        "gpus.local.settings.1: setting 'sm1410' needs a CUDA device; gpus.local.device is 'cpu'"
    )


def test_cudnn_benchmark_on_the_cpu_is_refused(default_config):
    default_config["gpus"] = {"local": {"device": "cpu", "cudnn_benchmark": True}}
    with pytest.raises(ConfigError) as info:
        load_study(default_config)
    assert str(info.value).startswith("gpus.local.cudnn_benchmark: true needs a CUDA device")
    default_config["gpus"] = {"local": {"device": "cpu", "cudnn_benchmark": "yes"}}
    with pytest.raises(ConfigError, match="cudnn_benchmark"):
        load_study(default_config)


def test_cudnn_benchmark_changes_a_measurements_params_only_where_it_is_on(default_config):
    """Measurements made before the key existed keep their rules' params (no rerun)."""
    from opcost.workflow import gpu_params

    default_config["gpus"] = {
        "a": {"device": "cuda"},
        "b": {"device": "cuda", "cudnn_benchmark": True},
    }
    study = load_study(default_config)
    assert gpu_params(study, "a") == {"device": "cuda", "tf32": True, "dtype": "float32"}
    assert gpu_params(study, "b") == {**gpu_params(study, "a"), "cudnn_benchmark": True}


@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_profiling_job_fails_when_its_setting_cannot_be_applied(tmp_path, monkeypatch, device):
    """`device: auto` on a node without a GPU passes the config check (it runs where the
    GPU may be); the job must then fail, not record the CPU under the setting's name."""
    import torch

    from opcost.config import GpuConfig
    from opcost.names import ModelInput, parse_setting
    from opcost.profile import ProfileError, profile_job

    if torch.cuda.is_available():
        pytest.skip("torch sees a GPU here: device auto would apply the setting")
    monkeypatch.setenv("OPCOST_LOCK_DIR", str(tmp_path / "locks"))
    gpu = GpuConfig("local", device, True, "float32", (), None, None)
    job = dict(
        kind="network",
        gpu=gpu,
        mode="inference",
        profile_config={"min_run_time_s": 0.01, "warmup_s": 0.0},
        model_input=ModelInput("toymodels.nets:tiny_mlp", (8, 16)),
    )
    out = tmp_path / "raw"
    with pytest.raises(ProfileError, match="'sm1410' cannot be applied: the job runs on the cpu"):
        profile_job(
            **job, setting=parse_setting("sm1410"), csv_path=out / "a.csv", json_path=out / "a.json"
        )
    assert not out.exists() or list(out.iterdir()) == []
    # The card as it is is measured as before.
    record = profile_job(
        **job, setting=parse_setting("default"), csv_path=out / "b.csv", json_path=out / "b.json"
    )
    assert (record["status"], record["setting"], record["device"]) == ("ok", "default", "cpu")


_FACTORIES = """
import pathlib

import torch

CALLED = pathlib.Path(__file__).with_name("called")
CONSTANT = 3


def declared_int() -> int:
    CALLED.write_text("declared_int")
    return 3


def declared_net() -> torch.nn.Module:
    CALLED.write_text("declared_net")
    return torch.nn.Linear(2, 2)


def undeclared_list():
    return [torch.nn.Linear(2, 2)]


def undeclared_net():
    return torch.nn.Linear(2, 2)


def needs_args(width):
    return torch.nn.Linear(width, 2)
"""


def _refused(model: str, message: str, case_id: str | None = None):
    module, name = model.split(":")
    default_id = f"{module.rsplit('.', 1)[-1]}-{name}".replace("_", "-")
    return pytest.param(model, message, id=case_id or default_id)


@pytest.fixture
def factories(tmp_path, monkeypatch):
    """A module of would-be factories, importable as ``issue19_factories``; its
    ``CALLED`` file appears when a factory that records its calls is called."""
    (tmp_path / "issue19_factories.py").write_text(_FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path / "called"


@pytest.mark.parametrize(
    ("model", "message"),
    [
        _refused("os:system", "'os:system' is from the Python standard library"),
        _refused("builtins:eval", "'builtins:eval' is from the Python standard library"),
        _refused("subprocess:run", "is from the Python standard library"),
        # Callable without arguments, returns a str: refused without being called.
        _refused("os:getcwd", "'os:getcwd' is from the Python standard library"),
        _refused("toymodels.nets:torch", "is not callable (a module)"),
        _refused("issue19_factories:CONSTANT", "is not callable (a int)"),
        _refused("issue19_factories:needs_args", "cannot be called without arguments"),
        _refused("issue19_factories:declared_int", "is declared to return int, not a torch.nn"),
        _refused("issue19_factories:undeclared_list", "returned list, not a torch.nn.Module"),
        _refused("toymodels.nets:no_such_factory", "does not resolve"),
    ],
)
def test_model_that_is_no_network_factory_is_refused_at_config_load(factories, model, message):
    with pytest.raises(ConfigError) as info:
        load_study({"models": [{"model": model, "inputs": [[2, 2]]}]})
    text = str(info.value)
    assert text.startswith("models.0.model: "), text
    assert message in text
    assert len(text.splitlines()) == 1
    assert not factories.exists(), "a factory declared to return no network was called"


@pytest.mark.parametrize(
    "model",
    [
        "issue19_factories:declared_net",
        "issue19_factories:undeclared_net",
        "toymodels.nets:TinyMLP",
        "toymodels.nets:tiny_mlp",
    ],
)
def test_network_factories_are_accepted(factories, model):
    study = load_study({"models": [{"model": model, "inputs": [[2, 2]]}]})
    assert study.model_inputs[0].model == model
    # One declared to return a network is not called at config load.
    assert not factories.exists()


@pytest.mark.parametrize("model", ["os:system", "builtins:eval"])
def test_extract_refuses_a_standard_library_factory_in_one_line(capsys, model):
    code, out, err = run_cli(capsys, "extract", "--model", model, "--input", "2")
    assert_clean_error(code, err, f"{model!r} is from the Python standard library")
    assert out == ""


@pytest.mark.parametrize(
    ("config_text", "message"),
    [
        pytest.param(
            "modles: []\n",
            "  modles: unknown key; allowed here: models, modes, gpus, include, extract, profile, "
            "evaluate, train, sweep, op_space, figures\n",
            id="misspelt-top-level-key",
        ),
        pytest.param(
            "a0: &a0 [x, x, x, x, x, x, x, x, x]\n"
            + "".join(f"a{d}: &a{d} [{', '.join([f'*a{d - 1}'] * 9)}]\n" for d in range(1, 6))
            + "models: *a5\n",
            "the config holds more than 100,000 values",
            id="alias-bomb",
        ),
        pytest.param(
            "models:\n  - {model: 'os:system', inputs: [[2, 2]]}\n",
            "models.0.model: 'os:system' is from the Python standard library",
            id="os-system",
        ),
        pytest.param(
            "gpus:\n  local: {device: cpu, settings: [sm1410, pl50]}\n",
            "gpus.local.settings.0: setting 'sm1410' needs a CUDA device; "
            "gpus.local.device is 'cpu'",
            id="setting-on-cpu",
        ),
        pytest.param(
            "gpus:\n  local: {device: cuda, settings: [sm99999]}\n",
            "gpus.local.settings.0: GPU setting 'sm99999': SM clock 99999 MHz is outside",
            id="sm99999",
        ),
    ],
)
def test_snakemake_prints_a_short_config_error(repo, tmp_path, config_text, message):
    """What a user sees from `snakemake`: a few lines naming the field, no job, no schema."""
    proc = _snakemake_dry_run(repo, tmp_path / "wd", config_text)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert message in output
    assert len(output.splitlines()) <= 10, output[:3000]
    assert not (tmp_path / "wd" / "results").exists()


@pytest.mark.parametrize(
    "setting",
    [
        pytest.param("sm 1410", id="space"),
        pytest.param("sm1_410", id="underscore"),
        pytest.param("sm+1410", id="plus"),
        pytest.param("pl0300", id="leading-zero"),
    ],
)
def test_setting_int_would_read_but_no_safe_name_is_refused(default_config, setting):
    """int() reads each of these as a plausible value; the setting's pattern refuses them
    (a setting is a path component), before the bounds are looked at."""
    default_config["gpus"] = {"h100": {"device": "cuda", "settings": [setting]}}
    with pytest.raises(ConfigError, match=r"^gpus\.h100\.settings\.0: GPU setting .* is malformed"):
        load_study(default_config)


# --- op models: config op_space.data and op_space.model ------------------------------------


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        case(
            "op_space-bad-regressor",
            ("op_space", "model", "regressor"),
            "xgboost",
            r"op_space\.model\.regressor",
        ),
        case(
            "op_space-trees-zero",
            ("op_space", "model", "n_estimators"),
            0,
            r"op_space\.model\.n_estimators",
        ),
        case(
            "op_space-leaf-zero",
            ("op_space", "model", "min_samples_leaf"),
            0,
            r"op_space\.model\.min_samples_leaf",
        ),
        case(
            "op_space-holdout-one",
            ("op_space", "model", "holdout_fraction"),
            1,
            r"op_space\.model\.holdout_fraction",
        ),
        case(
            "op_space-model-unknown-key",
            ("op_space", "model", "trees"),
            10,
            r"op_space\.model.*trees",
        ),
        case("op_space-data-not-a-path", ("op_space", "data"), 3, r"op_space\.data"),
    ],
)
def test_bad_op_model_config_names_the_field(default_config, path, value, message):
    with pytest.raises(ConfigError, match=message):
        load_study(_broken(default_config, path, value))


def _op_space_data(root: Path, *tables: str) -> Path:
    """An op-space data directory holding empty files at ``tables`` (relative paths)."""
    root.mkdir()
    for table in tables:
        (root / table).parent.mkdir(parents=True, exist_ok=True)
        (root / table).write_bytes(b"")
    return root


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        pytest.param(
            None, r"^op_space\.data: no such directory '.*nowhere'$", id="op_space-data-missing"
        ),
        pytest.param(
            (), r"^op_space\.data: .* holds no op-space chunk tables", id="op_space-data-empty"
        ),
        # Tables at the top, not under a GPU configuration's directory (data/op-space's
        # samples.parquet is one), and other files are not chunk tables.
        pytest.param(
            ("samples.parquet", "h100/0.csv"),
            r"^op_space\.data: .* holds no op-space chunk",
            id="op_space-data-no-chunks",
        ),
        pytest.param(
            ("h100/0.parquet", "a b/0.parquet"),
            r"^op_space\.data: .*a b.*not a safe name",
            id="op_space-data-unsafe-gpu",
        ),
    ],
)
def test_op_space_data_without_chunk_tables_is_refused(default_config, tmp_path, tables, message):
    data = tmp_path / "nowhere" if tables is None else _op_space_data(tmp_path / "ops", *tables)
    default_config["op_space"] = {"data": str(data)}
    with pytest.raises(ConfigError, match=message):
        load_study(default_config)


def test_snakemake_refuses_missing_op_space_data_before_any_job(repo, tmp_path):
    proc = _snakemake_dry_run(repo, tmp_path / "wd", "op_space:\n  data: nowhere\n")
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "op_space.data: no such directory 'nowhere'" in output
    assert len(output.splitlines()) <= 10, output[:3000]
    assert not (tmp_path / "wd" / "results").exists()
