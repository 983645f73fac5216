"""The Makefile rejects an invalid knob with one line listing the valid values, before installing anything."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CASES = {
    "PRESET=huge": "valid values: mlperf small tiny",
    "NODES=0": "NODES=0 is not valid; valid values: a positive integer",
    "NODES=-3": "NODES=-3 is not valid",
    "NODES=1.5": "NODES=1.5 is not valid",
    "GPUS_PER_NODE=0": "GPUS_PER_NODE=0 is not valid",
    "GPUS_PER_NODE=two": "GPUS_PER_NODE=two is not valid",
    "ITERS=0": "ITERS=0 is not valid",
    "WARMUP=-1": "WARMUP=-1 is not valid; valid values: an integer >= 0",
    "ENGINE=tensorflow": "ENGINE=tensorflow is not valid; valid values: harness torchrec",
}


@pytest.mark.parametrize("knob", sorted(CASES))
def test_invalid_knob_is_rejected(knob):
    out = subprocess.run(["make", "-s", "--no-print-directory", "check-bench-knobs", knob],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0
    assert CASES[knob] in out.stderr


def test_valid_knobs_pass():
    out = subprocess.run(["make", "-s", "check-bench-knobs", "PRESET=tiny", "NODES=16", "GPUS_PER_NODE=1",
                          "ENGINE=torchrec"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
