"""op_tables.within_budget on the committed H100 op-space tables (data/op-space/h100)."""

from __future__ import annotations

import glob
import math

import pandas as pd
import pytest

from opcost.model.op_tables import within_budget


@pytest.fixture(scope="module")
def h100() -> pd.DataFrame:
    files = sorted(glob.glob("data/op-space/h100/*.parquet"))
    assert files, "data/op-space/h100 holds no chunk table"
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def test_a_budget_keeps_the_first_measured_ops_and_fits(h100: pd.DataFrame) -> None:
    kept = within_budget(h100, 30)
    rest = h100.drop(index=kept.index)
    assert 0 < len(kept) < len(h100)
    assert kept["measure_s"].sum() <= 30 * 60
    # a prefix in measuring order: every kept row finished before every dropped one
    assert kept["finished_unix_s"].max() <= rest["finished_unix_s"].min()
    # and the next row measured would not have fit
    next_cost = rest.loc[rest["finished_unix_s"].idxmin(), "measure_s"]
    assert kept["measure_s"].sum() + next_cost > 30 * 60
    # round 1 (chunks 0-9, 13.7 min on the H100) lies within the first 30 minutes, rows
    # as they are
    round1 = pd.concat([pd.read_parquet(f"data/op-space/h100/{i}.parquet") for i in range(10)])
    key = ["op_id", "mode", "finished_unix_s"]
    assert len(round1.merge(kept[key], on=key)) == len(round1)


def test_a_random_budget_thins_every_round_alike(h100: pd.DataFrame) -> None:
    kept = within_budget(h100, 30, order="random", seed=3)
    assert kept["measure_s"].sum() <= 30 * 60
    assert kept["measure_s"].sum() > 29 * 60  # filled up to the last op id that fits
    # whole op ids, each with all its rows
    assert len(kept) == h100["op_id"].isin(set(kept["op_id"])).sum()
    # about half the study's time (59.6 min), so about half of round 1 and of round 14
    for chunks in (range(10), ("r14-0", "r14-1")):
        ids = set(
            pd.concat([pd.read_parquet(f"data/op-space/h100/{c}.parquet") for c in chunks])["op_id"]
        )
        share = len(ids & set(kept["op_id"])) / len(ids)
        assert 0.4 < share < 0.6, (chunks, share)
    # the seed decides which; the same seed the same
    again = within_budget(h100, 30, order="random", seed=3)
    other = within_budget(h100, 30, order="random", seed=4)
    assert again.index.equals(kept.index)
    assert not other.index.equals(kept.index)
    with pytest.raises(ValueError, match="order"):
        within_budget(h100, 30, order="cheapest")


def test_the_whole_study_and_none(h100: pd.DataFrame) -> None:
    total_min = h100["measure_s"].sum() / 60
    for order in ("measured", "random"):
        assert len(within_budget(h100, math.ceil(total_min), order)) == len(h100)
        assert within_budget(h100, 0, order).empty
    with pytest.raises(ValueError, match="minutes"):
        within_budget(h100, -1)
    with pytest.raises(ValueError, match="minutes"):
        within_budget(h100, float("nan"))
