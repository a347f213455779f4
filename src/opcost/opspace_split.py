"""A round of the op space split between peers: each configuration measured on one GPU.

The op models of a GPU configuration learn from the samples its peers on other GPUs
measured (the same numerics; ``op_space.model.pool_gpus``), carried over by the ratio of
the samples both measured (:mod:`opcost.model.peer_transfer`). So a round needs each
sampled configuration on one GPU of the pair only, plus enough on both to learn that
ratio from. A round with ``split_peers: share`` (config ``op_space``, round 1, or one of
``op_space.rounds``) is measured so:

* every configuration with a power window, and ``share`` of the others (spread evenly
  over each family's sequence), by every peer: busy power is learnt from a
  configuration's own windows only, and these are the pairs the rest is carried over by;
* the others in turn by each peer of the group, in the group's order (names sorted).

The samples table of the round records this as ``split_rank``: -1 for a configuration
every peer measures, else its place among the family's split configurations; member
``index`` of ``members`` measures those whose rank is ``index`` modulo ``members``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

#: ``split_rank`` of a configuration every peer measures.
EVERY_PEER = -1


def anchors(size: int, share: float) -> np.ndarray:
    """Which of a family's ``size`` configurations (in sequence order) every peer measures
    as pairs: ``share`` of them, spread evenly (as the power windows are)."""
    rank = np.arange(size)
    return np.floor((rank + 1) * share + 1e-9) > np.floor(rank * share + 1e-9)


def split_ranks(family: Sequence[str], power: Sequence[bool], share: float) -> np.ndarray:
    """``split_rank`` of each row of a round's samples table (module docstring), from its
    ``family`` and ``power`` columns in table order."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"split_peers must be within [0, 1], not {share}")
    frame = pd.DataFrame({"family": list(family), "power": list(power)})
    out = np.full(len(frame), EVERY_PEER, dtype=np.int64)
    for _, rows in frame.groupby("family", sort=False).groups.items():
        positions = np.asarray(rows)
        split = ~(anchors(len(positions), share) | frame["power"].to_numpy(bool)[positions])
        out[positions[split]] = np.arange(int(split.sum()))
    return out


def takes(split_rank: pd.Series | np.ndarray, index: int, members: int) -> np.ndarray:
    """Which rows member ``index`` of a group of ``members`` peers measures."""
    if not 0 <= index < members:
        raise ValueError(f"member {index} of a group of {members}")
    rank = np.asarray(split_rank, dtype=np.int64)
    return (rank == EVERY_PEER) | (rank % members == index)


def rows_at_most(
    counts: Mapping[str, int], power_samples: int, share: float, index: int, members: int
) -> int:
    """How many of a round's configurations member ``index`` of ``members`` measures, at
    most. The sampler may drop a few of a family's ``counts`` (above the size bounds),
    which moves its power windows, so this bounds the count: a family of ``n`` with ``a``
    configurations for every peer gives member ``index`` ``a + ceil((n - a - index) /
    members)``, which grows with ``n`` and ``a``, and ``a`` is at most its power windows
    plus its anchors."""
    total = 0
    for n in counts.values():
        every = min(n, min(power_samples, n) + int(anchors(n, share).sum()))
        total += every + max(0, math.ceil((n - every - index) / members))
    return total
