"""Tests for opcost.schemas and opcost.record_schema: one declaration per file format,
used by writers, readers and docs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from opcost import record_schema, schemas, schemas_doc
from opcost.model.features import CONDITIONS

REPO = Path(__file__).resolve().parents[1]
FORMATS_MD = REPO / "docs" / "formats.md"
DATA = REPO / "tests" / "data"


def test_formats_md_matches_the_schemas():
    text = FORMATS_MD.read_text()
    # Every table and the record have their block, once.
    assert sorted(schemas_doc.doc_block_names(text)) == sorted(schemas_doc.doc_blocks())
    assert schemas_doc.render_doc(text) == text, (
        "docs/formats.md and src/opcost/schemas.py or record_schema.py disagree: "
        "run `python -m opcost.schemas_doc docs/formats.md`"
    )


def test_a_changed_column_shows_in_the_doc_check(monkeypatch):
    text = FORMATS_MD.read_text()
    changed = schemas.Column("power_w", "float64", "kW", "something else")
    columns = tuple(changed if c.name == "power_w" else c for c in schemas.DATASET.columns)
    monkeypatch.setattr(schemas, "DATASET", schemas.Table("dataset", "x", columns))
    monkeypatch.setattr(schemas, "TABLES", (schemas.DATASET, *schemas.TABLES[1:]))
    rendered = schemas_doc.render_doc(text)
    assert rendered != text
    assert "| `power_w` | float64 | kW | something else |" in rendered


def test_a_block_naming_no_table_is_refused():
    with pytest.raises(ValueError, match="schema:nosuch"):
        schemas_doc.render_doc("<!-- schema:nosuch -->\n<!-- /schema -->\n")


def test_declarations_are_consistent():
    for table in schemas.TABLES:
        assert len(set(table.names)) == len(table.names), table.key
        assert all(c.dtype in schemas.DTYPES for c in table.columns), table.key
    assert set(schemas.TRAIN_COLUMNS) <= set(schemas.DATASET.names)
    assert set(CONDITIONS) <= set(schemas.TRAIN_COLUMNS)
    assert set(record_schema.REQUIRED_WHEN_OK) <= set(record_schema.RECORD_FIELDS)
    assert set(record_schema.GPU_ONLY_FIELDS) <= set(record_schema.RECORD_FIELDS)
    # Every record field the dataset copies is declared in the record.
    copied = {"gpu", "setting", "mode", "kind", "op_id", "model_input", "spec", "device"}
    assert copied <= set(record_schema.RECORD_FIELDS)


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_committed_tables_have_the_declared_columns_and_dtypes(gpu):
    dataset = pd.read_parquet(DATA / gpu / "dataset" / f"{gpu}.parquet")
    assert tuple(dataset.columns) == schemas.DATASET.names
    for column, dtype in schemas.DATASET.dtypes().items():
        assert dataset[column].dtype == pd.Series([], dtype=dtype).dtype or (
            dtype != "str" and str(dataset[column].dtype) == dtype
        ), column
    failed = pd.read_parquet(DATA / gpu / "dataset" / f"{gpu}.failed.parquet")
    assert tuple(failed.columns) == schemas.FAILED.names
    unique = pd.read_parquet(DATA / gpu / "ops" / "unique.parquet")
    assert tuple(unique.columns) == schemas.UNIQUE_OPS.names
    for path in (DATA / gpu / "ops").glob("*.parquet"):
        if path.name != "unique.parquet":
            assert tuple(pd.read_parquet(path).columns) == schemas.OPS.names, path


def test_evaluating_imports_no_torch():
    code = (
        "import sys, opcost.schemas, opcost.record_schema, opcost.evaluate, opcost.method\n"
        "import opcost.powerlog\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
