"""Reports of every rule family: verdict JSON, a Markdown table in the layout of the paper's table
for that test, and a figure in the layout of its figure.

Each family module offers `markdown(verdict) -> str` and `figure(verdict, analyzed, path)`; the
rule spec's `report` key names the module (default: the generic tables and Fig. 1 layout). A
report that reads parameters of its own (a figure's bin) lists them in `REPORT_PARAMS`, so a spec
naming that report without them is refused when it is loaded (analysis/rulecheck.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from analysis.figure_process import FigureProcess, draw_in_process

FAMILIES = ("e2", "basin", "toolslow", "shed", "rescue", "cut", "mirror", "e0b", "persistence", "scores")
REPORT_PARAMS: dict[str, dict[str, str]] = {
    "mirror": {"completions_bin": "the bin (s) of the figure's completions and sessions-in-system means"},
}


def family_of(verdict: Mapping[str, Any]) -> str:
    """The report module's name the verdict's rule spec names (`report`; default generic)."""
    name = (verdict.get("rule_spec") or {}).get("report") or "generic"
    return name if name in FAMILIES else "generic"


def module_for(verdict: Mapping[str, Any]) -> Any:
    return importlib.import_module(f"analysis.reports.{family_of(verdict)}")


def write_report(
    verdict: Mapping[str, Any],
    analyzed: Sequence[Any],
    out_dir: Path | str,
    *,
    figures: FigureProcess | None = None,
) -> tuple[dict[str, Path], str]:
    """verdict.json, report.md and figure.png in out_dir; returns the paths and the Markdown.

    With `figures` (a started figure process, analysis/figure_process.py) the figure is
    drawn there while the verdict and the Markdown are written here."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    family = family_of(verdict)
    figure_path = out / "figure.png"
    if figures is not None:
        figures.submit(family, verdict, analyzed, figure_path)
    vj = out / "verdict.json"
    vj.write_bytes(orjson.dumps(verdict, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    md = module_for(verdict).markdown(verdict)
    rp = out / "report.md"
    rp.write_text(md + "\n\n![figure](figure.png)\n")
    fig = figures.result() if figures is not None else draw_in_process(family, verdict, analyzed, figure_path)
    return {"verdict": vj, "report": rp, "figure": fig}, md
