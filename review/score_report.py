"""`predict score`: frozen predictions (read from the tag) against outcomes, with each prediction's
blindness from the record, as a Markdown report and JSON.

Why from the tag: the work tree's copy of a prediction file can be edited at any time; the tag's
commit holds the bytes that were frozen and the tag message their SHA-256. Scoring reads those
bytes, checks them against the message, and reports (prominently) any edit of the work-tree copy
and every later commit that changed a frozen file (an erratum), with its time, so a reader sees
both what was frozen and what changed after.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from prereg.freeze import Frozen, read_frozen
from prereg.outcomes import find_run_dirs, load_outcome_file, run_outcomes
from prereg.scoring import Outcomes, Score, score_file
from provenance.git import Repo
from review.records import read_run
from review.timeline import FreezeFacts, build_timeline, freeze_facts, run_times


@dataclass
class ScoreReport:
    frozen: Frozen
    facts: FreezeFacts
    scores: list[tuple[str, Score]]
    notes: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return self.frozen.problems + [p for f in self.frozen.files for p in f.problems]

    def to_json(self) -> dict[str, Any]:
        fz = self.frozen
        return {
            "tag": fz.tag,
            "commit": fz.commit,
            "confirmed_at": fz.confirmed_at,
            "freezes": [{"tag": fz.tag, "blindness": self.facts.overall.text(), "reason": self.facts.overall.reason}],
            "files": [
                {
                    "path": f.path,
                    "sha256": f.sha256,
                    "worktree_sha256": f.worktree_sha256,
                    "edited_since_freeze": f.edited_since,
                    "errata": f.errata,
                    "problems": f.problems,
                }
                for f in fz.files
            ],
            "problems": self.problems,
            "scores": [
                {
                    "file": path,
                    "name": sc.name,
                    "summary": sc.summary,
                    "by_margin": sc.by_margin,
                    "scored": [s.to_json() for s in sc.scored],
                }
                for path, sc in self.scores
            ],
            "notes": self.notes,
        }


def _is_testdir(p: Path) -> bool:
    return (p / "runs").is_dir() or (p / "submission.json").is_file()


def score_frozen(
    pred: str | Path,
    targets: Sequence[str | Path],
    *,
    outcome_files: Sequence[str | Path] = (),
    rule: str | Mapping[str, Any] | None = None,
    repo: Repo | None = None,
) -> ScoreReport:
    """Score the predictions frozen under `pred` (a tag or a freeze record) against runs/test dirs."""
    tds = [Path(t) for t in targets if _is_testdir(Path(t))]
    if repo is None and not (str(pred).endswith(".json") and Path(pred).is_file()):
        start = tds[0] if tds else Path.cwd()
        try:
            repo = Repo.containing(start)
        except Exception:
            repo = Repo.containing(Path.cwd())
    extra = [t / "provenance" / "freezes" for t in tds]
    fz = read_frozen(pred, repo, extra)
    notes: list[str] = []
    dirs = find_run_dirs(targets) if targets else []
    if tds:
        tl = build_timeline(tds[0], repo=repo, freezes=[fz.record.path if fz.record and fz.record.path else fz.tag])
        facts = next((f for f in tl.freezes if f.tag == fz.tag), None) or freeze_facts(fz, tl.counted or tl.runs)
        notes += tl.notes
        if rule is None and tl.registration.view is not None and tl.registration.view.raw.get("rule"):
            reg_rule = tl.registration.view.raw["rule"]  # the registration's rule judges its runs
            rule = reg_rule
            notes.append(f"runs judged with the registration's rule ({reg_rule.get('name')})")
    else:
        facts = freeze_facts(fz, run_times([read_run(d) for d in dirs], None, None))
        if dirs:
            notes.append(
                "run directories given without their test directory: each run's meta.json created_at stands for its "
                "submit and start"
            )
    data_outcomes = [load_outcome_file(p) for p in outcome_files]
    scores = []
    for f in fz.files:
        if f.predictions is None:
            continue
        oc = run_outcomes(f.predictions, dirs, rule) if dirs else Outcomes()
        for extra_o in data_outcomes:
            oc.merge(extra_o)
        notes += oc.notes
        sc = score_file(f.predictions, oc)
        for s in sc.scored:
            b = facts.by_prediction.get(s.id)
            s.blindness = b.text() if b else None
        scores.append((f.path, sc))
    if not scores:
        notes.append(f"tag {fz.tag} freezes no prediction file")
    return ScoreReport(fz, facts, scores, notes)


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return "-inf" if math.isinf(v) else f"{v:.4g}"
    return str(v)


def _summary_table(head: str, summary: Mapping[str, Mapping[str, Any]]) -> list[str]:
    out = [
        f"| {head} | n | hits | misses | no call | no outcome | Brier | log score |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for group, d in summary.items():
        br = ", ".join(f"{k} {_fmt(v)}" for k, v in d["brier"].items()) or "—"
        lg = ", ".join(f"{k} {_fmt(v)}" for k, v in d["log_score"].items()) or "—"
        out.append(
            f"| {group} | {d['n']} | {d['hit']} | {d['miss']} | {d['no call']} | {d['no outcome']} | {br} | {lg} |"
        )
    return out


def _margin_cell(s: Any) -> str:
    if s.margin_label is None:
        return "—"
    return f"{s.margin_label} ({_fmt(s.margin)}: {s.margin_detail})" if s.margin_detail else s.margin_label


def _table(rows: list[Any]) -> list[str]:
    margins = any(s.margin_label is not None for s in rows)
    out = [
        "| id | about | predicted | outcome | result | error / score | blindness |"
        + (" flip margin |" if margins else ""),
        "|---|---|---|---|---|---|---|" + ("---|" if margins else ""),
    ]
    for s in rows:
        extra = (
            f"err {_fmt(s.error)}"
            if s.error is not None
            else (f"Brier {_fmt(s.brier)}, log {_fmt(s.log_score)}" if s.brier is not None else s.detail)
        )
        out.append(
            f"| {s.id} | {s.quantity} @ {s.about} | {s.predicted} | {_fmt(s.outcome)} | **{s.result.upper()}** | "
            f"{extra} | {s.blindness or '—'} |" + (f" {_margin_cell(s)} |" if margins else "")
        )
    return out


def markdown(rep: ScoreReport) -> str:
    fz = rep.frozen
    L = [f"# Frozen predictions {fz.tag}, scored", ""]
    L.append(
        f"Scored from the bytes tag `{fz.tag}` holds (commit `{fz.commit[:12]}`), never from the work tree. "
        f"Confirmed on the remote: {fz.confirmed_at or 'no record'}."
    )
    L.append(
        f"Blindness of the freeze for the runs scored: **{rep.facts.overall.text()}** ({rep.facts.overall.reason})."
    )
    L.append("")
    L.append("## Frozen files")
    for f in fz.files:
        L.append(
            f"- `{f.path}` SHA-256 `{f.sha256}`"
            + (
                " — **EDITED AFTER THE FREEZE** in the work tree "
                f"(now `{f.worktree_sha256}`); the edit is ignored: scored from the tag"
                if f.edited_since
                else ""
            )
        )
        for e in f.errata:
            L.append(
                f"  - **erratum** commit `{e['commit'][:12]}` at {e['committed_at']} changed it after the freeze (the "
                "tag still names the frozen bytes)"
            )
    for p in rep.problems:
        L.append(f"- **PROBLEM**: {p}")
    for path, sc in rep.scores:
        hits, misses = sc.hits, sc.misses
        other = [s for s in sc.scored if s.result not in ("hit", "miss")]
        L += [
            "",
            f"## {sc.name} (`{path}`): {len(hits)} hits, {len(misses)} misses, {len(other)} without a call or an "
            "outcome",
            "",
        ]
        L += _summary_table("layer", sc.summary)
        if sc.by_margin:
            L += [
                "",
                "### Robust and knife-edge predictions apart",
                "",
                "A prediction is knife-edge when a change of the cost's speed or of lambda_ref no larger than E0a's "
                "seed spread flips its state (the label was frozen with it; docs/predictions.md).",
                "",
            ]
            L += _summary_table("margin", sc.by_margin)
        L += ["", f"### Misses ({len(misses)})", ""]
        L += _table(misses) if misses else ["none"]
        L += ["", f"### Hits ({len(hits)})", ""]
        L += _table(hits) if hits else ["none"]
        if other:
            L += ["", f"### No call or no outcome ({len(other)})", ""]
            L += _table(other)
    if rep.notes:
        L += ["", "## Notes", ""] + [f"- {n}" for n in rep.notes]
    return "\n".join(L) + "\n"


def write_report(rep: ScoreReport, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / f"{rep.frozen.tag}.score.md"
    js = out_dir / f"{rep.frozen.tag}.score.json"
    md.write_text(markdown(rep))
    js.write_bytes(orjson.dumps(rep.to_json(), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    return {"markdown": md, "json": js}


def summary_lines(rep: ScoreReport) -> list[str]:
    out = [f"{rep.frozen.tag}: {rep.facts.overall.text()}"]
    for f in rep.frozen.files:
        if f.edited_since:
            out.append(
                f"  {f.path}: EDITED AFTER THE FREEZE (work tree "
                f"{f.worktree_sha256[:12] if f.worktree_sha256 else '?'} != frozen {f.sha256[:12]}); scored from the "
                "tag"
            )
        for e in f.errata:
            out.append(f"  {f.path}: erratum {e['commit'][:12]} at {e['committed_at']}")
    for p in rep.problems:
        out.append(f"  PROBLEM: {p}")
    for _path, sc in rep.scores:
        out.append(f"  {sc.name}: {len(sc.hits)} hits, {len(sc.misses)} misses")
        groups = list(sc.summary.items()) + [(f"{k} predictions", d) for k, d in sc.by_margin.items()]
        for layer, d in groups:
            br = ", ".join(f"Brier({k}) {v:.3f}" for k, v in d["brier"].items())
            out.append(
                f"    {layer}: {d['hit']} hit / {d['miss']} miss / {d['no call']} no call / {d['no outcome']} no "
                "outcome" + (f"; {br}" if br else "")
            )
        edge = [s.id for s in sc.scored if s.margin_label == "knife-edge"]
        if edge:
            out.append(f"    knife-edge: {', '.join(edge[:8])}{f' and {len(edge) - 8} more' if len(edge) > 8 else ''}")
    return out
