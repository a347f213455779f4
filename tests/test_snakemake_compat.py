"""opcost.snakemake_compat refuses, in one line, a Snakemake it was not checked against."""

from __future__ import annotations

import pytest
import snakemake
import snakemake.api  # noqa: F401  (snakemake.dag alone is a circular import)
from snakemake.dag import DAG

from opcost import snakemake_compat


def test_the_installed_snakemake_fits_and_the_fix_is_installed() -> None:
    snakemake_compat.check_internals()
    snakemake_compat.apply()
    snakemake_compat.apply()  # once only: the original stays the one recorded
    assert DAG.update_groups is snakemake_compat.update_groups
    assert "group_job_factory.new" in snakemake_compat.inspect.getsource(
        DAG.update_groups.__opcost_original__
    )


def test_another_major_version_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snakemake, "__version__", "10.0.0")
    with pytest.raises(snakemake_compat.SnakemakeCompatError) as err:
        snakemake_compat.check_internals()
    message = str(err.value)
    assert "\n" not in message
    assert "Snakemake 10.0.0" in message
    assert "pip install 'snakemake>=9,<10'" in message


def test_missing_internals_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(DAG, "_check_groups")
    with pytest.raises(snakemake_compat.SnakemakeCompatError, match="DAG lacks _check_groups"):
        snakemake_compat.check_internals()
