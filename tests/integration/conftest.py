"""Fixtures several integration modules share."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.demo_repo import make_demo


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One completed demo batch for the whole session; tests edit only copies of it."""
    return make_demo(tmp_path_factory.mktemp("demo"))
