"""Rule ``train_op_models`` (target ``op_models``) through Snakemake's CLI, on a small copy
of the committed op-space data (data/op-space)."""

import json
import shutil
from pathlib import Path

import pytest
from test_workflow import _package_copy, job_counts, snakemake

from opcost import op_models_job
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
    assert sorted(models["on"].families) == ["attention", "matmul", "norm", "view"]
    # The families it lacks come from its TF32-on twin; its numerics stay its own.
    assert sorted(models["off"].families) == ["attention", "matmul", "norm", "view"]
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


def test_a_tf32_off_configuration_of_op_space_data_also_reads_its_twins_tables(repo, tmp_path):
    _op_space_copy(repo, tmp_path)
    study = load_study({"models": [], "gpus": {}, "op_space": {"data": str(tmp_path / "ops")}})
    assert wf.op_models_gpus(study) == ["off", "on"]
    on = [str(tmp_path / f"ops/on/{c}.parquet") for c in ("4", "9")]
    off = [str(tmp_path / f"ops/off/{c}.parquet") for c in ("4", "9")]
    # Matched by what the tables record (same GPU, same dtype, TF32 on), not by name.
    assert wf.op_model_inputs(study, "off") == {"chunks": off, "twin": on}
    assert wf.op_model_inputs(study, "on") == {"chunks": on, "twin": []}


def test_measured_op_models_train_on_the_studys_chunks_and_the_tf32_twins(repo):
    study = load_study_file(repo / "config" / "op-space.yaml")
    assert wf.op_models_gpus(study) == ["h100", "h200", "h100-notf32", "h200-notf32"]
    # Every round's: round 1's 2,272 configurations in chunks of 250 (10 chunks), then
    # round 2's and round 3's 1,200 each (5 chunks, r2-0 to r2-4 and r3-0 to r3-4),
    # round 4's 120 (one chunk), round 5's 480 (two) and round 6's 720 (three); round 7's
    # 400 (two) with TF32 off alone, round 8's 200 (one) on the H100 alone.
    names = [
        *map(str, range(10)), *(f"r{r}-{c}" for r in (2, 3) for c in range(5)),
        "r4-0", "r5-0", "r5-1", "r6-0", "r6-1", "r6-2",
    ]  # fmt: skip
    chunks = [f"results/op-space/raw/{{}}/{c}.parquet" for c in names]
    off = [*chunks, *(f"results/op-space/raw/{{}}/r7-{c}.parquet" for c in (0, 1))]
    assert wf.op_model_inputs(study, "h200-notf32") == {
        "chunks": [c.format("h200-notf32") for c in off],
        "twin": [c.format("h200") for c in chunks],
    }
    assert wf.op_model_inputs(study, "h200")["twin"] == []
    assert wf.op_model_inputs(study, "h100-notf32")["chunks"][-3:] == [
        f"results/op-space/raw/h100-notf32/{c}.parquet" for c in ("r7-0", "r7-1", "r8-0")
    ]


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
