"""A redis-server of a test's own: loopback, no persistence, started and stopped around the test
(the parameter store's and the hardening tests' real Redis)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def redis_server(tmp_path: Path, *extra: str):
    """A redis-server of the test's own on a loopback port; its port."""
    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server on this machine (make test installs the distribution's package)")
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                             "no", "--dir", str(tmp_path), *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail(f"redis-server did not start on port {port}")
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)
