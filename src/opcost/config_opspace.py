"""The study config's op-space section (``op_space``, docs/op-space.md): the checks
:func:`opcost.config.load_study` makes beyond the schema, and the GPU configurations of
an op-space data directory."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from opcost.errors import ConfigError
from opcost.names import NameError_, check_name


def check_op_space(op_space: dict[str, Any], gpus: Mapping[str, Any]) -> None:
    """Refuse, naming the field: later rounds without round 1's samples, a round's
    ``gpus`` that are none of the study's, a split round without pooling, and an
    ``op_space.data`` directory that holds no op-space chunk tables."""
    if op_space["rounds"] and not any(op_space["samples"].values()):
        raise ConfigError(
            "op_space.rounds: later rounds continue the sequences of op_space.samples "
            "(round 1), which samples nothing; give op_space.samples"
        )
    for i, round_ in enumerate(op_space["rounds"]):
        for name in round_.get("gpus", ()):
            if name not in gpus:
                raise ConfigError(
                    f"op_space.rounds.{i}.gpus: {name!r} is no GPU configuration of this "
                    f"study (gpus: {', '.join(gpus) or 'none'})"
                )
    _check_split_peers(op_space)
    if op_space["data"] is not None:
        op_space_data_gpus(op_space["data"])


def _check_split_peers(op_space: dict[str, Any]) -> None:
    """A round split between peers (``split_peers``) leaves each peer's models without the
    configurations the others measured unless they pool them (``model.pool_gpus``)."""
    rounds = [("op_space.split_peers", op_space)] + [
        (f"op_space.rounds.{i}.split_peers", r) for i, r in enumerate(op_space["rounds"])
    ]
    for name, round_ in rounds:
        if round_.get("split_peers") is not None and not op_space["model"]["pool_gpus"]:
            raise ConfigError(
                f"{name}: a round split between peers needs op_space.model.pool_gpus: "
                "true (each GPU's models learn the configurations its peers measured)"
            )


def op_space_data_gpus(data: str | Path) -> list[str]:
    """The GPU configurations of an op-space data directory (config ``op_space.data``):
    its subdirectories that hold chunk tables ``{gpu}/{chunk}.parquet``, sorted.

    Raises:
        ConfigError: naming ``op_space.data``: no such directory, no chunk table in it,
            or a subdirectory whose name cannot be a GPU configuration's.
    """
    where = "op_space.data"
    root = Path(data)
    if not root.is_dir():
        raise ConfigError(f"{where}: no such directory {str(data)!r}")
    names = sorted({p.parent.name for p in root.glob("*/*.parquet")})
    if not names:
        raise ConfigError(
            f"{where}: {str(data)!r} holds no op-space chunk tables ({{gpu}}/{{chunk}}.parquet, "
            "as data/op-space does)"
        )
    for name in names:
        try:
            check_name(name, f"{where}: {root / name}")
        except NameError_ as e:
            raise ConfigError(str(e)) from e
    return names
