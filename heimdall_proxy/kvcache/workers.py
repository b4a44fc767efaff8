"""What the KV-event worker processes of the gateway (kvcache.prepare) and of the conductor
(conductor.prepare) share: how a worker starts, and how long a broken pool is left alone.

Both run their decode-and-hash work in a one-process `ProcessPoolExecutor` that must neither
die noisily on the Ctrl-C its parent handles nor outlive a parent killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import threading
import time

#: Seconds a broken worker pool is left broken (batches handled inline) before a new one.
BROKEN_BACKOFF = 10.0


def worker_init() -> None:
    """The pool's initializer, run in each worker process."""
    # Ctrl-C reaches the whole process group: the parent shuts its pool down itself, so a
    # worker ignores it instead of dying with a traceback mid-batch.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A parent killed with SIGKILL cannot shut its pool down: the worker notices that its
    # parent is gone (it is re-parented) and exits instead of lingering.
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
