"""One self-contained HTML page per test (`agentload report TESTDIR --html`).

What a reviewer needs to check a registered test from one file: the verdict per rate with each
run's state and the conditions that decided it, the paper-style tables, the figures, the
predictions scored with their blindness labels, the provenance timeline and verification, the
registration and its hash, and links to every run directory and raw table.

Self-contained: CSS, script, data and images are inside the page (images as data URIs, charts
drawn as SVG by the embedded script from embedded JSON); nothing is fetched, so the page works
offline and from a file. Without script the static figure (the Markdown report's PNG) still
shows. Generated from the same records as the Markdown report: the verdict JSON, the report.md
beside it (rendered, not rewritten), the figure.png beside it, and the run directories the
verdict judged (the charts use the figure's own series function).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from harness.atomic import write_text_atomic
from review.html.figures import data_uri, fig1_charts, json_script
from review.html.markdown import render
from review.html.records import (
    generated_line,
    predictions_section,
    provenance_section,
    raw_records,
    registration_section,
    runs_section,
)
from review.html.verdict import absent, badge, esc, verdict_section
from review.status import collect_status
from review.status_model import TestStatus
from review.testdir import PRESENT, TestDir

SECTIONS = [
    ("status", "Where the test stands"),
    ("verdict", "Verdict"),
    ("tables", "Tables"),
    ("figures", "Figures"),
    ("predictions", "Predictions"),
    ("provenance", "Provenance"),
    ("registration", "Registration"),
    ("runs", "Runs and raw records"),
]


def _asset(name: str) -> str:
    return resources.files("review.html").joinpath("assets", name).read_text(encoding="utf-8")


def _summary(st: TestStatus) -> str:
    r, p, j, ru, v, pv = st.registration, st.predictions, st.jobs, st.runs, st.verdict, st.provenance
    items = []

    def item(k: str, body: str) -> None:
        items.append(f"<div class='item'><div class='k'>{esc(k)}</div><div class='v'>{body}</div></div>")

    item(
        "registration",
        f"{esc(r.name)} {badge(r.status, 'PASS' if r.status == 'FILLED' else 'INCOMPLETE')}<br><code>{esc(r.sha256)}"
        "</code>"
        if r.state == PRESENT
        else f"<span class='muted'>{esc(r.state)}: {esc(r.note)}</span>",
    )
    item(
        "label",
        f"{badge(r.label)} <span class='muted'>{esc(r.label_reason)}</span>"
        if r.label
        else f"<span class='muted'>none: {esc(r.label_reason)}</span>",
    )
    item(
        "predictions",
        "; ".join(
            f"frozen <code>{esc(f.tag)}</code> "
            f"{badge(f.blindness or '?', 'blind' if (f.blindness or '').startswith('blind') else 'notblind')}"
            for f in p.freezes
        )
        + "".join(f"<br>scored {esc(s.tag)}: {s.hits} hits, {s.misses} misses" for s in p.scored)
        if p.frozen
        else "<span class='muted'>not frozen</span>",
    )
    if j.state == PRESENT:
        c = j.counts
        item(
            "jobs",
            ", ".join(f"{c[k]} {k}" for k in c if c[k] or k != "unknown")
            + f"<br><span class='muted'>from {esc(j.source)}</span>",
        )
    else:
        item("jobs", "<span class='muted'>no submission manifest: not submitted to the scheduler</span>")
    bound = f"; {ru.bound} bound of {ru.registered} registered" if ru.bound is not None else ""
    item(
        "runs",
        f"{ru.found} found "
        f"({esc(', '.join(f'{n} {s}' for s, n in sorted(ru.by_status.items())) or 'none')}){esc(bound)}",
    )
    if v.state == PRESENT:
        kind = (
            ("registered, decisive" if v.decisive else "registered, not decisive") if v.registered else "not registered"
        )
        item(
            "verdict",
            f"{badge(v.verdict)} <span class='muted'>{esc(kind)}</span>"
            + (f"<br><strong>{esc(v.stale)}</strong>" if v.stale else ""),
        )
    else:
        item("verdict", "<span class='muted'>not scored yet</span>")
    if pv.state == PRESENT and pv.exploratory:
        item(
            "provenance",
            badge("not registered (exploratory)", "exploratory")
            + f"<br><span class='muted'>{esc(pv.exploratory)}</span>"
            + "".join(f"<br>{esc(b['name'])}" for b in pv.breaks[:4]),
        )
    elif pv.state == PRESENT:
        item(
            "provenance",
            badge("holds")
            if pv.ok
            else badge(f"{len(pv.breaks)} BREAK(S)", "FAIL")
            + "<br>"
            + "<br>".join(esc(b["name"]) for b in pv.breaks[:4]),
        )
    else:
        item("provenance", f"<span class='muted'>not verified: {esc(pv.note)}</span>")
    return f"<div class='summary'>{''.join(items)}</div>"


def _figures(td: TestDir) -> tuple[str, list[dict[str, Any]]]:
    v = td.verdict
    if not v.ok:
        return absent("No figure: the test is not scored yet (the figures are drawn from the judged runs)."), []
    charts, notes = fig1_charts(v.value, td.path)
    parts = []
    family = (v.value.get("rule_spec") or {}).get("report")
    if charts:
        parts.append(
            "<p>Fig. 1 layout, one chart per rate: prefix-cache hit fraction per window (top) and sessions in the "
            "system, log scale (bottom); one line per run; shaded: the evaluation window; dashed vertical: the burst. "
            "Drag across a panel to zoom, double-click to reset, hover for values, tick an arm to hide it.</p>"
        )
        cells = []
        for i, c in enumerate(charts):
            cid = f"chart-{i}"
            cells.append(
                f"<div><h3>{esc(c['title'])}</h3><div class='chart' id='{cid}' data-chart='{cid}-data'><noscript>"
                "<p class='muted'>The interactive chart needs script; the static figure below shows the same series."
                f"</p></noscript></div>{json_script(c, cid + '-data')}</div>"
            )
        parts.append(f"<div class='rates'>{''.join(cells)}</div>")
    for n in notes:
        parts.append(f"<p class='muted'>not drawn: {esc(n)}</p>")
    png = td.sibling("figure.png")
    if png is not None:
        what = (
            f"the {family} report module's figure"
            if family and family != "generic"
            else "the Markdown report's figure (Fig. 1 layout)"
        )
        parts.append(
            f"<h3>Static figure</h3><p class='muted'>{esc(what)}, <code>{esc(png.name)}</code> beside the verdict</p>"
            f"<img class='static' alt='{esc(what)}' src='{data_uri(png)}'>"
        )
    else:
        parts.append(absent("No static figure: figure.png is not beside the verdict."))
    return "\n".join(parts), charts


def _tables(td: TestDir) -> str:
    md = td.sibling("report.md")
    if md is None:
        return absent(
            "No Markdown report beside the verdict (report.md): the tables cannot be shown."
            if td.verdict.ok
            else "Not scored yet: no tables."
        )

    def skip_images(alt: str, src: str) -> str:
        return ""  # the figures section shows them

    return (
        f"<p class='muted'>Rendered from <code>{esc(md.name)}</code> beside the verdict (the same tables the Markdown "
        "report holds).</p>" + render(md.read_text(encoding="utf-8"), image=skip_images, heading_offset=0)
    )


def build_page(td: TestDir, out_path: Path, *, status: TestStatus | None = None) -> str:
    """The page's HTML for the test directory, with links relative to `out_path`'s folder."""
    st = status or collect_status(td)
    base = out_path.parent
    v = td.verdict
    name = td.test_name or td.path.name
    reg = st.registration
    sub = []
    if reg.label:
        sub.append(f"label {badge(reg.label)}")
    if reg.state == PRESENT:
        sub.append(f"registration <code>{esc(reg.name)}</code> SHA-256 <code>{esc((reg.sha256 or '')[:16])}…</code>")
    sub.append(f"test directory <code>{esc(td.path)}</code>")
    figs, _ = _figures(td)
    body = {
        "status": _summary(st),
        "verdict": verdict_section(v.value if v.ok else None, v.note, v.path),
        "tables": _tables(td),
        "figures": figs,
        "predictions": predictions_section(td, st),
        "provenance": provenance_section(td),
        "registration": registration_section(td, st),
        "runs": runs_section(td, st, base) + "<h3>Raw records</h3>" + raw_records(td, base),
    }
    verdict_badge = badge(v.value.get("verdict")) if v.ok else badge("not scored", "none")
    toc = "".join(f"<a href='#{k}'>{esc(t)}</a>" for k, t in SECTIONS)
    sections = "".join(f"<section class='card' id='{k}'><h2>{esc(t)}</h2>{body[k]}</section>" for k, t in SECTIONS)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; img-src data:; "
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'\">"
        f"<title>{esc(name)}: {esc(v.value.get('verdict') if v.ok else 'not scored')}</title>"
        f"<style>{_asset('report.css')}</style></head><body><header class='top'><h1>{esc(name)} {verdict_badge}</h1>"
        f"<div class='sub'>{' · '.join(sub)}</div></header><nav class='toc'>{toc}</nav><main>{sections}</main>"
        f"<footer>{generated_line(td)}</footer><script>{_asset('report.js')}</script></body></html>\n"
    )


def write_html(td: TestDir, out_path: str | Path | None = None, *, status: TestStatus | None = None) -> Path:
    """Write the page (default <testdir>/report.html) and return its path."""
    out = Path(out_path) if out_path is not None else td.path / "report.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    text = build_page(td, out.resolve(), status=status)
    return write_text_atomic(out, text)
