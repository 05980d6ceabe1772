"""Background asyncio tasks of the engine adapter, kept so they can be cancelled on stop and so
that a failure is logged instead of vanishing with the task."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from storage import StorageFailure

log = logging.getLogger(__name__)


class BackgroundTasks:
    def __init__(self) -> None:
        self._tasks: dict[asyncio.Task[Any], str] = {}

    def spawn(self, work: Coroutine[Any, Any, Any], what: str) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks[task] = what
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        what = self._tasks.pop(task, "task")
        error = None if task.cancelled() else task.exception()
        # A database failure was reported by the database and stops the node. Otherwise
        # the replica keeps waiting for the reply; its timers lead to a view change.
        if error is not None and not isinstance(error, StorageFailure):
            log.error("pbft %s failed", what, exc_info=error)

    async def cancel_all(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
