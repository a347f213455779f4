"""Rule ``train_op_models`` (target ``op_models``) through Snakemake's CLI, on a small copy
of the committed op-space data (data/op-space)."""

import json
import shutil
from pathlib import Path

import pytest
import yaml
from test_workflow import _package_copy, job_counts, snakemake

from opcost import op_models_job
from opcost import opspace_workflow as osw
from opcost import workflow as wf
from opcost.config import load_study, load_study_file
from opcost.model.opmodel_format import load_op_models

#: Two GPU configurations of the H100 data: TF32 on (chunk 4: attention, matmul, norm;
#: chunk 9: views) and TF32 off (chunk 4: attention and matmul only; chunk 9: empty, as
#: the TF32-off study measures no view). The TF32-off one takes norm and view from its twin.
CHUNKS = {"on": ("h100", ("4", "9")), "off": ("h100-notf32", ("4", "9"))}


def _op_space_copy(repo: Path, workdir: Path) -> dict[str, list[str]]:
    """The chunk tables under ``workdir/ops/{gpu}/``, as the rule's input paths."""
    paths = {}
    for gpu, (source, chunks) in CHUNKS.items():
        (workdir / "ops" / gpu).mkdir(parents=True)
        paths[gpu] = []
        for chunk in chunks:
            shutil.copy(repo / f"data/op-space/{source}/{chunk}.parquet", workdir / "ops" / gpu)
            paths[gpu].append(f"ops/{gpu}/{chunk}.parquet")
    return paths


@pytest.mark.slow
def test_op_models_are_trained_from_op_space_data(repo, tmp_path):
    sources = _op_space_copy(repo, tmp_path)
    config = tmp_path / "config.yaml"
    config.write_text(
        "models: []\ngpus: {}\n"
        "op_space:\n  data: ops\n  model: {n_estimators: 10, holdout_fraction: 0.2}\n"
    )
    args = ("--configfile", str(config))
    run = snakemake(repo, tmp_path, "op_models", "--cores", "2", *args)
    assert run.returncode == 0, run.stderr[-4000:]

    models = load_op_models(tmp_path / "results/op-models")
    assert sorted(models) == ["off", "on"]
    # The layer norms have their own model within the norm family (opmodel.model_key).
    assert sorted(models["on"].families) == ["attention", "matmul", "norm", "norm.rows", "view"]
    # The families it lacks come from its TF32-on twin; its numerics stay its own.
    assert sorted(models["off"].families) == ["attention", "matmul", "norm", "norm.rows", "view"]
    assert models["off"].meta["tf32"] is False

    for gpu, twin in (("on", []), ("off", sources["on"])):
        directory = tmp_path / "results/op-models" / gpu
        metrics = json.loads((directory / "metrics.json").read_text())
        families = metrics["families"]
        assert sum(f["n"] for f in families.values()) == metrics["all"]["n"]
        manifest = json.loads((directory / "manifest.json").read_text())
        assert [s["path"] for s in manifest["sources"]] == sources[gpu] + twin
        assert "held out" in (tmp_path / f"logs/op-models/{gpu}.log").read_text()
    off = json.loads((tmp_path / "results/op-models/off/metrics.json").read_text())
    # Held out: 0.2 of its 216 op ids, int(43.2) = 43, in both modes, each with kernels;
    # only its own families are scored (the twin's are not its measurements).
    assert off["all"]["n"] == 2 * 43
    assert sorted(off["families"]) == ["attention", "matmul"]
    on = json.loads((tmp_path / "results/op-models/on/metrics.json").read_text())
    assert "view" not in on["families"]  # no kernels: no GPU time to score

    again = snakemake(repo, tmp_path, "-n", "op_models", *args)
    assert "Nothing to be done" in again.stdout + again.stderr
    # Another model setting retrains both; the default target trains them too.
    config.write_text(config.read_text().replace("n_estimators: 10", "n_estimators: 11"))
    changed = snakemake(repo, tmp_path, "-n", *args)
    assert changed.returncode == 0, changed.stderr[-4000:]
    assert job_counts(changed.stdout)["train_op_models"] == 2


@pytest.mark.slow
def test_op_models_learn_what_only_the_peer_on_the_other_gpu_measured(repo, tmp_path):
    # The H100 measured chunk 4 of round 1 (attention, matmul, norm) and 150 convolutions
    # of round 9; the H200 only chunk 4. Its models learn convolutions from the H100's.
    tables = {"h100": ("4", "r9-1"), "h200": ("4",)}
    for gpu, chunks in tables.items():
        (tmp_path / "ops" / gpu).mkdir(parents=True)
        for chunk in chunks:
            shutil.copy(repo / f"data/op-space/{gpu}/{chunk}.parquet", tmp_path / "ops" / gpu)
    config = tmp_path / "config.yaml"
    config.write_text(
        "models: []\ngpus: {}\n"
        "op_space:\n  data: ops\n  model: {n_estimators: 6, holdout_fraction: 0.2}\n"
    )
    run = snakemake(repo, tmp_path, "op_models", "--cores", "2", "--configfile", str(config))
    assert run.returncode == 0, run.stderr[-4000:]
    models = load_op_models(tmp_path / "results/op-models")
    assert "conv" in models["h200"].families
    assert models["h200"].meta["gpu_name"] == "NVIDIA H200"
    # 150 convolutions, both modes, none of them the H200's own.
    h200 = models["h200"].meta
    assert h200["pooled_samples"] - h200["samples"] == 300
    assert h200["pooled_gpus"] == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    # Chunk 4 is the same configurations on both: the H100 learns nothing more from it.
    assert models["h100"].meta["pooled_samples"] == models["h100"].meta["samples"]
    manifest = json.loads((tmp_path / "results/op-models/h200/manifest.json").read_text())
    assert [s["path"] for s in manifest["sources"]] == [
        "ops/h200/4.parquet", "ops/h100/4.parquet", "ops/h100/r9-1.parquet"
    ]  # fmt: skip
    log = (tmp_path / "logs/op-models/h200.log").read_text()
    assert "and 300 only its peers measured (2 tables)" in log
    # Chunk 4 holds no convolution: the H100's convolutions keep the H100's base time.
    assert h200["carried_over"] == {}
    assert "carried over" not in log


def test_a_tf32_off_configuration_of_op_space_data_also_reads_its_twins_tables(repo, tmp_path):
    _op_space_copy(repo, tmp_path)
    study = load_study({"models": [], "gpus": {}, "op_space": {"data": str(tmp_path / "ops")}})
    assert osw.op_models_gpus(study) == ["off", "on"]
    on = [str(tmp_path / f"ops/on/{c}.parquet") for c in ("4", "9")]
    off = [str(tmp_path / f"ops/off/{c}.parquet") for c in ("4", "9")]
    # Matched by what the tables record (same GPU, same dtype, TF32 on), not by name.
    # Both measured on the H100: no peers on another GPU to pool with.
    assert osw.op_model_inputs(study, "off") == {"chunks": off, "twin": on, "peers": []}
    assert osw.op_model_inputs(study, "on") == {"chunks": on, "twin": [], "peers": []}


def test_measured_op_models_train_on_the_studys_chunks_and_the_default_twins(repo):
    study = load_study_file(repo / "config" / "op-space.yaml")
    assert osw.op_models_gpus(study) == [
        "h100", "h200", "h100-notf32", "h200-notf32", "h200-cudnnbench"]  # fmt: skip
    # Every round's: round 1's 2,272 configurations in chunks of 250 (10 chunks), then
    # round 2's and round 3's 1,200 each (5 chunks, r2-0 to r2-4 and r3-0 to r3-4),
    # round 4's 120 (one chunk), round 5's 480 (two) and round 6's 720 (three); round 7's
    # 400 (two) with TF32 off alone; on the H100 alone round 8's 200 (one) and round 11's
    # 300 (two) with TF32 off, round 9's 400 (two) with TF32 on, round 10's 400 (two) off,
    # round 12's 400 (two) on and round 13's 400 (two) off, round 14's 400 (two) on and
    # round 15's 300 (two) off; on both GPUs the power rounds 16 (120, one) and 17
    # (60, one), with TF32 on and off; on the H200 alone round 18's 600 (three) and
    # round 19's 400 (two) with TF32 on, round 20's 400 (two) and 21's 300 (two) off,
    # round 22's 600 (three) on and round 23's 400 (two) off, round 24's 1,500 (six) on
    # and round 25's 1,250 (five) off, round 26's 750 (three) on and round 27's 750
    # (three) off, round 28's 250 (one) on, ..., rounds 54's 400 (two) and 56's 80 (one)
    # on and round 55's 80 (one) off.
    names = [
        *map(str, range(10)), *(f"r{r}-{c}" for r in (2, 3) for c in range(5)),
        "r4-0", "r5-0", "r5-1", "r6-0", "r6-1", "r6-2",
    ]  # fmt: skip
    raw = "results/op-space/raw/{}/{}.parquet"
    chunks = [raw.format("{}", c) for c in names]
    off = [*chunks, *(raw.format("{}", f"r7-{c}") for c in (0, 1))]
    only_h100_off = ("r8-0", "r10-0", "r10-1", "r11-0", "r11-1", "r13-0", "r13-1", "r15-0", "r15-1")
    h100_off = [*(c.format("h100-notf32") for c in off)]
    h100_off += [raw.format("h100-notf32", c) for c in only_h100_off]
    h100_on = [c.format("h100") for c in chunks]
    h100_on += [raw.format("h100", f"r{r}-{c}") for r in (9, 12, 14) for c in (0, 1)]
    power_rounds = [raw.format("{}", f"r{r}-0") for r in (16, 17)]
    h100_on += [c.format("h100") for c in power_rounds]
    h100_off += [c.format("h100-notf32") for c in power_rounds]
    h200_on = [c.format("h200") for c in (*chunks, *power_rounds)]
    h200_on += [
        raw.format("h200", c)
        for c in ("r18-0", "r18-1", "r18-2", "r19-0", "r19-1", "r22-0", "r22-1", "r22-2")
    ]
    h200_on += [raw.format("h200", f"r24-{c}") for c in range(6)]
    h200_on += [raw.format("h200", f"r26-{c}") for c in range(3)]
    h200_on += [raw.format("h200", "r28-0")]
    h200_on += [raw.format("h200", c) for c in ("r30-0", "r30-1", "r31-0", "r32-0")]
    h200_on += [raw.format("h200", c) for c in ("r33-0", "r33-1", "r34-0", "r36-0", "r38-0")]
    h200_on += [raw.format("h200", f"r40-{c}") for c in range(3)]
    h200_on += [raw.format("h200", f"r42-{c}") for c in range(2)]
    h200_on += [raw.format("h200", f"r{r}-{c}") for r in (44, 46, 48, 51, 52, 53) for c in range(2)]
    h200_on += [raw.format("h200", c) for c in ("r54-0", "r54-1", "r56-0", "r57-0", "r58-0")]
    h200_on += [raw.format("h200", "r59-0")]
    h200_off = [c.format("h200-notf32") for c in (*off, *power_rounds)]
    h200_off += [raw.format("h200-notf32", f"r{r}-{c}") for r in (20, 21, 23) for c in (0, 1)]
    h200_off += [raw.format("h200-notf32", f"r25-{c}") for c in range(5)]
    h200_off += [raw.format("h200-notf32", f"r27-{c}") for c in range(3)]
    h200_off += [raw.format("h200-notf32", c) for c in ("r29-0", "r35-0", "r37-0", "r39-0")]
    h200_off += [raw.format("h200-notf32", f"r41-{c}") for c in range(2)]
    h200_off += [raw.format("h200-notf32", f"r43-{c}") for c in range(2)]
    h200_off += [raw.format("h200-notf32", f"r{r}-{c}") for r in (45, 47, 49, 50) for c in range(2)]
    h200_off += [raw.format("h200-notf32", c) for c in ("r55-0", "r59-0")]
    # Pooled with the other GPU's configuration of its TF32 setting, the rounds only the
    # H100 measured included (op_space.model.pool_gpus, on by default); the families it
    # lacks from both TF32-on twins.
    assert osw.op_model_inputs(study, "h200-notf32") == {
        "chunks": h200_off,
        "twin": [*h200_on, *h100_on],
        "peers": h100_off,
    }
    # With cudnn_benchmark: the rounds every configuration measures (1-6), its
    # convolutions only; the rest from the H200's configuration without it, pooled.
    assert osw.op_model_inputs(study, "h200-cudnnbench") == {
        "chunks": [c.format("h200-cudnnbench") for c in chunks],
        "twin": [*h200_on, *h100_on],
        "peers": [],
    }
    assert osw.op_model_inputs(study, "h200") == {"chunks": h200_on, "twin": [], "peers": h100_on}
    assert osw.op_model_inputs(study, "h100") == {"chunks": h100_on, "twin": [], "peers": h200_on}
    assert osw.op_model_inputs(study, "h100-notf32") == {
        "chunks": h100_off,
        "twin": [*h100_on, *h200_on],
        "peers": h200_off,
    }
    config = yaml.safe_load((repo / "config" / "op-space.yaml").read_text())
    config["op_space"]["model"] = {"pool_gpus": False}
    alone = load_study(config)
    assert osw.op_model_inputs(alone, "h200-notf32") == {
        "chunks": h200_off,
        "twin": h200_on,
        "peers": [],
    }


def test_chunk_tables_without_a_usable_sample_stop_training_naming_them(repo, tmp_path):
    empty = str(repo / "data/op-space/h100-notf32/9.parquet")  # an empty chunk
    with pytest.raises(
        op_models_job.OpModelDataError, match=r"op models of off: no usable sample .*9\.parquet"
    ):
        op_models_job.run_train_op_models(
            "off", [empty], [], {}, tmp_path / "model", tmp_path / "log"
        )
    assert not (tmp_path / "model").exists()


def test_the_op_model_rules_code_version_follows_the_model_code(tmp_path, monkeypatch):
    copy = _package_copy(tmp_path)
    monkeypatch.setattr(wf, "PACKAGE_DIR", copy)
    before = wf.run_code_version(op_models_job.run_train_op_models)
    with open(copy / "opspace_measure.py", "a") as f:  # measures; trains nothing
        f.write("# a comment\n")
    assert wf.run_code_version(op_models_job.run_train_op_models) == before
    with open(copy / "model" / "opmodel.py", "a") as f:
        f.write("# a comment\n")
    assert wf.run_code_version(op_models_job.run_train_op_models) != before
