"""docs/etl.md documents every table as spark_etl.schemas declares it."""

from __future__ import annotations

from pathlib import Path

from spark_etl import schemas

ETL_PAGE = Path(__file__).resolve().parents[2] / "docs" / "etl.md"


def test_the_etl_page_lists_every_table_column_type_and_meaning() -> None:
    assert schemas.markdown() in ETL_PAGE.read_text(), (
        "docs/etl.md's tables differ from spark_etl/schemas.py: paste schemas.markdown()"
    )


def test_every_table_is_partitioned_by_node() -> None:
    for table in schemas.TABLES:
        assert table.partition[0] is schemas.NODE
        assert not {c.name for c in table.columns} & {c.name for c in table.partition}
