"""A discrete-event timeline of steady-state iterations, every rank at once.

Each rank has three lanes: its host thread, its compute stream and its communication stream. An
iteration is a list of ops, the same list on every rank, with per-rank durations:

- `Launch`: the host spends `host_s` launching; the compute stream runs `dev_s` of work, starting
  no earlier than the launch begins, after the previous work on the stream and after the named
  collectives end, and ending no earlier than the last launch (a kernel cannot run before it is
  launched). On a synchronous device (CPU) the host runs the work itself, after the named
  collectives end (it blocks in their wait): host_s + dev_s.
- `Collective`: a collective on the communication stream. It starts when every rank has reached
  it (the latest rank's ready time: its compute stream's work so far, or its host when the data
  is on the host) and lasts the busiest rank's transfer plus the latency, after the collectives
  before it (one stream: NCCL's order). With a `pair_ratio` (a CPU: gloo runs a process group's
  collectives on two worker threads) two run at once, each at 1 / pair_ratio of its speed alone
  while they overlap (2: they share a core fairly, project.pair_ratio), and a third waits for one
  of them. On a CPU the host waits for it unless it was launched async (`blocks_host=False`).
- `Sync`: the host blocks until the named collective ends (`on`: a copy of its result waited for)
  and, with `drain=True`, until the compute stream drains (a pageable D2H copy's sync), plus
  `host_s`.
- `Host`: host-only time (between iterations, a thread hand-off).

Collective names may end in "@prev": the collective of that name in the previous iteration (the
pipelined input dist). A stage's time on a rank is from its start mark to the later of its host's
and its stream's end, as the harness's stage records time it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Launch:
    stage: str
    host_s: np.ndarray | float
    dev_s: np.ndarray | float
    waits: tuple[str, ...] = ()


@dataclass(frozen=True)
class Collective:
    name: str
    stage: str
    seconds: np.ndarray | float
    from_host: bool = False
    blocks_host: bool = True
    """On a CPU (gloo), whether the host thread waits for it here; False for one launched async and
    waited for later (the pipelined ids exchange, by the stage that names it in `waits`)."""


@dataclass(frozen=True)
class Sync:
    stage: str
    host_s: float = 0.0
    drain: bool = True
    on: str = ""


@dataclass(frozen=True)
class Host:
    stage: str
    host_s: np.ndarray | float


@dataclass
class Lanes:
    ranks: int
    async_device: bool
    host: np.ndarray = field(init=False)
    dev: np.ndarray = field(init=False)
    comm: np.ndarray = field(init=False)
    pair_ratio: float | None = None
    """Two collectives at once, each at 1 / pair_ratio of its speed alone (module docstring); None:
    one after the other."""
    done: dict[str, np.ndarray] = field(default_factory=dict)
    """(name@iteration) -> when that collective ended, per rank."""
    flight: list[tuple[str, float]] = field(default_factory=list)
    """(name@iteration, end) of the collectives in flight, at most two (pair_ratio only)."""
    comm_spans: dict[str, int] = field(default_factory=dict)
    """(name@iteration) -> its span's index in `spans`, so a collective slowed later ends there too."""
    spans: list[tuple[int, str, str, np.ndarray, np.ndarray]] = field(default_factory=list)
    """(iteration, stage, lane, start, end) of every op, per rank: the Gantt."""
    work: dict[tuple[int, str, str], np.ndarray] = field(default_factory=dict)
    """(iteration, stage, lane) -> the work its ops put on that lane, per rank, waits left out: the
    host's launches and host time, the device's kernels (on a CPU the host runs them), the
    collectives' transfer and latency. What bounds a period (render.bound) where spans, waits and
    all, cannot tell."""

    def add(self, it: int, stage: str, lane: str, seconds) -> None:
        key = (it, stage, lane)
        self.work[key] = self.work.get(key, np.zeros(self.ranks)) + seconds

    def __post_init__(self) -> None:
        self.host = np.zeros(self.ranks)
        self.dev = np.zeros(self.ranks)
        self.comm = np.zeros(self.ranks)


def _ended(lanes: Lanes, name: str, it: int) -> np.ndarray:
    base, _, rel = name.partition("@")
    key = f"{base}@{it - 1 if rel == 'prev' else it}"
    return lanes.done.get(key, np.zeros(lanes.ranks))


def _shared(lanes: Lanes, key: str, ready: float, seconds: float) -> tuple[float, float]:
    """(start, end) of a collective on two lanes that share the host (Lanes.pair_ratio): with one
    in flight both run at 1 / pair_ratio of their speed until the shorter ends, which moves the
    other's end; with two, it waits for the first to end. A collective of no seconds (none
    launched) takes no lane."""
    if seconds <= 0:
        return ready, ready
    flight = sorted((f for f in lanes.flight if f[1] > ready), key=lambda f: f[1])
    start = ready
    if len(flight) == 2:
        start, flight = flight[0][1], flight[1:]
    end = start + seconds
    if flight:
        other, other_end = flight[0]
        left, r = other_end - start, lanes.pair_ratio
        if left <= seconds:  # the other ends first, then this one runs alone
            other_end = start + r * left
            end = other_end + seconds - left
        else:
            end = start + r * seconds
            other_end = end + left - seconds
        lanes.done[other] = np.full(lanes.ranks, other_end)
        i = lanes.comm_spans[other]
        lanes.spans[i] = (*lanes.spans[i][:4], np.full(lanes.ranks, other_end))
        flight = [(other, other_end)]
    lanes.flight = [*flight, (key, end)]
    return start, end


def _step(lanes: Lanes, op, it: int) -> None:
    if isinstance(op, Launch):
        start_host = lanes.host.copy()
        ready = np.maximum(lanes.dev, start_host)
        for name in op.waits:
            ready = np.maximum(ready, _ended(lanes, name, it))
        if lanes.async_device:
            lanes.host = lanes.host + op.host_s
            lanes.dev = np.maximum(ready + op.dev_s, lanes.host)
        else:  # the host waits for the collectives named (gloo's wait), then runs the stage's ops itself
            lanes.host = ready + op.host_s + op.dev_s
            lanes.dev = lanes.host.copy()
        lanes.spans.append((it, op.stage, "host", start_host, lanes.host.copy()))
        lanes.spans.append((it, op.stage, "compute", ready, lanes.dev.copy()))
        lanes.add(it, op.stage, "host", op.host_s)
        lanes.add(it, op.stage, "device", op.dev_s)
    elif isinstance(op, Collective):
        ready = lanes.host if op.from_host else np.maximum(lanes.dev, lanes.host if not lanes.async_device else lanes.dev)
        key = f"{op.name}@{it}"
        if lanes.pair_ratio is None:
            start = float(np.max(np.maximum(ready, lanes.comm)))
            end = start + float(np.max(op.seconds))
            lanes.comm = np.full(lanes.ranks, end)
        else:
            start, end = _shared(lanes, key, float(np.max(ready)), float(np.max(op.seconds)))
        lanes.done[key] = np.full(lanes.ranks, end)
        lanes.comm_spans[key] = len(lanes.spans)
        lanes.spans.append((it, op.stage, "comm", np.full(lanes.ranks, start), np.full(lanes.ranks, end)))
        lanes.add(it, op.stage, "comm", op.seconds)
        if not lanes.async_device and op.blocks_host:  # gloo: the host thread waits for the collective
            lanes.host = np.maximum(lanes.host, end)
            lanes.dev = lanes.host.copy()
    elif isinstance(op, Sync):
        start = lanes.host.copy()
        until = lanes.dev if op.drain else lanes.host
        if op.on:
            until = np.maximum(until, _ended(lanes, op.on, it))
        lanes.host = np.maximum(lanes.host, until) + op.host_s
        lanes.spans.append((it, op.stage, "host", start, lanes.host.copy()))
        lanes.add(it, op.stage, "host", op.host_s)
    elif isinstance(op, Host):
        start = lanes.host.copy()
        lanes.host = lanes.host + op.host_s
        if not lanes.async_device:
            lanes.dev = np.maximum(lanes.dev, lanes.host)
        lanes.spans.append((it, op.stage, "host", start, lanes.host.copy()))
        lanes.add(it, op.stage, "host", op.host_s)
    else:
        raise TypeError(f"unknown op {op!r}")


@dataclass(frozen=True)
class Result:
    stage_s: dict[str, np.ndarray]
    """stage -> per rank seconds in the measured iteration."""
    period_s: float
    """Start of the measured iteration to the next one's, slowest rank."""
    window_s: np.ndarray
    """The timed window per rank (the five stages)."""
    spans: list
    iteration: int
    work_s: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)
    """(stage, lane) -> the measured iteration's work on that lane per rank, waits left out
    (Lanes.work; lanes host, device, comm)."""


def simulate(ops: list, *, ranks: int, async_device: bool, iterations: int = 4,
             pair_ratio: float | None = None) -> Result:
    """Run `iterations` iterations; report the one before last (steady state, a next start known).
    pair_ratio: two collectives at once (Lanes.pair_ratio)."""
    lanes = Lanes(ranks, async_device, pair_ratio=pair_ratio)
    starts, stage_s, window = [], {}, None
    measured = iterations - 2
    for it in range(iterations):
        mark = np.maximum(lanes.host, lanes.dev if async_device else lanes.host)
        starts.append(mark.copy())
        current = None
        for op in ops:
            if op.stage != current:
                if current is not None and it == measured:
                    end = np.maximum(lanes.host, lanes.dev)
                    stage_s[current] = stage_s.get(current, 0) + (end - mark)
                    mark = end
                elif current is not None:
                    mark = np.maximum(lanes.host, lanes.dev)
                current = op.stage
            _step(lanes, op, it)
        if it == measured:
            end = np.maximum(lanes.host, lanes.dev)
            stage_s[current] = stage_s.get(current, 0) + (end - mark)
    period = float(np.max(starts[measured + 1] - starts[measured]))
    window = sum(v for k, v in stage_s.items() if k != "between_iterations")
    work = {(st, lane): v for (it, st, lane), v in lanes.work.items() if it == measured}
    return Result(stage_s=stage_s, period_s=period, window_s=window, spans=lanes.spans, iteration=measured,
                  work_s=work)
