"""A round of the op space split between peers (config ``split_peers``,
:mod:`opcost.opspace_split`): which peer measures which configuration, the chunks each
measures, the config's checks, and a real Snakemake run of a split study on two CPU
configurations."""

import json

import numpy as np
import pandas as pd
import pytest
from test_workflow import snakemake

from opcost import opspace_measure as om
from opcost import opspace_split as sp
from opcost import opspace_workflow as osw
from opcost.config import ConfigError, load_study
from opcost.errors import OpcostError


def _power(size: int, k: int) -> np.ndarray:
    """The power windows of a family of ``size`` (rule op_space_samples' marks)."""
    rank = np.arange(size)
    return (rank + 1) * k // max(size, 1) > rank * k // max(size, 1)


def _config(split_round_1=0.25, rounds=(), pool=True):
    peer = {"device": "cpu", "tf32": True, "dtype": "float32"}
    return {
        "models": [],
        "modes": ["inference", "training"],
        "gpus": {"a": {**peer, "gpu_name": "A"}, "b": {**peer, "gpu_name": "B"}},
        "op_space": {
            "samples": {"activation": 5, "view": 3},
            "power_samples": 1,
            "chunk_size": 2,
            "seed": 2,
            "split_peers": split_round_1,
            "rounds": [dict(r) for r in rounds],
            "model": {"pool_gpus": pool},
        },
    }


# -- which peer measures which configuration ---------------------------------------------------


@pytest.mark.parametrize("members", [2, 3])
@pytest.mark.parametrize("share", [0.0, 0.2, 0.5, 1.0])
def test_every_configuration_is_measured_and_anchors_and_windows_by_every_peer(members, share):
    family = ["conv"] * 40 + ["norm"] * 7 + ["view"] * 1
    power = np.concatenate([_power(40, 3), _power(7, 3), _power(1, 3)])
    ranks = sp.split_ranks(family, power, share)
    takes = np.array([sp.takes(ranks, i, members) for i in range(members)])
    assert takes.any(axis=0).all()  # every configuration is measured
    every = takes.all(axis=0)
    assert every[power].all()  # every power window on every peer
    frame = pd.DataFrame({"family": family, "every": every, "power": power})
    for name, rows in frame.groupby("family"):
        n = len(rows)
        anchors_ = int(np.floor(n * share + 1e-9))
        # the anchors are `share` of the family, spread evenly (here none a window too)
        assert anchors_ <= rows["every"].sum() <= anchors_ + rows["power"].sum(), name
        # the rest alternates: the members' counts differ by at most one
        own = [int(t[rows.index][~rows["every"].to_numpy()].sum()) for t in takes]
        assert max(own) - min(own) <= 1, name
        assert sum(own) == n - rows["every"].sum()
    if members > 1 and share < 1:
        assert not every.all()


def test_the_anchors_are_spread_over_the_sequence():
    assert sp.anchors(10, 0.2).tolist() == [False, False, False, False, True] * 2
    assert sp.anchors(3, 0.0).tolist() == [False] * 3
    assert sp.anchors(3, 1.0).all()


@pytest.mark.parametrize("members", [1, 2, 3])
@pytest.mark.parametrize("share", [0.0, 0.2, 0.5])
@pytest.mark.parametrize("k", [0, 2, 5])
def test_the_chunk_count_bounds_what_a_member_measures_if_the_sampler_drops_some(members, share, k):
    for n in range(0, 41):
        for index in range(members):
            bound = sp.rows_at_most({"conv": n}, k, share, index, members)
            for dropped in range(0, min(n, 5) + 1):
                size = n - dropped
                ranks = sp.split_ranks(["conv"] * size, _power(size, k), share)
                assert sp.takes(ranks, index, members).sum() <= bound, (n, size, index)


def test_a_member_outside_its_group_is_refused():
    with pytest.raises(ValueError, match="member 2 of a group of 2"):
        sp.takes(np.array([0, 1]), 2, 2)
    with pytest.raises(ValueError, match="within"):
        sp.split_ranks(["conv"], [False], 1.5)


# -- the study's chunks --------------------------------------------------------------------------


def test_a_split_round_gives_each_peer_its_share_of_the_chunks():
    round_2 = {"samples": {"elementwise": 9}, "power_samples": 0, "split_peers": 0.0}
    study = load_study(_config(rounds=[round_2, {"samples": {"elementwise": 3}}]))
    assert osw.gpu_peers(study, "a") == ["b"]
    assert [osw.op_space_split(study, 1, g) for g in ("a", "b")] == [(0, 2), (1, 2)]
    assert osw.op_space_split(study, 3, "a") is None  # round 3 is not split
    # Round 1: activation 5 (1 window, 1 anchor, 3 split: a takes 2), view 3 (1 window,
    # 2 split: 1 each): at most 6 for a, 5 for b, against 8 unsplit: chunks of 2.
    assert osw.op_space_chunks(study, 1, "a") == [0, 1, 2]
    assert osw.op_space_chunks(study, 1, "b") == [0, 1, 2]
    assert osw.op_space_chunks(study, 1) == [0, 1, 2, 3]
    # Round 2: 9 configurations, none for both: 5 and 4, chunks 3 and 2.
    assert osw.op_space_chunks(study, 2, "a") == [0, 1, 2]
    assert osw.op_space_chunks(study, 2, "b") == [0, 1]
    assert osw.op_space_chunk_names(study, "b") == ["0", "1", "2", "r2-0", "r2-1", "r3-0", "r3-1"]
    # The split is part of a round's sampling settings only where it is set.
    assert osw.op_space_sampling_params(study)["split_peers"] == 0.25
    assert "split_peers" not in osw.op_space_round_params(study, 3)


def test_a_peer_that_does_not_measure_the_round_leaves_it_whole():
    round_2 = {"samples": {"elementwise": 4}, "split_peers": 0.2, "gpus": ["a"]}
    study = load_study(_config(rounds=[round_2]))
    assert osw.op_space_split(study, 2, "a") is None
    assert osw.op_space_chunks(study, 2, "a") == [0, 1]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"pool": False},
            r"op_space\.split_peers: a round split between peers needs "
            r"op_space\.model\.pool_gpus: true",
        ),
        (
            {"pool": False, "split_round_1": None, "rounds": [{"samples": {"cat": 2},
                                                                "split_peers": 0.5}]},
            r"op_space\.rounds\.0\.split_peers: a round split between peers needs",
        ),
        ({"split_round_1": 1.5}, r"op_space\.split_peers: 1\.5 is greater than the maximum of 1"),
    ],
)  # fmt: skip
def test_a_split_that_cannot_hold_fails_at_config_load(change, message):
    with pytest.raises(ConfigError, match=message):
        load_study(_config(**change))


def test_the_measuring_job_takes_its_members_configurations(tmp_path):
    study = load_study(_config(split_round_1=0.5))
    path = tmp_path / "samples.parquet"
    osw.run_op_space_samples(osw.op_space_sampling_params(study), str(path))
    samples = pd.read_parquet(path)
    measured = {}
    for gpu in ("a", "b"):
        ids = []
        for chunk in osw.op_space_chunks(study, 1, gpu):
            out = tmp_path / gpu / f"{chunk}.parquet"
            om.measure_chunk_file(
                gpu=study.gpus[gpu], profile_config={}, samples_path=path, chunk=chunk,
                chunk_size=2, out_path=out, split=osw.op_space_split(study, 1, gpu),
            )  # fmt: skip
            ids += pd.read_parquet(out)["op_id"].drop_duplicates().tolist()
        measured[gpu] = ids
    both = samples.loc[samples["split_rank"] == sp.EVERY_PEER, "op_id"]
    assert set(measured["a"]) | set(measured["b"]) == set(samples["op_id"])
    assert set(measured["a"]) & set(measured["b"]) == set(both)
    assert set(samples.loc[samples["power"], "op_id"]) <= set(both)
    assert len(set(measured["a"])) < len(samples)


def test_a_samples_table_without_the_split_is_refused(tmp_path):
    study = load_study(_config(split_round_1=None))
    path = tmp_path / "samples.parquet"
    osw.run_op_space_samples(osw.op_space_sampling_params(study), str(path))
    with pytest.raises(OpcostError, match="no split_rank column"):
        om.measure_chunk_file(
            gpu=study.gpus["a"], profile_config={}, samples_path=path, chunk=0,
            chunk_size=2, out_path=tmp_path / "0.parquet", split=(0, 2),
        )  # fmt: skip


# -- the pipeline ----------------------------------------------------------------------------


@pytest.mark.slow
def test_snakemake_measures_a_split_round_once_between_the_peers(repo, tmp_path):
    config = _config(split_round_1=0.25)
    config["op_space"]["samples"] = {"activation": 6, "view": 2}
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config))
    run = snakemake(repo, tmp_path, "op_space_raw", "--configfile", str(path), "--cores", "2")
    assert run.returncode == 0, run.stderr[-4000:]
    samples = pd.read_parquet(tmp_path / "results/op-space/samples.parquet")
    raw = tmp_path / "results/op-space/raw"
    ids = {
        gpu: set(pd.concat([pd.read_parquet(p) for p in (raw / gpu).glob("*.parquet")])["op_id"])
        for gpu in ("a", "b")
    }
    assert ids["a"] | ids["b"] == set(samples["op_id"])
    both = set(samples.loc[samples["split_rank"] == sp.EVERY_PEER, "op_id"])
    assert ids["a"] & ids["b"] == both
    assert both < set(samples["op_id"])
