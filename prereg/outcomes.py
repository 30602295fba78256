"""Outcomes to score predictions against: computed from run directories, or read from a data file.

From runs, every quantity is what the judging half computes (analysis.staged_analysis.run_quantities
and the staged engine with the rule the test registered, laid out as the paired verdict does,
analysis/paired.py), never re-derived here, so a prediction is scored against the same numbers the
verdict uses:

  run scope    state (the rule state), arm_condition (the arm's expected state holds), each rule
               flag (stuck, ...), good (the basin endpoint GOOD = RECOVERED, unless the rule
               defines a `good` flag), and every numeric statistic of the run (hit, followup_hit,
               slope, token_ratio, completions_ref, backlog_end, ...); and, when a prediction
               names one, an interval quantity computed with analysis.metrics' own estimators:
               slope_A_B (least-squares slope of 10 s bin means of sessions in the system over
               [A, B)), completions_A_B (sessions completed in [A, B) per second), mean_prompt_A_B
               (mean prompt of turns completed in [A, B)), backlog_at_T, and wave (the median end
               time of the burst sessions; unfinished ones count as never)
  seed scope   seed_good (every registered arm of the seed meets its condition at that rate)
  rate scope   verdict (PASS / FAIL / INCOMPLETE)
  test scope   verdict (the test's overall verdict)

Only runs bound to the prediction file's registration count when the file names one (its
meta.json registration SHA-256 equals the file's); the others are listed, not scored.

A data file (`format: agentload-outcomes`, version 1) lists outcomes transcribed from elsewhere
(a paper's tables, a calibration summary): entries {quantity, about, value} or {id, value}.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from analysis.metrics import (
    completed_turns,
    interval_bin_means,
    interval_count_at,
    ls_slope,
    present_sessions,
    system_intervals,
)
from analysis.paired import UNJUDGED, paired_rates, paired_run
from analysis.rules import load_rule
from analysis.staged_analysis import run_quantities
from analysis.stages import StagedRun, judge_staged
from harness.config.files import safe_load
from harness.errors import ConfigError
from harness.recording.record import load_run
from harness.recording.schema import meta_files_under, read_meta
from prereg.predictions import About, PredictionFile, _parse_about
from prereg.scoring import Outcomes

OUTCOMES_FORMAT = "agentload-outcomes"
_INTERVAL = re.compile(
    r"^(slope|completions|mean_prompt)_(\d+(?:\.\d+)?)_(\d+(?:\.\d+)?)$|^backlog_at_(\d+(?:\.\d+)?)$|^wave$"
)


def interval_quantities(run_dir: Path, names: set[str], backlog_bin: float) -> dict[str, float]:
    """The interval quantities `names` of one run (see the module doc), from its record; slopes over
    bins of `backlog_bin` seconds (the rule's)."""
    import numpy as np

    run = load_run(run_dir)
    sess = present_sessions(run.sessions)
    sys_s, sys_e = system_intervals(run.sessions)
    end = sess["end"].to_numpy(dtype=float, na_value=math.nan) if not sess.empty else np.zeros(0)
    done = (sess["outcome"].to_numpy() == "completed") if not sess.empty else np.zeros(0, bool)
    out: dict[str, float] = {}
    for name in names:
        m = _INTERVAL.match(name)
        if not m:
            continue
        if name == "wave":
            burst = (sess["kind"].to_numpy() == "burst") if not sess.empty else np.zeros(0, bool)
            ends = np.where(done[burst], end[burst], math.inf)
            med = float(np.median(ends)) if ends.size else math.nan
            out[name] = med if math.isfinite(med) else math.nan
        elif m.group(4) is not None:
            out[name] = float(interval_count_at(sys_s, sys_e, float(m.group(4))))
        else:
            kind, a, b = m.group(1), float(m.group(2)), float(m.group(3))
            if kind == "slope":
                edges = a + backlog_bin * np.arange(math.floor((b - a) / backlog_bin + 1e-9) + 1)
                out[name] = ls_slope(0.5 * (edges[:-1] + edges[1:]), interval_bin_means(sys_s, sys_e, edges))
            elif kind == "completions":
                out[name] = float(np.sum(done & (end >= a) & (end < b))) / (b - a)
            else:
                ct = completed_turns(run.turns)
                t = ct["done_time"].to_numpy(dtype=float, na_value=math.nan)
                sel = (t >= a) & (t < b)
                out[name] = (
                    float(ct["prompt_tokens"].to_numpy(dtype=float, na_value=math.nan)[sel].mean())
                    if sel.any()
                    else math.nan
                )
    return out


class OutcomeError(ConfigError):
    """An outcomes file or a run directory cannot give the outcomes asked for."""


def load_outcome_file(path: str | Path) -> Outcomes:
    p = Path(path)
    try:
        doc = safe_load(p.read_bytes())
    except (OSError, yaml.YAMLError) as exc:
        raise OutcomeError(f"{p}: cannot read outcomes ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != OUTCOMES_FORMAT or doc.get("format_version") != 1:
        raise OutcomeError(f"{p}: format: expected {OUTCOMES_FORMAT!r} with format_version 1")
    rows = doc.get("outcomes")
    if not isinstance(rows, list) or not rows:
        raise OutcomeError(f"{p}: outcomes: expected a non-empty list of {{quantity, about, value}} or {{id, value}}")
    out = Outcomes()
    src = str(doc.get("source") or p.name)
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or "value" not in r:
            raise OutcomeError(f"{p}: outcomes[{i}]: got {r!r}; expected a mapping with value")
        if "id" in r:
            out.put_id(str(r["id"]), r["value"])
            continue
        if not isinstance(r.get("quantity"), str):
            raise OutcomeError(f"{p}: outcomes[{i}].quantity: got {r.get('quantity')!r}; expected a quantity name")
        about = _parse_about(str(p), f"outcomes[{i}]", r.get("about"))
        out.put(r["quantity"], about.key(), r["value"], src)
    return out


def find_run_dirs(paths: Sequence[str | Path]) -> list[Path]:
    """Run directories named directly, or found under folders (a test directory: <testdir>/runs/*)."""
    dirs: list[Path] = []
    for x in paths:
        p = Path(x)
        if (p / "meta.json").is_file():
            dirs.append(p)
        else:
            dirs += sorted(m.parent for m in meta_files_under(p) if m.parent.name != "analysis")
    return sorted(set(dirs))


def run_outcomes(pf: PredictionFile, run_dirs: Sequence[Path], rule: Mapping[str, Any] | str | None = None) -> Outcomes:
    """Outcomes of every quantity the predictions could ask for, from the runs' records."""
    spec = load_rule(rule)
    wanted = {p.quantity for p in pf.predictions if _INTERVAL.match(p.quantity)}
    reg_sha = (pf.registration or {}).get("sha256")
    out = Outcomes()
    judged: list[StagedRun] = []
    for d in run_dirs:
        meta = read_meta(d)
        if meta is None:
            out.notes.append(f"{d}: no readable meta.json; not scored")
            continue
        bound = ((meta.get("registration") or {}) if isinstance(meta.get("registration"), dict) else {}).get("sha256")
        if reg_sha and bound != reg_sha:
            out.notes.append(
                f"{d.name}: bound to registration {str(bound)[:12] if bound else 'none'}, not the predictions' "
                f"{reg_sha[:12]}; not scored"
            )
            continue
        sr = run_quantities(d, spec, series=False).run
        a = paired_run(spec, sr)
        if a["state"] == "MISSING":
            out.notes.append(f"{d.name}: {a['reason']}; not scored")
            continue
        judged.append(sr)
        key = About("run", a["arm"], a["rate"], a["seed"]).key()
        src = str(d)
        out.put("state", key, a["state"], src)
        out.put("arm_condition", key, a["good"], src)
        for k, v in a["flags"].items():
            out.put(k, key, bool(v), src)
        if "good" not in a["flags"]:
            out.put("good", key, a["state"] == "RECOVERED", src)
        if a["state"] in UNJUDGED:
            continue  # a run that did not complete (or does not count) gives a state, not statistics to score
        stats = dict(a["stats"])
        if wanted:
            stats.update(interval_quantities(d, wanted, float(spec["params"]["backlog_bin"])))
        for k, v in stats.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)):
                out.put(k, key, float(v), src)
    if judged:
        arms = sorted({r.arm for r in judged}, key=str.upper)
        rates = sorted({r.rate for r in judged})
        seeds = sorted({r.seed for r in judged})
        t = judge_staged(spec, judged, rates=rates, seeds=seeds, arms=arms)
        src = "analysis.stages.judge_staged"
        for r in paired_rates(spec, t, judged, arms):
            out.put("verdict", About("rate", rate=r["rate"]).key(), r["verdict"], src)
            for s in seeds:
                out.put("seed_good", About("seed", rate=r["rate"], seed=s).key(), s in r["good_seeds"], src)
        out.put("verdict", About("test").key(), t["verdict"], src)
    return out
