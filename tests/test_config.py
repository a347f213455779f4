"""The study configuration: defaults filled in from the schema.

What a bad config does (fails before any job, naming the field) is tested in
tests/test_bad_input.py.
"""

from opcost.config import load_study, load_study_file


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


def test_every_shipped_study_config_loads(repo):
    """The studies under config/ (run with --configfile) pass the schema and the checks."""
    paths = sorted((repo / "config").glob("*.yaml"))
    assert len(paths) >= 4
    for path in paths:
        study = load_study_file(path)
        assert study.model_inputs, path
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
