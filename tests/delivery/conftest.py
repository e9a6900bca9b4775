import pytest

from tests.conftest import BACKENDS


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    """Every store test here that takes `db` runs on both backends (the inbox, conversation and job leases)."""
    return request.param
