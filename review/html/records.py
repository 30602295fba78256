"""The record sections of the HTML page: predictions scored with their blindness labels, the
provenance timeline and verification, the registration and its hash, and links to every run
directory and raw table. Each section says plainly when its record is absent."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from provenance.meta import git_state
from review.html.figures import run_state
from review.html.verdict import absent, badge, esc, num, run_key
from review.status_model import TestStatus
from review.testdir import PRESENT, TestDir


def rel(target: str | Path, base: Path) -> str:
    """A link from the page's folder to a file of the record (relative, so the folder can move)."""
    return Path(os.path.relpath(Path(target).resolve(), base.resolve())).as_posix()


def link(target: str | Path, base: Path, text: str | None = None) -> str:
    p = Path(target)
    name = text if text is not None else p.name
    if not p.exists():
        return f"<span class='muted'>{esc(name)} (missing)</span>"
    href = rel(p, base) + ("/" if p.is_dir() else "")
    return f"<a href='{esc(href)}'>{esc(name)}</a>"


def _blind_cls(text: str | None) -> str:
    t = (text or "").lower()
    return "notblind" if t.startswith("not blind") else ("blind" if t.startswith("blind") else "none")


# ---------------------------------------------------------------------------------------------
# predictions
# ---------------------------------------------------------------------------------------------
def predictions_section(td: TestDir, status: TestStatus) -> str:
    p = status.predictions
    out = []
    if not p.frozen and not td.scores:
        return absent(
            "No predictions were frozen for this test: there is no freeze record in provenance/freezes/ or in the "
            "repository's prereg/freezes/ (agentload predict freeze FILES --testdir TESTDIR)."
        )
    for f in p.freezes:
        out.append(
            f"<p>Freeze <code>{esc(f.tag)}</code>, confirmed on the remote at {esc(f.confirmed_at or 'no record')}: "
            f"{badge(f.blindness or 'unknown', _blind_cls(f.blindness))} <span class='muted'>{esc(f.reason)}</span>"
            + (f" <strong>{f.errata} erratum/errata after the freeze</strong>" if f.errata else "")
            + "</p>"
        )
    if not td.scores:
        out.append(
            absent(
                "Frozen but not scored yet: no <tag>.score.json under predictions/ (agentload predict score TAG "
                "TESTDIR)."
            )
        )
    for s in td.scores:
        if not s.ok:
            out.append(absent(f"{s.path}: {s.note}"))
            continue
        out.append(score_report(s.value, Path(str(s.path))))
    return "\n".join(out)


def score_report(rep: Mapping[str, Any], path: Path) -> str:
    out = [
        f"<h3>Scored: <code>{esc(rep.get('tag'))}</code> <span class='muted'>({esc(path.name)}; commit "
        f"{esc(str(rep.get('commit'))[:12])})</span></h3>"
    ]
    for f in rep.get("files") or []:
        warn = (
            " — <strong>edited after the freeze</strong> in the work tree (scored from the tag)"
            if f.get("edited_since_freeze")
            else ""
        )
        out.append(
            f"<div>frozen file <code>{esc(f.get('path'))}</code> SHA-256 <code>{esc(f.get('sha256'))}</code>{warn}"
            "</div>"
        )
        for e in f.get("errata") or []:
            out.append(
                f"<div><strong>erratum</strong> commit <code>{esc(str(e.get('commit'))[:12])}</code> at "
                f"{esc(e.get('committed_at'))}</div>"
            )
    for pr in rep.get("problems") or []:
        out.append(f"<div><strong>problem:</strong> {esc(pr)}</div>")
    for sc in rep.get("scores") or []:
        rows = sc.get("scored") or []
        n = {k: sum(1 for x in rows if x.get("result") == k) for k in ("hit", "miss")}
        out.append(
            f"<h4>{esc(sc.get('name'))} <span class='muted'>(<code>{esc(sc.get('file'))}</code>)</span>: {n['hit']} "
            f"hits, {n['miss']} misses, {len(rows) - n['hit'] - n['miss']} without a call or an outcome</h4>"
        )
        summ = sc.get("summary") or {}
        if summ:
            out.append(_summary_table("layer", summ, ""))
        by_margin = sc.get("by_margin") or {}
        if by_margin:
            out.append(
                "<p>Robust and knife-edge predictions apart: a prediction is <strong>knife-edge</strong> when a change "
                "of the cost's speed or of lambda_ref no larger than E0a's seed spread flips its state (frozen with "
                "it).</p>"
            )
            out.append(_summary_table("flip margin", by_margin, "margins"))
        margins = any(x.get("margin_label") for x in rows)
        body = []
        for x in rows:
            score = (
                f"err {num(x.get('error'))}"
                if x.get("error") is not None
                else (
                    f"Brier {num(x.get('brier'))}, log {num(x.get('log_score'))}"
                    if x.get("brier") is not None
                    else esc(x.get("detail") or "")
                )
            )
            body.append(
                f"<tr><td><code>{esc(x.get('id'))}</code></td><td>{esc(x.get('quantity'))} @ {esc(x.get('about'))}</td>"
                f"<td>{esc(x.get('layer'))}</td><td>{esc(x.get('predicted'))}</td><td>{esc(num(x.get('outcome')))}</td>"
                f"<td>{badge(x.get('result'), str(x.get('result')).replace(' ', ''))}</td><td>{score}</td>"
                f"<td>{badge(x.get('blindness') or 'unknown', _blind_cls(x.get('blindness')))}</td>"
                + (_margin_td(x) if margins else "")
                + "</tr>"
            )
        out.append(
            "<div class='scroll'><table class='predictions'><thead><tr><th>id</th><th>about</th><th>layer</th>"
            "<th>predicted</th><th>outcome</th><th>result</th><th>error / score</th><th>blindness</th>"
            + ("<th>flip margin</th>" if margins else "")
            + f"</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
            if body
            else absent("this file scored no prediction")
        )
    return "\n".join(out)


def _summary_table(head: str, summ: Mapping[str, Any], cls: str) -> str:
    """Counts and mean Brier per group (a layer, or a margin label)."""
    srows = "".join(
        f"<tr><td>{esc(group)}</td>"
        + "".join(f"<td class='num'>{esc(d.get(k))}</td>" for k in ("n", "hit", "miss", "no call", "no outcome"))
        + f"<td>{esc(', '.join(f'{k} {num(v)}' for k, v in (d.get('brier') or {}).items()) or '-')}</td></tr>"
        for group, d in summ.items()
    )
    return (
        f"<table{f' class={chr(39)}{cls}{chr(39)}' if cls else ''}><thead><tr><th>{esc(head)}</th><th>n</th>"
        "<th>hits</th><th>misses</th><th>no call</th><th>no outcome</th><th>Brier</th></tr></thead>"
        f"<tbody>{srows}</tbody></table>"
    )


def _margin_td(x: Mapping[str, Any]) -> str:
    """A prediction's flip margin: its label as a badge, the smallest margin, each knob's sides."""
    label = x.get("margin_label")
    if not label:
        return "<td class='muted'>—</td>"
    return (
        f"<td>{badge(label, None if label in ('robust', 'knife-edge') else 'none')} {esc(num(x.get('margin')))} "
        f"<span class='muted'>{esc(x.get('margin_detail') or '')}</span></td>"
    )


# ---------------------------------------------------------------------------------------------
# provenance
# ---------------------------------------------------------------------------------------------
KIND_COLOR = {
    "registration": "#1f5fa8",
    "prediction": "#8e44ad",
    "erratum": "#b42318",
    "job": "#d68910",
    "run": "#239b56",
}


def _kind_color(kind: str) -> str:
    for k, c in KIND_COLOR.items():
        if k in kind:
            return c
    return "#5a6573"


def timeline_strip(events: Sequence[Any]) -> str:
    """The events on one time axis, one row per kind of event (inline SVG; each mark's title
    names the event, so hovering shows it)."""
    timed = [e for e in events if e.at is not None]
    if len(timed) < 2:
        return ""
    t0, t1 = min(e.at for e in timed), max(e.at for e in timed)
    span = max((t1 - t0).total_seconds(), 1.0)
    W, L, R = 1000, 190, 12
    kinds = list(dict.fromkeys(e.kind for e in timed))
    H = 34 + 16 * len(kinds)
    base = H - 22
    parts = [
        f"<svg class='timeline-strip' viewBox='0 0 {W} {H}' width='100%' height='{H}' role='img' "
        "aria-label='provenance timeline'>",
        f"<line x1='{L}' x2='{W - R}' y1='{base}' y2='{base}' stroke='#9aa4b1'/>",
    ]
    for i, k in enumerate(kinds):
        y = 12 + 16 * i
        parts.append(f"<line x1='{L}' x2='{W - R}' y1='{y}' y2='{y}' stroke='#edf0f3'/>")
        parts.append(
            f"<text x='{L - 8}' y='{y + 4}' text-anchor='end' font-size='11' fill='{_kind_color(k)}'>{esc(k)}</text>"
        )
    for e in timed:
        x = L + (W - L - R) * (e.at - t0).total_seconds() / span
        y = 12 + 16 * kinds.index(e.kind)
        parts.append(
            f"<circle class='ev' cx='{x:.1f}' cy='{y}' r='4' fill='{_kind_color(e.kind)}'>"
            f"<title>{esc(e.at.isoformat())} {esc(e.kind)}: {esc(e.subject)}</title></circle>"
        )
    parts.append(f"<text x='{L}' y='{H - 6}' font-size='11' fill='#5a6573'>{esc(t0.isoformat())}</text>")
    parts.append(
        f"<text x='{W - R}' y='{H - 6}' font-size='11' text-anchor='end' fill='#5a6573'>{esc(t1.isoformat())} (UTC; "
        f"span {span:.0f} s)</text></svg>"
    )
    return "".join(parts)


def provenance_section(td: TestDir) -> str:
    out = []
    tl = td.timeline
    if tl.ok:
        t = tl.value
        out.append(
            f"<p>Registration label from the record: {badge(t.label)} <span class='muted'>{esc(t.label_reason)}</span>"
            "</p>"
        )
        out.append(timeline_strip(t.events))
        rows = "".join(
            f"<tr><td><code>{esc(e.at.isoformat() if e.at else 'unknown')}</code></td>"
            f"<td style='color:{_kind_color(e.kind)}'>{esc(e.kind)}</td><td>{esc(e.subject)}</td>"
            f"<td class='muted'>{esc(e.source)}</td></tr>"
            for e in t.events
        )
        table = (
            "<div class='scroll'><table class='timeline'><thead><tr><th>time</th><th>event</th><th>subject</th>"
            f"<th>source</th></tr></thead><tbody>{rows}</tbody></table></div>"
        )
        out.append(
            f"<details{' open' if len(t.events) <= 40 else ''}><summary>Timeline (UTC): {len(t.events)} events"
            f"</summary>{table}</details>"
            if rows
            else absent("the record holds no event")
        )
        for n in t.notes:
            out.append(f"<p class='muted'>note: {esc(n)}</p>")
    else:
        out.append(absent(f"No provenance timeline: {tl.note}"))
    v = td.verification
    if v.ok:
        ver = v.value
        answer = badge("holds") if ver.ok else badge(f"{len(ver.breaks)} BREAK(S)", "FAIL")
        if ver.exploratory:
            answer = badge("not registered (exploratory)", "exploratory") + ("" if ver.ok else " " + answer)
        out.append(f"<h3>Verification: {answer} <span class='muted'>({len(ver.checks)} checks)</span></h3>")
        if ver.exploratory:
            out.append(f"<p class='muted'>{esc(ver.exploratory)}</p>")

        def checks_table(cs: list[Any]) -> str:
            rows = "".join(
                f"<tr><td>{esc(c.area)}</td><td>{esc(c.name)}</td><td>{badge('holds') if c.ok else badge('BREAK')}</td>"
                f"<td>{esc(c.detail)}</td></tr>"
                for c in cs
            )
            return (
                "<div class='scroll'><table class='checks'><thead><tr><th>area</th><th>check</th><th></th>"
                f"<th>detail</th></tr></thead><tbody>{rows}</tbody></table></div>"
            )

        if ver.breaks:
            out.append(checks_table(ver.breaks))
        holds = [c for c in ver.checks if c.ok]
        if holds:
            out.append(f"<details><summary>{len(holds)} checks that hold</summary>{checks_table(holds)}</details>")
        if not ver.checks:
            out.append(absent("no check applied"))
        for s in ver.skipped:
            out.append(f"<div class='muted'>not checked: {esc(s)}</div>")
    else:
        out.append(absent(f"Not verified: {v.note}"))
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# registration
# ---------------------------------------------------------------------------------------------
def registration_section(td: TestDir, status: TestStatus) -> str:
    r = status.registration
    basis = f" [{esc(r.label_basis)}]" if r.label_basis else ""
    label = f"<p>Label: {badge(r.label)} <span class='muted'>{esc(r.label_reason)}{basis}</span></p>" if r.label else ""
    if r.state != PRESENT:
        return absent(f"No registration: {r.note}") + label
    reg = td.registration.value
    ref = r.ref or {}
    out = [
        f"<p><strong>{esc(reg.name)}</strong> {badge(reg.status, 'PASS' if reg.status == 'FILLED' else 'INCOMPLETE')} "
        f"— SHA-256 <code>{esc(reg.sha256)}</code></p>",
        label,
        "<table><tbody>",
        f"<tr><th>file</th><td><code>{esc(ref.get('path'))}</code> (read from {esc(r.path)})</td></tr>",
        f"<tr><th>commit</th><td><code>{esc(ref.get('commit') or 'not recorded')}</code> (bound by the "
        f"{esc(ref.get('source'))})</td></tr>",
        f"<tr><th>test</th><td>{esc(reg.test)}</td></tr>",
        f"<tr><th>cell</th><td>{esc(reg.cell.name)}: {esc(reg.cell.engine.name)} {esc(reg.cell.engine.version)}, "
        f"{esc(reg.cell.model)}, {esc(reg.cell.gpu)}, pool {esc(reg.cell.kv_pool_tokens)} tokens</td></tr>",
        f"<tr><th>arms</th><td>{esc(', '.join(reg.arms))}</td></tr>",
        "<tr><th>rates</th>"
        f"<td>{esc(', '.join(f'{x.multiple:g} × λref ({x.sessions_per_s:.5f} sessions/s)' for x in reg.rates))}</td>"
        "</tr>",
        f"<tr><th>seeds, cap</th><td>{esc(', '.join(map(str, reg.seeds)))}; cap "
        f"{esc(reg.cap if reg.cap is not None else 'none')}</td></tr>",
        f"<tr><th>references</th><td>λ_ref {esc(reg.references.lambda_ref)}, λ_miss {esc(reg.references.lambda_miss)}, "
        f"all-miss {esc(reg.references.all_miss_token_rate)} tokens/s</td></tr>",
        f"<tr><th>rule</th><td><code>{esc(reg.rule.get('name'))}</code> version {esc(reg.rule.get('version'))}</td>"
        "</tr>",
        f"<tr><th>plans</th><td>{len(reg.plans)} frozen plan hashes</td></tr>",
        "</tbody></table>",
    ]
    if r.mismatch:
        out.append(f"<p><strong>Mismatch:</strong> {esc(r.mismatch)}</p>")
    if reg.status_reasons:
        out.append("<p>why " + esc(reg.status) + ": " + esc("; ".join(reg.status_reasons)) + "</p>")
    if reg.kill_conditions:
        out.append(
            "<h4>Kill conditions</h4><ul>"
            + "".join(
                f"<li><code>{esc(k.id)}</code> ({esc(k.kind)}): {esc(k.description)}</li>" for k in reg.kill_conditions
            )
            + "</ul>"
        )
    if reg.warnings:
        out.append(
            "<h4>Warnings at filling</h4><ul>"
            + "".join(f"<li><code>{esc(w.id)}</code>: {esc(w.text)}</li>" for w in reg.warnings)
            + "</ul>"
        )
    if reg.inputs:
        out.append(
            "<h4>Calibration inputs</h4><ul>"
            + "".join(
                f"<li><code>{esc(i.path)}</code> ({esc(i.role)}) <code>{esc(i.sha256)}</code></li>" for i in reg.inputs
            )
            + "</ul>"
        )
    out.append(
        f"<details><summary>the registration file as committed ({len(reg.raw)} bytes)</summary>"
        f"<pre>{esc(reg.raw.decode('utf-8', 'replace'))}</pre></details>"
    )
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# runs and raw records
# ---------------------------------------------------------------------------------------------
def runs_section(td: TestDir, status: TestStatus, base: Path) -> str:
    if not td.runs:
        return absent(
            "No run directory yet: nothing under runs/ (the jobs have not run, or their output was not collected here)."
        )
    verdict_runs = {}
    if td.verdict.ok:
        for r in td.verdict.value.get("runs") or []:
            verdict_runs[Path(str(r.get("run_dir"))).name] = r
    unbound = {Path(u.run_dir).name: u.reasons for u in status.runs.unbound}
    jobs = {Path(str(j.run_dir)).name: f"{j.job_id} ({j.category})" for j in status.jobs.jobs if j.run_dir}
    checked = status.runs.bound is not None
    rows = []
    for run in td.runs:
        m = run.meta or {}
        v = verdict_runs.get(run.name)
        tables = []
        for name, t in (m.get("tables") or {}).items():
            tables.append(link(run.path / t["file"], base, f"{name} ({t.get('rows')} rows)"))
        plan = (m.get("plan") or {}).get("file")
        files = [link(run.path / "meta.json", base)] + ([link(run.path / plan, base, "plan")] if plan else []) + tables
        bound = ("yes" if run.name not in unbound else f"no: {'; '.join(unbound[run.name])}") if checked else "-"
        state = (
            f"<a href='#cond-{run_key(v)}'>{esc(run_state(v))}</a>" if v else "<span class='muted'>not judged</span>"
        )
        job = jobs.get(run.name) or (run.record.job_id if run.record is not None else None) or "-"
        rows.append(
            f"<tr><td>{link(run.path, base, run.name)}</td><td>{esc(m.get('arm'))}</td>"
            f"<td class='num'>{esc(m.get('rate'))}</td><td class='num'>{esc(m.get('seed'))}</td><td>{esc(run.status)}"
            f"</td><td>{state}</td><td>{esc(bound)}</td><td>{esc(job)}</td><td>{' · '.join(files)}</td></tr>"
        )
    return (
        "<div class='scroll'><table class='runs'><thead><tr><th>run directory</th><th>arm</th><th>λ/λref</th><th>seed"
        "</th><th>status</th><th>state</th><th>bound</th><th>job</th><th>raw tables</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def raw_records(td: TestDir, base: Path) -> str:
    items = []
    seen: set[Path] = set()

    def add(p: Path | None, what: str) -> None:
        if p is not None and p.exists() and p not in seen:
            seen.add(p)
            items.append(
                f"<li>{link(p, base, str(p.relative_to(td.path)) if p.is_relative_to(td.path) else str(p))} — "
                f"{esc(what)}</li>"
            )

    add(td.path / "submission.json", "submission manifest")
    add(td.path / "provenance" / "accounting.json", "scheduler accounting export")
    add(td.path / "provenance" / "accounting.csv", "scheduler accounting export (CSV)")
    for p in td.verdicts:
        add(p, "verdict")
        for sib, what in (
            ("report.md", "Markdown report"),
            ("registered-report.md", "registered report"),
            ("figure.png", "figure"),
        ):
            add(p.parent / sib, what)
    for s in td.scores:
        add(Path(str(s.path)), "scored predictions")
        add(
            Path(str(s.path)).with_name(Path(str(s.path)).name.replace(".score.json", ".score.md")),
            "scored predictions (Markdown)",
        )
    for p in td.freeze_records:
        add(p, "freeze record")
    for p in sorted((td.path / "provenance" / "proofs").glob("*/proof.json")):
        add(p.parent, "proof of an unchanged file")
    return "<ul>" + "".join(items) + "</ul>" if items else absent("No other record in the test directory.")


def generated_line(td: TestDir) -> str:
    """When, from what, and by which code (this package's own checkout) the page was made."""
    g = git_state()
    now = datetime.now().astimezone().isoformat(timespec="seconds")
    code = ""
    if g.get("commit"):
        code = f" by the code of commit <code>{esc(str(g['commit'])[:12])}</code>" + (
            " (with uncommitted changes)" if g.get("dirty") else ""
        )
    return (
        f"generated {esc(now)} from {esc(td.path)}{code}; the verdict shown is the one recorded in the test "
        "directory, not recomputed"
    )
