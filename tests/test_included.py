"""Measurements made elsewhere that a study includes (config ``include``, opcost.included),
checked against the shipped real data in data/."""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

import pandas as pd
import pytest
import yaml

from opcost import included
from opcost.config import ConfigError, load_study, load_study_file
from opcost.included import IncludedDataError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def in_repo(monkeypatch):
    """Include paths are relative to the working directory: the repository's."""
    monkeypatch.chdir(REPO)


def _default() -> dict:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def test_default_study_includes_the_four_shipped_configurations_of_both_studies(in_repo):
    study = load_study_file("config/config.yaml")
    assert study.gpus == {}
    assert study.model_inputs == ()
    assert sorted(study.evaluated_gpus) == ["h100", "h100-notf32", "h200", "h200-notf32"]
    for gpu, sources in study.included.items():
        assert [s.data for s in sources] == ["data/hopper", "data/hopper-large"]
        assert all(s.layout == "dataset" for s in sources)
        # 16 model-input sets at batch 1 and 8, 8 at batch 64: each has its op table.
        tables = included.op_tables(study, gpu)
        assert len(tables) == 24
        assert all(Path(t).is_file() for t in tables)
        assert sum("_64x3x224x224" in t for t in tables) == 8


def test_a_study_profiling_a_local_gpu_beside_the_shipped_data(in_repo):
    study = load_study_file("config/local-gpu.yaml")
    assert list(study.gpus) == ["local"]
    assert list(study.evaluated_gpus) == ["local", "h100", "h200", "h100-notf32", "h200-notf32"]
    # Its own op tables are its own extraction's, never the shipped ones.
    assert included.op_tables(study, "local")[0] == "results/ops/alexnet_1x3x224x224.parquet"
    assert included.op_tables(study, "h100")[0] == "data/hopper/ops/alexnet_1x3x224x224.parquet"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c["include"][0].update(config="config/nope.yaml"), "include.0.config: no such"),
        (lambda c: c["include"][1].update(data="data/nope"), "include.1.data: no such directory"),
        (lambda c: c["include"][0].update(gpus=["a100"]), "include.0.gpus: 'a100' is not"),
        # Nothing profiled, included or trained on (the default config's op-space data
        # alone would make it a study of op models).
        (lambda c: c.update(include=[], op_space={}), "gpus: the study neither profiles"),
        (
            lambda c: c.update(gpus={"h100": {"device": "cuda"}}, models=[]),
            "models: give at least one",
        ),
        (
            lambda c: c.update(
                gpus={"h100": {"device": "cuda"}},
                models=[{"model": "resnet18", "inputs": [[1, 3, 32, 32]]}],
            ),
            "include.0: 'h100' is also one of this study's gpus",
        ),
        # The same study twice under one name: its model-input sets would count twice.
        (lambda c: c["include"].append(dict(c["include"][0])), "include.2: 'h100' measured"),
    ],
)
def test_a_bad_include_fails_naming_the_field(in_repo, edit, message):
    config = _default()
    edit(config)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_study(config)


def test_two_includes_may_not_give_one_name_to_different_gpu_configurations(in_repo, tmp_path):
    other = yaml.safe_load((REPO / "config" / "hopper-large.yaml").read_text())
    other["gpus"]["h100"]["tf32"] = False
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
    config = _default()
    config["include"][1]["config"] = str(tmp_path / "other.yaml")
    with pytest.raises(ConfigError, match="include.1: 'h100' is another GPU configuration"):
        load_study(config)


def test_a_directory_without_a_configurations_data_skips_it_unless_named(in_repo, tmp_path):
    data = tmp_path / "partial"
    shutil.copytree(REPO / "data" / "hopper-large" / "ops", data / "ops")
    (data / "h200").mkdir()
    shutil.copy(REPO / "data/hopper-large/h200/raw_and_logs.tar.gz", data / "h200")
    config = {
        "include": [{"config": "config/hopper-large.yaml", "data": str(data)}],
        "gpus": {},
        "models": [],
    }
    assert list(load_study(config).evaluated_gpus) == ["h200"]
    config["include"][0]["gpus"] = ["h100"]
    with pytest.raises(ConfigError, match="include.0.gpus: .* holds no measurements of 'h100'"):
        load_study(config)


def test_shipped_archives_unpack_to_every_measurement_their_study_lists(in_repo, tmp_path):
    study = load_study_file("config/config.yaml")
    source = study.included["h100"][1]  # data/hopper-large
    included.unpack(source.archives, tmp_path / "h100")
    found, missing = included.raw_jsons(source, tmp_path / "h100")
    # config/hopper-large.yaml: 288 ops and 8 networks, in both modes (data/hopper-large).
    assert (len(found), missing) == (592, 0)
    assert all(p.with_suffix(".csv").is_file() for p in found)
    traces = list((tmp_path / "h100/results/raw/h100/default").glob("*/traces/*/*.json"))
    assert len(traces) == 592


def test_another_studys_working_directory_is_read_in_place(in_repo, tmp_path):
    work = tmp_path / "alice"
    included.unpack(["data/hopper-large/h200/raw_and_logs.tar.gz"], work)
    shutil.copytree(REPO / "data/hopper-large/ops", work / "results" / "ops")
    (work / "results/raw/h200/default/training/networks/vgg11_64x3x224x224.json").unlink()
    config = {
        "include": [{"config": "config/hopper-large.yaml", "data": str(work)}],
        "gpus": {},
        "models": [],
    }
    study = load_study(config)
    (source,) = study.included["h200"]
    assert source.layout == "study"
    assert included.roots(study, "h200") == [str(work)]
    found, missing = included.raw_jsons(source, work)
    assert (len(found), missing) == (591, 1)


def _tar(tmp_path: Path, member: tarfile.TarInfo, data: bytes = b"") -> str:
    path = tmp_path / "bad.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.addfile(member, io.BytesIO(data) if data else None)
    return str(path)


@pytest.mark.parametrize(
    "member",
    [
        tarfile.TarInfo("results/raw/h100/x.json"),  # fine alone: made a link below
        tarfile.TarInfo("../escape.json"),
        tarfile.TarInfo("notes/readme.txt"),
    ],
)
def test_an_archive_with_anything_but_files_under_results_and_logs_is_refused(tmp_path, member):
    if member.name.startswith("results"):
        member.type, member.linkname = tarfile.SYMTYPE, "/etc/passwd"
    dest = tmp_path / "out"
    with pytest.raises(IncludedDataError, match="holds .*results/ and logs/ only"):
        included.unpack([_tar(tmp_path, member)], dest)
    assert not any(dest.rglob("*.json"))


def test_a_corrupt_archive_is_refused_naming_it(tmp_path):
    bad = tmp_path / "raw_and_logs.tar.gz"
    bad.write_bytes(b"\x1f\x8b not gzip")
    with pytest.raises(IncludedDataError, match="raw_and_logs.tar.gz: cannot unpack"):
        included.unpack([str(bad)], tmp_path / "out")


def test_validation_uses_each_configurations_own_op_tables(in_repo):
    """A profiled configuration's op ids come from this torch's extraction, an included
    one's from the torch that measured it: no table is shared between them."""
    tables = included.op_tables_by_gpu(load_study_file("config/local-gpu.yaml"))
    shipped = set(tables["h100"])
    assert not shipped & set(tables["local"])
    assert shipped == set(tables["h200-notf32"])
    ops = pd.concat(pd.read_parquet(t, columns=["model_input"]) for t in tables["h100"])
    assert ops["model_input"].nunique() == 24


def test_every_shipped_profile_replaces_the_default_study_with_the_one_given():
    """Snakemake merges a --configfile into the Snakefile's config/config.yaml unless told
    to replace it: merged, the default study's `include` would join any study (and clash
    with its own h100)."""
    for path in sorted((REPO / "profiles").glob("*/config.yaml")):
        assert yaml.safe_load(path.read_text())["replace-workflow-config"] is True, path


@pytest.mark.slow
def test_a_study_given_with_configfile_includes_nothing_of_the_default(tmp_path):
    import subprocess
    import sys

    for name in ("config", "data"):
        (tmp_path / name).symlink_to(REPO / name)
    run = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-n"]
        + ["--configfile", "config/hopper-large.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "unpack_included" not in run.stdout
    assert "extract" in run.stdout
