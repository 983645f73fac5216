"""Batches handed from a thread that makes them to the loop that takes them: a bounded queue the
maker stops feeding once the reader stops taking, and a join that fails loudly rather than leave
a thread behind (the batches-ahead thread and the input-dist thread both work this way)."""

from __future__ import annotations

import queue
import threading


def put_unless_stopped(out: queue.Queue, item: object, stop: threading.Event) -> bool:
    """Hand `item` over, unless the reader has stopped taking (it closed, failed or finished)."""
    while not stop.is_set():
        try:
            out.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def stop_and_join(thread: threading.Thread | None, stop: threading.Event, what: str) -> None:
    """Tell the thread to stop and wait for it (30 s at most, then RuntimeError naming `what`)."""
    stop.set()
    if thread is not None:
        thread.join(timeout=30)
        if thread.is_alive():
            raise RuntimeError(f"{what} did not stop within 30 s")
