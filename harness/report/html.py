"""A report as a list of parts (headings, text, warnings, tables, images), rendered twice:
report.md (images beside it as files) and a self-contained report.html (images embedded as
base64, tables as HTML tables), from the same parts so the two never disagree."""

from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.2em;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 8px}th{background:#f0f0f0}td.n{text-align:right;font-variant-numeric:tabular-nums}
.warn{background:#fdecea;border-left:4px solid #c0392b;padding:6px 10px;margin:4px 0}
img{max-width:100%;border:1px solid #ddd;margin:.5em 0}figcaption{font-size:12px;color:#555}
p.note{font-size:13px;color:#444}"""


def fmt(value: object, *, pct: bool = False) -> str:
    """A cell as text: n/a for missing, percentages for fractions, 3 decimals for ms-sized numbers."""
    if value is None or value is pd.NA:
        return "n/a"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if not isinstance(value, (float, np.floating)):
        return str(value)
    v = float(value)
    if math.isnan(v):
        return "n/a"
    if pct:
        return f"{100 * v:.1f}%"
    if v == 0:
        return "0"
    if abs(v) >= 1e6 or abs(v) < 1e-3:
        return f"{v:.3g}"
    return f"{v:.1f}" if abs(v) >= 1000 else f"{v:.3f}"


def _is_pct(column: str) -> bool:
    return column == "share" or column.endswith("_frac")


def cells(df: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    header = [str(c) for c in df.columns]
    rows = [[fmt(v, pct=_is_pct(c)) for c, v in zip(header, row)] for row in df.itertuples(index=False)]
    return header, rows


@dataclass
class Doc:
    """An ordered list of parts; see the module docstring."""

    title: str
    parts: list[tuple] = field(default_factory=list)

    def h2(self, text: str) -> None:
        self.parts.append(("h2", text))

    def p(self, text: str) -> None:
        self.parts.append(("p", text))

    def bullets(self, lines: list[str]) -> None:
        if lines:
            self.parts.append(("ul", list(lines)))

    def findings(self, lines: list[str]) -> None:
        """The answer first: a "Findings" heading and its lines, meant to open the report."""
        self.h2("Findings")
        self.bullets(lines or ["nothing to report"])

    def warn(self, text: str) -> None:
        self.parts.append(("warn", text))

    def table(self, df: pd.DataFrame, *, index: bool = False) -> None:
        self.parts.append(("table", df.reset_index() if index else df))

    def image(self, path: Path | None, caption: str) -> None:
        if path is not None:
            self.parts.append(("img", Path(path), caption))

    def markdown(self) -> str:
        out = [f"# {self.title}", ""]
        for part in self.parts:
            kind = part[0]
            if kind == "h2":
                out += [f"## {part[1]}", ""]
            elif kind == "p":
                out += [part[1], ""]
            elif kind == "ul":
                out += [f"- {line}" for line in part[1]] + [""]
            elif kind == "warn":
                out += [f"> **!!** {part[1]}", ""]
            elif kind == "table":
                header, rows = cells(part[1])
                esc = lambda c: c.replace("|", "\\|")
                line = lambda r: "| " + " | ".join(map(esc, r)) + " |"
                align = ["---:" if _numeric(part[1], i) else "---" for i in range(len(header))]
                out += [line(header), "| " + " | ".join(align) + " |", *map(line, rows), ""]
            elif kind == "img":
                out += [f"![{part[2]}]({part[1].name})", "", f"*{part[2]}*", ""]
        return "\n".join(out)

    def html(self) -> str:
        e = html.escape
        body = [f"<h1>{e(self.title)}</h1>"]
        for part in self.parts:
            kind = part[0]
            if kind == "h2":
                body.append(f"<h2>{e(part[1])}</h2>")
            elif kind == "p":
                body.append(f"<p class=note>{e(part[1])}</p>")
            elif kind == "ul":
                body.append("<ul>" + "".join(f"<li>{e(x)}</li>" for x in part[1]) + "</ul>")
            elif kind == "warn":
                body.append(f"<div class=warn>{e(part[1])}</div>")
            elif kind == "table":
                header, rows = cells(part[1])
                num = [_numeric(part[1], i) for i in range(len(header))]
                th = "".join(f"<th>{e(h)}</th>" for h in header)
                trs = "".join("<tr>" + "".join(f"<td class=n>{e(c)}</td>" if n else f"<td>{e(c)}</td>"
                                               for c, n in zip(r, num)) + "</tr>" for r in rows)
                body.append(f"<table><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>")
            elif kind == "img":
                data = base64.b64encode(part[1].read_bytes()).decode("ascii")
                body.append(f"<figure><img alt=\"{e(part[2])}\" src=\"data:image/png;base64,{data}\">"
                            f"<figcaption>{e(part[2])}</figcaption></figure>")
        return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
                f"<title>{e(self.title)}</title><style>{CSS}</style></head><body>\n"
                + "\n".join(body) + "\n</body></html>\n")

    def write(self, out: Path) -> list[Path]:
        (out / "report.md").write_text(self.markdown())
        (out / "report.html").write_text(self.html())
        return [out / "report.md", out / "report.html"]


def _numeric(df: pd.DataFrame, i: int) -> bool:
    col = df.iloc[:, i]
    return pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col)
