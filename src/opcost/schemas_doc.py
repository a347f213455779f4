"""The Markdown tables of docs/formats.md, generated from :mod:`opcost.schemas` and
:mod:`opcost.record_schema`.

Each ``<!-- schema:NAME -->`` ... ``<!-- /schema -->`` block of a page holds the table of
the declaration whose key is NAME (``record`` for the benchmark record's fields).
Regenerate the blocks in place after a change to the declarations:

    python -m opcost.schemas_doc docs/formats.md
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from opcost import record_schema, schemas
from opcost.record_schema import RecordField
from opcost.schemas import Table


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def table_markdown(table: Table) -> str:
    """The Markdown table of ``table``'s columns, as in docs/formats.md."""
    lines = ["| column | dtype | unit | meaning |", "| --- | --- | --- | --- |"]
    for c in table.columns:
        if c.group:
            lines.append(f"| **{_cell(c.group)}** | | | |")
        lines.append(f"| `{c.name}` | {c.dtype} | {c.unit} | {_cell(c.meaning)} |")
    return "\n".join(lines)


def _range(f: RecordField) -> str:
    bounds = [
        f"{op} {b:g}"
        for op, b in ((">=", f.minimum), (">", f.above), ("<=", f.maximum))
        if b is not None
    ]
    return ", ".join(bounds)


def record_markdown() -> str:
    """The Markdown table of :data:`RECORD_FIELDS`, as in docs/formats.md."""
    lines = [
        "| key | type | unit | range | checked | meaning |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for key, f in record_schema.RECORD_FIELDS.items():
        types = " or ".join(f.types) + (" or null" if f.nullable and f.checked else "")
        checked = "yes" if f.checked else ""
        lines.append(
            f"| `{key}` | {types} | {f.unit} | {_range(f)} | {checked} | {_cell(f.meaning)} |"
        )
    return "\n".join(lines)


def doc_blocks() -> dict[str, str]:
    """Block name -> its generated Markdown, for each ``<!-- schema:NAME -->`` block."""
    blocks = {t.key: table_markdown(t) for t in schemas.TABLES}
    blocks["record"] = record_markdown()
    return blocks


_BLOCK_RE = re.compile(r"(<!-- schema:(\w+) -->\n)(.*?)(<!-- /schema -->)", re.DOTALL)


def render_doc(text: str) -> str:
    """``text`` (docs/formats.md) with every schema block regenerated.

    Raises:
        ValueError: a block names no known table.
    """
    blocks = doc_blocks()

    def replace(m: re.Match[str]) -> str:
        if m.group(2) not in blocks:
            raise ValueError(f"docs block schema:{m.group(2)} names no table of opcost.schemas")
        return m.group(1) + blocks[m.group(2)] + "\n" + m.group(4)

    return _BLOCK_RE.sub(replace, text)


def doc_block_names(text: str) -> list[str]:
    """The names of the schema blocks in ``text``, in order."""
    return [m.group(2) for m in _BLOCK_RE.finditer(text)]


def main(argv: list[str] | None = None) -> int:
    """Regenerate the schema blocks of the given Markdown files in place."""
    for path in map(Path, argv if argv is not None else sys.argv[1:]):
        path.write_text(render_doc(path.read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
