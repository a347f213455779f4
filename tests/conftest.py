import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
DATA = TESTS / "data"

# User models for import-path tests live in tests/toymodels.
sys.path.insert(0, str(TESTS))


@pytest.fixture
def repo() -> Path:
    return REPO
