"""Adaptive rounds of the op space (config ``op_space.rounds``, docs/op-space.md): their
config, their samples (continuing round 1's sequences), their rules, the op models
trained on every round, and :func:`opcost.opspace.next_round`."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from test_bad_input import _snakemake_dry_run
from test_workflow import job_counts, snakemake

from opcost import opspace
from opcost import opspace_workflow as osw
from opcost import workflow as wf
from opcost.config import ConfigError, load_schema, load_study, load_study_file

REPO = Path(__file__).resolve().parents[1]


def _config(rounds=(), samples=None):
    return {
        "models": [],
        "modes": ["inference", "training"],
        "gpus": {"cpu": {"device": "cpu", "tf32": True, "dtype": "float32"}},
        "op_space": {
            "samples": samples if samples is not None else {"conv": 3, "view": 2},
            "power_samples": 0,
            "chunk_size": 2,
            "seed": 2,
            "rounds": [dict(r) for r in rounds],
        },
    }


ROUND_2 = {"samples": {"conv": 2, "linear": 2}}
ROUND_3 = {"samples": {"conv": 1, "view": 1}, "power_samples": 0}


# -- config ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rounds", "message"),
    [
        pytest.param(
            [{"samples": {"conv": 1}}, {"samples": {"xyz": 3}}],
            r"^invalid config:\n  op_space\.rounds\.1\.samples\.xyz: unknown key; allowed here: "
            r"conv, linear, matmul,",
            id="rounds-unknown-family",
        ),
        pytest.param(
            [{"samples": {"conv": -1}}],
            r"op_space\.rounds\.0\.samples\.conv: -1 is less than the minimum of 0",
            id="rounds-negative-count",
        ),
        pytest.param(
            [{"samples": {"conv": 1}, "power_samples": -1}],
            r"op_space\.rounds\.0\.power_samples: -1 is less than the minimum of 0",
            id="rounds-negative-power",
        ),
        pytest.param(
            [{"samples": {"conv": 1}, "seed": 3}],
            r"op_space\.rounds\.0\.seed: unknown key; allowed here: samples, power_samples",
            id="rounds-unknown-key",
        ),
        pytest.param(
            [{"power_samples": 2}],
            r"op_space\.rounds\.0: 'samples' is a required property",
            id="rounds-without-samples",
        ),
        pytest.param(
            {"conv": 1},
            r"op_space\.rounds: expected array, got \{'conv': 1\}",
            id="rounds-not-list",
        ),
    ],
)
def test_a_bad_round_fails_at_config_load_naming_the_field(rounds, message):
    config = _config()
    config["op_space"]["rounds"] = rounds
    with pytest.raises(ConfigError, match=message):
        load_study(config)


def test_rounds_without_round_1_are_refused():
    with pytest.raises(ConfigError, match=r"^op_space\.rounds: .* give op_space\.samples$"):
        load_study(_config([ROUND_2], samples={}))


def test_a_rounds_power_samples_default_to_2_and_round_1s_are_its_own():
    study = load_study(_config([ROUND_2]))
    assert study.config["op_space"]["rounds"] == [{**ROUND_2, "power_samples": 2, "generator": 2}]
    assert osw.op_space_sampling_params(study)["power_samples"] == 0


def test_a_round_samples_with_the_newest_generator_unless_it_names_one():
    study = load_study(_config([ROUND_2, {**ROUND_2, "generator": 1}]))
    # The default: generator 2, the newest that fills the space evenly (3 weights grouped
    # convolutions for an adaptive round).
    assert osw.op_space_sampling_params(study)["generator"] == 2
    assert osw.op_space_round_params(study, 2)["generator"] == 2
    assert osw.op_space_round_params(study, 3)["generator"] == 1
    assert tuple(range(1, 26)) == opspace.GENERATORS
    config = _config([{**ROUND_2, "generator": 26}])
    with pytest.raises(ConfigError, match=r"op_space\.rounds\.0\.generator: 26 is not allowed"):
        load_study(config)


def test_the_schema_names_the_generators_families_in_every_round():
    op_space = load_schema()["properties"]["op_space"]["properties"]
    rounds = op_space["rounds"]["items"]["properties"]["samples"]
    assert rounds["propertyNames"]["enum"] == list(opspace.FAMILIES)


def test_snakemake_refuses_a_bad_round_before_any_job(repo, tmp_path):
    text = "op_space:\n  samples: {conv: 1}\n  rounds:\n    - samples: {convolution: 3}\n"
    proc = _snakemake_dry_run(repo, tmp_path / "wd", text)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "op_space.rounds.0.samples.convolution: unknown key; allowed here: conv," in output
    assert len(output.splitlines()) <= 10, output[:3000]
    assert not (tmp_path / "wd" / "results").exists()


# -- samples ---------------------------------------------------------------------------------


def _sampled(params, path):
    osw.run_op_space_samples(params, str(path))
    return pd.read_parquet(path)


def test_a_later_round_continues_every_familys_sequence_after_the_rounds_before(tmp_path):
    study = load_study(_config([ROUND_2, ROUND_3]))
    r1 = _sampled(osw.op_space_sampling_params(study), tmp_path / "r1.parquet")
    r2 = _sampled(osw.op_space_round_params(study, 2), tmp_path / "r2.parquet")
    r3 = _sampled(osw.op_space_round_params(study, 3), tmp_path / "r3.parquet")

    def index(table):
        return {f: list(g) for f, g in table.groupby("family")["sample"]}

    # Round 1: conv 0-2, view 0-1; round 2 continues conv at 3 and starts linear at 0;
    # round 3 continues conv after both (3 + 2) and view after round 1 (2).
    assert index(r1) == {"conv": [0, 1, 2], "view": [0, 1]}
    assert index(r2) == {"conv": [3, 4], "linear": [0, 1]}
    assert index(r3) == {"conv": [5], "view": [2]}
    assert set(r2["round"]) == {2}
    assert set(r3["round"]) == {3}
    assert not set(r2["op_id"]) & set(r1["op_id"])
    assert not set(r3["op_id"]) & (set(r1["op_id"]) | set(r2["op_id"]))
    # Round 2's power samples (default 2) mark both configurations of each family.
    assert r2["power"].all()
    assert not r3["power"].any()
    # Round 2 is opspace.sample of its counts from round 1's ends: the points after
    # round 1's are those of one longer sequence.
    longer = opspace.sample({"conv": 5}, seed=2, generator=2)
    assert list(r2.loc[r2["family"] == "conv", "op_id"]) == list(longer["op_id"][3:])


def test_a_rounds_settings_hold_only_the_rounds_up_to_its_own():
    one = load_study(_config([]))
    two = load_study(_config([ROUND_2]))
    three = load_study(_config([ROUND_2, ROUND_3]))
    # Adding a round changes neither round 1's sampling nor an earlier round's.
    assert osw.op_space_sampling_params(one) == osw.op_space_sampling_params(three)
    assert osw.op_space_round_params(two, 2) == osw.op_space_round_params(three, 2)
    assert osw.op_space_round_params(three, 3)["starts"] == {"conv": 5, "view": 2, "linear": 2}
    for missing in (1, 4):
        with pytest.raises(wf.OpcostError, match=f"op space round {missing}: .* rounds 1-3"):
            osw.op_space_round_params(three, missing)


def test_every_rounds_chunks_are_measured(tmp_path):
    study = load_study(_config([ROUND_2, ROUND_3]))
    # 5 configurations of round 1, 4 of round 2, 2 of round 3, chunks of 2.
    assert osw.op_space_chunk_names(study) == ["0", "1", "2", "r2-0", "r2-1", "r3-0"]
    assert osw.op_space_chunks(study, 2) == [0, 1]


def test_a_round_that_names_gpus_is_measured_and_trained_on_by_those_alone():
    config = _config([ROUND_2, {**ROUND_3, "gpus": ["off"]}])
    config["gpus"] = {
        "on": {"device": "cuda", "tf32": True, "dtype": "float32"},
        "off": {"device": "cuda", "tf32": False, "dtype": "float32"},
    }
    study = load_study(config)
    assert osw.op_space_chunk_names(study, "on") == ["0", "1", "2", "r2-0", "r2-1"]
    assert osw.op_space_chunk_names(study, "off") == ["0", "1", "2", "r2-0", "r2-1", "r3-0"]
    raw = "results/op-space/raw"
    assert osw.op_space_chunk_paths(study) == [
        *(f"{raw}/on/{c}.parquet" for c in ("0", "1", "2", "r2-0", "r2-1")),
        *(f"{raw}/off/{c}.parquet" for c in ("0", "1", "2", "r2-0", "r2-1", "r3-0")),
    ]
    # The TF32-off configuration trains on its own round 3 and on its twin's other rounds.
    inputs = osw.op_model_inputs(study, "off")
    assert inputs["chunks"][-1] == f"{raw}/off/r3-0.parquet"
    assert inputs["twin"] == [f"{raw}/on/{c}.parquet" for c in ("0", "1", "2", "r2-0", "r2-1")]
    # A round's samples are the same whoever measures it.
    assert osw.op_space_round_params(study, 3) == osw.op_space_round_params(
        load_study(_config([ROUND_2, ROUND_3])), 3
    )
    config["op_space"]["rounds"][1]["gpus"] = ["of"]
    with pytest.raises(ConfigError, match=r"op_space\.rounds\.1\.gpus: 'of' is no GPU conf"):
        load_study(config)


def test_the_op_space_config_records_each_rounds_allocation(repo):
    """config/op-space.yaml's rounds 2 and 3: opspace.allocate of 1,200 over the held-out
    GPU-time MAPE per family of the rounds before (the mean of h100's and h200's, as its
    comments give); round 4 (power): 10 of every family with kernels, all windowed."""
    round_1_errors = {
        "activation": 11.85, "attention": 15.2, "cat": 16.8, "conv": 33.45, "copy": 6.4,
        "dropout": 2.45, "elementwise": 18.65, "linear": 24.45, "matmul": 21.6,
        "norm": 29.4, "pool": 21.0, "softmax": 6.75,
    }  # fmt: skip
    round_2_errors = {
        "activation": 9.085, "attention": 13.583, "cat": 14.692, "conv": 37.332,
        "copy": 5.396, "dropout": 5.5, "elementwise": 15.703, "linear": 17.027,
        "matmul": 17.896, "norm": 20.808, "pool": 18.302, "softmax": 8.47,
    }  # fmt: skip
    text = (repo / "config/op-space.yaml").read_text()
    for errors in (round_1_errors, round_2_errors):
        for family, error in errors.items():
            assert f"{family} {error}" in text
    rounds = yaml.safe_load(text)["op_space"]["rounds"]
    assert rounds == [
        {"samples": opspace.allocate(round_1_errors, 1200), "power_samples": 2, "generator": 1},
        {"samples": opspace.allocate(round_2_errors, 1200), "power_samples": 2, "generator": 1},
        {"samples": dict.fromkeys(sorted(round_2_errors), 10), "power_samples": 10, "generator": 1},
        # Round 5: the convolutions, sampled by generator 2 (docs/op-space.md).
        {"samples": {"conv": 480}, "power_samples": 2, "generator": 2},
        # Round 6: convolutions, grouped ones 40 % of them (generator 3).
        {"samples": {"conv": 720}, "power_samples": 2, "generator": 3},
        # Round 7: dense 3x3 convolutions on maps of 7-64 (generator 4), TF32 off alone.
        {
            "samples": {"conv": 400}, "power_samples": 2, "generator": 4,
            "gpus": ["h100-notf32", "h200-notf32"],
        },
        # Round 8: the same with widths and batches powers of two (generator 5).
        {
            "samples": {"conv": 200}, "power_samples": 2, "generator": 5,
            "gpus": ["h100-notf32"],
        },
        # Rounds 9 and 10: aligned dense convolutions (generator 6), one GPU each, TF32 on
        # then off; round 11: 300 more of generator 5.
        {"samples": {"conv": 400}, "power_samples": 2, "generator": 6, "gpus": ["h100"]},
        {
            "samples": {"conv": 400}, "power_samples": 2, "generator": 6,
            "gpus": ["h100-notf32"],
        },
        {
            "samples": {"conv": 300}, "power_samples": 2, "generator": 5,
            "gpus": ["h100-notf32"],
        },
        # Rounds 12 and 13: dense convolutions at batch 16-256 (generator 7), TF32 on, off;
        # rounds 14 and 15: grouped and depthwise ones (generator 8).
        {"samples": {"conv": 400}, "power_samples": 2, "generator": 7, "gpus": ["h100"]},
        {
            "samples": {"conv": 400}, "power_samples": 2, "generator": 7,
            "gpus": ["h100-notf32"],
        },
        {"samples": {"conv": 400}, "power_samples": 2, "generator": 8, "gpus": ["h100"]},
        {
            "samples": {"conv": 300}, "power_samples": 2, "generator": 8,
            "gpus": ["h100-notf32"],
        },
        # Rounds 16 and 17 (power): every configuration windowed, dense (generator 6) and
        # grouped (generator 8) convolutions, on both GPUs.
        {
            "samples": {"conv": 120}, "power_samples": 120, "generator": 6,
            "gpus": ["h100", "h100-notf32", "h200", "h200-notf32"],
        },
        {
            "samples": {"conv": 60}, "power_samples": 60, "generator": 8,
            "gpus": ["h100", "h100-notf32", "h200", "h200-notf32"],
        },
        # Rounds 18-21: the H200's turn, dense (generator 6) and grouped (generator 8)
        # convolutions, TF32 on then off.
        {"samples": {"conv": 600}, "power_samples": 2, "generator": 6, "gpus": ["h200"]},
        {"samples": {"conv": 400}, "power_samples": 2, "generator": 8, "gpus": ["h200"]},
        {
            "samples": {"conv": 400}, "power_samples": 2, "generator": 6,
            "gpus": ["h200-notf32"],
        },
        {
            "samples": {"conv": 300}, "power_samples": 2, "generator": 8,
            "gpus": ["h200-notf32"],
        },
        # Rounds 22 and 23: convolutions on the maps of a network's stages (generator 9).
        {"samples": {"conv": 600}, "power_samples": 2, "generator": 9, "gpus": ["h200"]},
        {
            "samples": {"conv": 400}, "power_samples": 2, "generator": 9,
            "gpus": ["h200-notf32"],
        },
        # Rounds 24 and 25: grouped convolutions drawn by their groups (generator 10).
        {"samples": {"conv": 1500}, "power_samples": 2, "generator": 10, "gpus": ["h200"]},
        {
            "samples": {"conv": 1250}, "power_samples": 2, "generator": 10,
            "gpus": ["h200-notf32"],
        },
        # Rounds 26 and 27: grouped convolutions of narrow groups (generator 11).
        {"samples": {"conv": 750}, "power_samples": 2, "generator": 11, "gpus": ["h200"]},
        {
            "samples": {"conv": 750}, "power_samples": 2, "generator": 11,
            "gpus": ["h200-notf32"],
        },
        # Rounds 28 and 29: a network stage's same-width 3x3 convolutions (generator 12).
        {"samples": {"conv": 250}, "power_samples": 2, "generator": 12, "gpus": ["h200"]},
        {
            "samples": {"conv": 200}, "power_samples": 2, "generator": 12,
            "gpus": ["h200-notf32"],
        },
        # Round 30: the norms of a network's stage (generator 13).
        {"samples": {"norm": 400}, "power_samples": 2, "generator": 13, "gpus": ["h200"]},
        # Round 31: a power window for every norm of a network's stage (generator 13).
        {"samples": {"norm": 80}, "power_samples": 80, "generator": 13, "gpus": ["h200"]},
        # Round 32: a power window for every pooling, attention, activation and
        # elementwise op.
        {
            "samples": {"pool": 30, "attention": 30, "activation": 30, "elementwise": 30},
            "power_samples": 30, "generator": 13, "gpus": ["h200"],
        },
        # Rounds 33 and 34: LayerNorm on a stage's map with its channels last (generator 14).
        {"samples": {"norm": 400}, "power_samples": 2, "generator": 14, "gpus": ["h200"]},
        {"samples": {"norm": 80}, "power_samples": 80, "generator": 14, "gpus": ["h200"]},
        # Round 35: a power window for every convolution, TF32 off (generator 9).
        {
            "samples": {"conv": 80}, "power_samples": 80, "generator": 9,
            "gpus": ["h200-notf32"],
        },
        # Rounds 36-39: grouped convolutions of 2-8 groups (generator 15).
        {"samples": {"conv": 250}, "power_samples": 2, "generator": 15, "gpus": ["h200"]},
        {
            "samples": {"conv": 100}, "power_samples": 2, "generator": 15,
            "gpus": ["h200-notf32"],
        },
        {"samples": {"conv": 250}, "power_samples": 2, "generator": 15, "gpus": ["h200"]},
        {
            "samples": {"conv": 200}, "power_samples": 2, "generator": 15,
            "gpus": ["h200-notf32"],
        },
        # Rounds 40 and 41: a network block's 1x1 convolutions (generator 16).
        {"samples": {"conv": 600}, "power_samples": 2, "generator": 16, "gpus": ["h200"]},
        {
            "samples": {"conv": 300}, "power_samples": 2, "generator": 16,
            "gpus": ["h200-notf32"],
        },
        # Rounds 42 and 43: an attention block's matrix products (generator 17).
        {"samples": {"matmul": 300}, "power_samples": 2, "generator": 17, "gpus": ["h200"]},
        {
            "samples": {"matmul": 300}, "power_samples": 2, "generator": 17,
            "gpus": ["h200-notf32"],
        },
        # Rounds 44 and 45: a network's first layer on an RGB image (generator 18).
        {"samples": {"conv": 300}, "power_samples": 2, "generator": 18, "gpus": ["h200"]},
        {
            "samples": {"conv": 300}, "power_samples": 2, "generator": 18,
            "gpus": ["h200-notf32"],
        },
        # Rounds 46 and 47: a transformer block's linear layers (generator 19).
        {"samples": {"linear": 300}, "power_samples": 2, "generator": 19, "gpus": ["h200"]},
        {
            "samples": {"linear": 300}, "power_samples": 2, "generator": 19,
            "gpus": ["h200-notf32"],
        },
        # Rounds 48 and 49: a transformer block's attention (generator 20).
        {"samples": {"attention": 300}, "power_samples": 2, "generator": 20, "gpus": ["h200"]},
        {
            "samples": {"attention": 300}, "power_samples": 2, "generator": 20,
            "gpus": ["h200-notf32"],
        },
        # Rounds 50 and 51: grouped convolutions by their groups, timed from a graph too.
        {
            "samples": {"conv": 300}, "power_samples": 2, "generator": 10,
            "gpus": ["h200-notf32"],
        },
        {"samples": {"conv": 300}, "power_samples": 2, "generator": 10, "gpus": ["h200"]},
        # Rounds 52 and 53: narrow groups and attention, timed from a graph, TF32 on.
        {"samples": {"conv": 300}, "power_samples": 2, "generator": 11, "gpus": ["h200"]},
        {"samples": {"attention": 300}, "power_samples": 2, "generator": 20, "gpus": ["h200"]},
        # Rounds 54 and 55: the calls networks make as functions, a shifted window's ops.
        {
            "samples": {
                "linear": 80, "activation": 50, "pool": 50, "elementwise": 80, "softmax": 60,
                "copy": 80,
            },
            "power_samples": 2, "generator": 21, "gpus": ["h200"],
        },
        {"samples": {"linear": 80}, "power_samples": 2, "generator": 21, "gpus": ["h200-notf32"]},
        # Round 56: a table gathered by a tensor of indices.
        {"samples": {"copy": 80}, "power_samples": 2, "generator": 22, "gpus": ["h200"]},
        # Round 57: views of part of a tensor, a copy in training.
        {"samples": {"copy": 120}, "power_samples": 2, "generator": 23, "gpus": ["h200"]},
        # Round 58: writes into part of a tensor.
        {"samples": {"copy": 160}, "power_samples": 2, "generator": 24, "gpus": ["h200"]},
        # Round 59: depthwise convolutions on a stage's map, each timed from a graph.
        {"samples": {"conv": 200}, "power_samples": 2, "generator": 25,
         "gpus": ["h200", "h200-notf32"]},
    ]  # fmt: skip
    study = load_study_file(repo / "config/op-space.yaml")
    samples = study.config["op_space"]["samples"]
    assert osw.op_space_round_params(study, 2)["starts"] == samples
    assert osw.op_space_round_params(study, 3)["starts"] == {
        f: samples.get(f, 0) + rounds[0]["samples"].get(f, 0) for f in samples
    }


# -- rules -----------------------------------------------------------------------------------


def _write(path, config):
    path.write_text(json.dumps(config))
    return ("--configfile", str(path))


def test_a_dry_run_plans_every_rounds_samples_and_chunks(repo, tmp_path):
    args = _write(tmp_path / "config.yaml", _config([ROUND_2, ROUND_3]))
    dry = snakemake(repo, tmp_path, "-n", "op_space_raw", *args)
    assert dry.returncode == 0, dry.stderr[-4000:]
    assert job_counts(dry.stdout) == {
        "op_space_samples": 1,
        "measure_op_space": 3,
        "op_space_round_samples": 2,
        "measure_op_space_round": 3,
        "op_space_raw": 1,
        "total": 10,
    }
    for path in ("samples-r2.parquet", "samples-r3.parquet", "raw/cpu/r2-1.parquet"):
        assert f"results/op-space/{path}" in dry.stdout
    # The op models train on every round's chunks.
    dry = snakemake(repo, tmp_path, "-n", "op_models", *args)
    assert dry.returncode == 0, dry.stderr[-4000:]
    assert job_counts(dry.stdout)["measure_op_space_round"] == 3


def _planned(repo, workdir, args):
    dry = snakemake(repo, workdir, "-n", "op_space_raw", *args)
    assert dry.returncode == 0, dry.stderr[-4000:]
    if "Nothing to be done" in dry.stdout + dry.stderr:
        return {}
    counts = job_counts(dry.stdout)
    return {rule: n for rule, n in counts.items() if rule not in ("total", "op_space_raw")}


@pytest.mark.slow
def test_adding_a_round_measures_only_that_round(repo, tmp_path):
    config = _config(samples={"view": 2, "activation": 2})  # milliseconds on the CPU
    args = _write(tmp_path / "config.yaml", config)
    run = snakemake(repo, tmp_path, "op_space_raw", "--cores", "2", *args)
    assert run.returncode == 0, run.stderr[-4000:]
    raw = tmp_path / "results/op-space/raw/cpu"
    assert sorted(p.name for p in raw.iterdir()) == ["0.parquet", "1.parquet"]

    config["op_space"]["rounds"] = [{"samples": {"view": 1, "activation": 2}}]
    _write(tmp_path / "config.yaml", config)
    # Round 1's samples and chunks stay (their settings hold no round); round 2's come.
    assert _planned(repo, tmp_path, args) == {
        "op_space_round_samples": 1,
        "measure_op_space_round": 2,
    }
    run = snakemake(repo, tmp_path, "op_space_raw", "--cores", "2", *args)
    assert run.returncode == 0, run.stderr[-4000:]
    r2 = pd.read_parquet(tmp_path / "results/op-space/samples-r2.parquet")
    assert sorted(r2["sample"]) == [2, 2, 3]  # view 2; activation 2, 3
    tables = pd.concat([pd.read_parquet(raw / f"r2-{c}.parquet") for c in (0, 1)])
    assert sorted(tables["op_id"]) == sorted(r2["op_id"].tolist() * 2)  # both modes
    assert (tables["status"] == "ok").all()

    config["op_space"]["rounds"].append({"samples": {"view": 1}})
    _write(tmp_path / "config.yaml", config)
    assert _planned(repo, tmp_path, args) == {
        "op_space_round_samples": 1,
        "measure_op_space_round": 1,
    }
    # Changing round 2 resamples and remeasures round 2 (and round 3, which continues
    # it), never round 1.
    config["op_space"]["rounds"][0]["samples"]["view"] = 2
    _write(tmp_path / "config.yaml", config)
    assert _planned(repo, tmp_path, args) == {
        "op_space_round_samples": 2,
        "measure_op_space_round": 3,
    }


# -- training on every round ------------------------------------------------------------------


def test_op_space_data_holds_every_rounds_chunks_in_order_and_no_samples_table(tmp_path):
    root = tmp_path / "ops"
    names = ["samples.parquet", "samples-r2.parquet", "samples-r3.parquet"]
    names += [f"h100/{c}.parquet" for c in ("r2-10", "10", "r3-0", "r2-2", "2", "r2-0")]
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"")
    from opcost.config_opspace import op_space_data_gpus

    assert op_space_data_gpus(root) == ["h100"]
    chunks = [Path(p).name for p in osw.op_space_data_chunks(root, "h100")]
    assert chunks == [f"{c}.parquet" for c in ("2", "10", "r2-0", "r2-2", "r2-10", "r3-0")]


# -- the next round's counts -------------------------------------------------------------------


def _metrics(path, mape):
    families = {f: {"n": 10, "gpu_time_mape_pct": e} for f, e in mape.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"held_out_fraction": 0.2, "families": families}))
    return str(path)


def test_next_round_shares_the_total_by_the_mean_error_of_each_family(tmp_path):
    a = _metrics(tmp_path / "a/metrics.json", {"conv": 30.0, "linear": 10.0})
    b = _metrics(tmp_path / "b/metrics.json", {"conv": 10.0, "matmul": 20.0})
    # Means: conv (30 + 10) / 2 = 20, linear 10, matmul 20 (the one file that scores
    # them); shares of 7: 2.8, 1.4, 2.8 -> 2, 1, 2, and the 2 left to the largest
    # remainders (conv, matmul: 0.8).
    assert opspace.next_round([a, b], 7) == {"conv": 3, "linear": 1, "matmul": 3}
    # A floor of 1 each: 4 left, shares 1.6, 0.8, 1.6 -> 1 + 1, 1 + 0, 1 + 1, and the 2
    # left to linear (remainder 0.8) and conv (0.6, before matmul's 0.6 by name).
    assert opspace.next_round([a, b], 7, floor=1) == {"conv": 3, "linear": 2, "matmul": 2}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        pytest.param(None, "FileNotFoundError", id="missing"),
        pytest.param("{", "JSONDecodeError", id="not-json"),
        pytest.param('{"families": {"conv": {"n": 3}}}', "KeyError", id="no-mape"),
    ],
)
def test_next_round_names_a_file_that_is_no_op_models_metrics(tmp_path, text, why):
    path = tmp_path / "metrics.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(opspace.OpSpaceError, match=rf"^{re.escape(str(path))}: not an .*{why}"):
        opspace.next_round([str(path)], 10)
    with pytest.raises(opspace.OpSpaceError, match="no metrics.json given"):
        opspace.next_round([], 10)


def test_the_documented_one_liner_computes_the_next_round(repo, tmp_path):
    docs = (repo / "docs/op-space.md").read_text()
    command = re.search(r"```bash\n(python -c .*next_round.*)\n```", docs)[1]
    _metrics(tmp_path / "results/op-models/h100/metrics.json", {"conv": 30.0, "linear": 10.0})
    _metrics(tmp_path / "results/op-models/h200/metrics.json", {"conv": 10.0, "matmul": 20.0})
    env = {**os.environ, "PYTHONPATH": str(repo / "src")}
    out = subprocess.run(
        ["bash", "-c", command.replace("python ", f"{sys.executable} ", 1)],
        cwd=tmp_path, capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    # 1,200 by means conv 20, linear 10, matmul 20: 480, 240, 480.
    assert yaml.safe_load(out.stdout) == {"conv": 480, "linear": 240, "matmul": 480}
