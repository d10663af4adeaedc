"""The event loop that awaits ``async def`` handlers: one thread per runner, started by the
first such call (docs/ARCHITECTURE.md, "An async handler waits without a thread").

A synchronous handler holds a thread for as long as it runs; a coroutine waiting on its
provider holds only its frame, so thousands of calls in flight cost no thread each. The
loop is shared by every async handler of the runner: a coroutine that blocks (a
synchronous client, ``time.sleep``, ``ctx.state``'s database calls) stalls them all.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import logging
import threading
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger("orch8.runner")


class HandlerLoop:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, coro: Coroutine[Any, Any, None]) -> cf.Future[None]:
        """Run ``coro`` on the loop (started on first use); RuntimeError once closed."""
        with self._lock:
            if self._closed:
                coro.close()
                raise RuntimeError("the handler loop is closed")
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=self._loop.run_forever, name="handler-loop", daemon=True
                )
                self._thread.start()
            return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def cancel_soon(self, task: asyncio.Task[Any]) -> None:
        """Cancel ``task`` from any thread (the watchdog's, at a deadline)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(task.cancel)

    def close(self, timeout: float = 5.0) -> None:
        """Cancel what still runs and stop the loop (the runner stopped past its grace
        period: those instances' leases run out, as with a thread left running)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            asyncio.get_running_loop().stop()

        with contextlib.suppress(RuntimeError):  # the loop already stopped
            asyncio.run_coroutine_threadsafe(cancel_all(), loop)
        thread.join(timeout)
        if thread.is_alive():
            log.warning("event=runner.handler_loop_stuck (a coroutine blocks its thread)")
            return
        loop.close()
