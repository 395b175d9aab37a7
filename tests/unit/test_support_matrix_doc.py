"""docs/support-matrix.md shows tests/matrix/results.json, which the integration tests check cell by cell."""

from tests.matrix import table


def test_the_doc_s_table_is_the_committed_results():
    assert table.doc_table() == table.render(table.read())


def test_every_cell_of_every_row_is_checked_or_refused():
    results = table.read()
    from tests.matrix.shapes import SHAPES

    assert list(results) == list(SHAPES)
    columns = {column for cells in results.values() for column in cells}
    assert len(columns) >= 17
    assert all(table.kind(status) in ("ok", "refused") for cells in results.values() for status in cells.values())
    assert all(set(cells) == columns for cells in results.values())
