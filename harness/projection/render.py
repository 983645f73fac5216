"""The projected report: stage table, a text Gantt of one rank, findings, the flag waterfall and
every assumption with its source; all marked "projected". Markdown, plus a waterfall PNG drawn by
harness/report/plots.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from harness.names import STAGES
from harness.projection.hardware import Profile
from harness.projection.project import Calibration, Projection

PUBLISHED = (("TorchRec published baseline step, 16 DGX H100", 7.6), ("TorchRec published optimized step", 3.4),
             ("MLPerf record step, 16 DGX H100", 2.3))
MISS = 0.30


def stage_table(p: Projection) -> pd.DataFrame:
    rows = []
    for s in (*STAGES, "between_iterations"):
        v = p.result.stage_s[s] * 1e3
        rows.append({"stage": s, "max_ms": float(np.max(v)), "mean_ms": float(np.mean(v)), "min_ms": float(np.min(v)),
                     "share": float(np.max(v)) / p.period_ms if p.period_ms else 0.0})
    return pd.DataFrame(rows)


def gantt(p: Projection, rank: int = 0, width: int = 72) -> str:
    spans = [(st, lane, float(a[rank]), float(b[rank])) for it, st, lane, a, b in p.result.spans if it == p.result.iteration]
    t0 = min(a for _, _, a, _ in spans)
    t1 = max(t0 + p.result.period_s, max(b for *_, b in spans))
    scale = width / max(t1 - t0, 1e-12)
    out = [f"rank {rank}, one iteration ({(t1 - t0) * 1e3:.2f} ms across; letters: i input_dist, f emb_fwd, d dense_fwd_bwd, "
           "b emb_bwd, u dense_update, . between)"]
    letter = {"input_dist": "i", "emb_fwd": "f", "dense_fwd_bwd": "d", "emb_bwd": "b", "dense_update": "u",
              "between_iterations": "."}
    for lane in ("host", "compute", "comm"):
        row = [" "] * width
        for st, ln, a, b in spans:
            if ln == lane and b > a:
                for x in range(int((a - t0) * scale), min(width, max(int((b - t0) * scale), int((a - t0) * scale) + 1))):
                    row[x] = letter[st]
        out.append(f"{lane:>8} |{''.join(row)}|")
    return "\n".join(out)


def waterfall(base: Projection, alone: dict[str, Projection], every: Projection) -> pd.DataFrame:
    rows = [{"config": "baseline (no flag)", "period_ms": base.period_ms, "vs_baseline": 1.0}]
    for flag, p in alone.items():
        rows.append({"config": f"+{flag} alone", "period_ms": p.period_ms, "vs_baseline": p.period_ms / base.period_ms})
    rows.append({"config": "all flags", "period_ms": every.period_ms, "vs_baseline": every.period_ms / base.period_ms})
    return pd.DataFrame(rows)


def _md(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r) + " |")
    return "\n".join(lines)


def assumptions_table(profile: Profile, cal: Calibration) -> pd.DataFrame:
    rows = [dict(figure=k, value=v, source=s, note=n) for k, v, s, n in profile.assumptions()]
    rows += [dict(figure=f"host_fixed_{s}", value=f"{v * 1e3:.3f} ms", source=cal.sources.get(f"host_fixed_{s}", ""),
                  note="applied to every projected configuration") for s, v in cal.host_fixed_s.items()]
    rows.append(dict(figure="between_iterations", value=f"{cal.between_s * 1e3:.3f} ms", source=cal.sources.get("between_s", ""),
                     note="host-side batch and records; the same on every configuration"))
    return pd.DataFrame(rows)


def findings(base: Projection, every: Projection) -> list[str]:
    out = []
    for p in (base, every):
        st = stage_table(p)
        top = st.iloc[st["max_ms"].idxmax()]
        out.append(f"{p.label}: projected period {p.period_ms:.2f} ms (timed window {p.window_ms:.2f} ms), "
                   f"dominant stage {top['stage']} {top['max_ms']:.2f} ms ({top['share']:.0%})")
    out.append(f"projected ratio baseline/all flags: {base.period_ms / every.period_ms:.2f}x")
    return out


def against_published(base: Projection, every: Projection) -> list[str]:
    """Beside the published figures; where the model misses by more than MISS, the stage it cannot explain."""
    pairs = ((base, 7.6, "TorchRec baseline 7.6 ms"), (every, 3.4, "TorchRec optimized 3.4 ms"), (every, 2.3, "MLPerf record ~2.3 ms"))
    out = []
    for p, ms, name in pairs:
        err = p.period_ms / ms - 1
        line = f"{p.label} {p.period_ms:.2f} ms vs {name}: {err:+.0%}"
        if abs(err) > MISS:
            st = stage_table(p).set_index("stage")["max_ms"]
            line += f" (> {MISS:.0%}: largest projected stage {st.idxmax()} {st.max():.2f} ms; the window without between_iterations " \
                    f"is {p.window_ms:.2f} ms)"
        out.append(line)
    out.append(f"ratio {base.period_ms / every.period_ms:.2f}x vs published 7.6/3.4 = 2.24x")
    return out


def write(out: Path, *, title: str, base: Projection, alone: dict, every: Projection, main: Projection,
          profile: Profile, cal: Calibration, extra: list[str]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    wf = waterfall(base, alone, every)
    text = [f"# {title} (PROJECTED, not measured)", "", "## Findings (projected)", ""]
    text += [f"- {x}" for x in findings(base, every) + against_published(base, every) + extra]
    text += ["", f"## Stage table (projected: {main.label})", "", _md(stage_table(main)), "",
             "## Timeline (projected)", "", "```", gantt(main), "```", "",
             "## Flag waterfall (projected)", "", _md(wf), "", "## Assumptions and sources", "",
             _md(assumptions_table(profile, cal)), ""]
    path = out / "projection.md"
    path.write_text("\n".join(text))
    stage_table(main).to_csv(out / "stages.csv", index=False)
    wf.to_csv(out / "waterfall.csv", index=False)
    return path
