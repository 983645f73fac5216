"""--profile FIRST:LAST: those iterations under torch.profiler, exported as a Chrome trace.

The trace (rankNNNNN/trace.json in the run folder) opens in Perfetto or chrome://tracing and
loads in Holistic Trace Analysis: host ops and, on a GPU, every kernel with its stream, each
stage an annotated range over what it launched (the timeline adds one a stage while the window
is open), so which kernels a stage ran, how long the device idled between them and whether the
host kept ahead can be read off, not guessed. The profiler costs time: the window's iterations
are slower than the others, so place it in the warm-up (e.g. --warmup 10 --profile 5:7) to keep
it out of every summary.
"""

from __future__ import annotations

from pathlib import Path

import torch


class ProfileWindow:
    """Starts torch.profiler before iteration `first` and exports its trace after `last`."""

    def __init__(self, window: tuple[int, int] | None, *, out: Path | None, cuda: bool) -> None:
        """window: (first, last) iterations, or None (nothing happens); out: the trace's path (None:
        no run folder, nothing is written, as for a train() called without a recorder)."""
        self.window, self.out, self.cuda = window, out, cuda
        self._prof: torch.profiler.profile | None = None

    @property
    def active(self) -> bool:
        return self._prof is not None

    def maybe_start(self, it: int) -> None:
        if self.window is None or self.out is None or it != self.window[0]:
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._prof = torch.profiler.profile(activities=activities, record_shapes=False, with_stack=False)
        self._prof.__enter__()

    def maybe_stop(self, it: int) -> None:
        if self._prof is None or it != self.window[1]:
            return
        self.close()

    def close(self) -> None:
        """Stop and export (after the window's last iteration, or when the run ends or fails inside it)."""
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        prof.export_chrome_trace(str(self.out))
