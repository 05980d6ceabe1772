"""An observer without a keystore: its transport key is DATADIR/nodekey, made on first use."""

from __future__ import annotations

from pathlib import Path

import pytest

from chain.errors import NodeError
from chain.node import NODEKEY, load_node_key


def test_the_node_key_is_made_once_private_and_kept(tmp_path: Path) -> None:
    key = load_node_key(tmp_path)
    assert (tmp_path / NODEKEY).stat().st_mode & 0o777 == 0o600
    assert load_node_key(tmp_path) == key


@pytest.mark.parametrize("content", ["not hex", "ab" * 16])
def test_a_bad_node_key_file_is_a_one_line_error(tmp_path: Path, content: str) -> None:
    (tmp_path / NODEKEY).write_text(content)
    with pytest.raises(NodeError, match="does not hold a 32-byte hex private key"):
        load_node_key(tmp_path)


def test_a_missing_data_directory_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(NodeError, match="cannot use node key"):
        load_node_key(tmp_path / "absent")
