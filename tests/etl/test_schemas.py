"""The README documents every table as spark_etl.schemas declares it."""

from __future__ import annotations

from pathlib import Path

from spark_etl import schemas

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_lists_every_table_column_type_and_meaning() -> None:
    assert schemas.markdown() in README.read_text(), (
        "README's Audit ETL tables differ from spark_etl/schemas.py: paste schemas.markdown()"
    )


def test_every_table_is_partitioned_by_node() -> None:
    for table in schemas.TABLES:
        assert table.partition[0] is schemas.NODE
        assert not {c.name for c in table.columns} & {c.name for c in table.partition}
