"""The unit tests' child processes (eth_call's EVM, the read process) run at the tests' own
priority, not the nodes' nice 19: `make test` runs the unit tests beside three other test
processes on two cores, where a nice-19 child got ~1% of a core and took over 60 s to start
(START_SECONDS: read calls failed "did not start within 60 s", and two calls meant to run at
once ran a minute apart). No unit test is about the priority itself; the integration tests'
nodes keep nice 19."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from chain.rpc import child_process


@pytest.fixture(autouse=True, scope="session")
def _children_at_the_tests_priority() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(child_process, "LOWEST_PRIORITY", os.getpriority(os.PRIO_PROCESS, 0))
        yield
