"""A rank forked from the launcher's fork server (harness/launch/fork_server.py) is the server's
child, not the launcher's. torch ties a rank to its parent (its spawn wrapper asks for SIGINT when
the parent dies), which here is the server; and the server lives as long as any of its ranks holds
its pipe, so a launcher killed by SIGKILL would leave its ranks training for good. The rank watches
the launcher instead and sends itself the same SIGINT when it is gone."""

from __future__ import annotations

import os
import select
import signal
import threading


def stop_with_launcher(launcher_pid: int) -> None:
    """SIGINT to this process once `launcher_pid` has exited; nothing where the launcher is this
    process's parent (a spawned rank: torch's own tie does it)."""
    if launcher_pid == os.getppid():
        return
    try:
        fd = os.pidfd_open(launcher_pid)
    except ProcessLookupError:  # gone before the rank got here
        os.kill(os.getpid(), signal.SIGINT)
        return

    def watch() -> None:
        select.select([fd], [], [])  # readable once the process has exited
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()
