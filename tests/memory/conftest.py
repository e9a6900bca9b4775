import pytest

from tests.conftest import BACKENDS


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    """Every store contract test here runs on both backends."""
    return request.param
