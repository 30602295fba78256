"""The verdict sections of the HTML page: per rate (or per group, for the staged families) each
run's state and the conditions that decided it; the registered block (who judged, runs counted
and left out, kill conditions).

Conditions are shown as the verdict recorded them (expression, holds). Where the verdict does not
carry the two sides of a comparison (the paired E2 form records only the truth value), both sides
are evaluated here with the rule engine's own evaluator on the run's recorded statistics, the rule
spec's parameters and the verdict's references, so a reader sees "slope 0.0297 > 0.0125", not just
a tick. Nothing is re-judged: the state shown is the verdict's.
"""

from __future__ import annotations

import ast
import html
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from analysis.expr import evaluate
from analysis.paired import UNJUDGED
from analysis.rules import arm_expectations, is_paired_form
from review.html.figures import run_state

GOOD_WORDS = {"PASS", "holds"}


def esc(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def badge(text: Any, cls: str | None = None) -> str:
    t = str(text)
    return f'<span class="badge {esc(cls or t.replace(" ", ""))}">{esc(t)}</span>'


def absent(text: str) -> str:
    return f'<p class="absent">{esc(text)}</p>'


def num(v: Any, digits: int = 4) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)):
        if isinstance(v, float) and not math.isfinite(v):
            return "-"
        return f"{v:.{digits}g}"
    return str(v)


def run_key(r: Mapping[str, Any]) -> str:
    return f"{str(r.get('arm', '')).lower()}-r{r.get('rate')}-s{r.get('seed')}".replace(".", "_")


def _env(verdict: Mapping[str, Any], r: Mapping[str, Any]) -> dict[str, Any]:
    """What the rule's conditions read: its parameters, the references, the run's statistics."""
    spec = verdict.get("rule_spec") or {}
    refs = verdict.get("references") or {}
    env: dict[str, Any] = dict(spec.get("params") or {})
    lam_ref = refs.get("lambda_ref")
    if lam_ref is not None and r.get("rate") is not None:
        env.update(
            {
                "lam": float(r["rate"]) * float(lam_ref),
                "lam_miss": float(refs.get("lambda_miss") or lam_ref),
                "lambda_ref": float(lam_ref),
                "rate": float(r["rate"]),
            }
        )
    if refs.get("all_miss_token_rate") is not None:
        env["all_miss_rate"] = float(refs["all_miss_token_rate"])
    env.update({k: v for k, v in (r.get("stats") or {}).items() if v is not None})
    env.update({k: v for k, v in (r.get("quantities") or {}).items() if v is not None})
    env.update({k: v for k, v in (r.get("derived") or {}).items() if v is not None})
    return env


def _sides(expr: str, env: Mapping[str, Any]) -> tuple[Any, str, Any] | None:
    """(left value, operator, right value) of a single comparison, or None."""
    try:
        node = ast.parse(expr, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(node, ast.Compare) or len(node.ops) != 1:
        return None
    ops = {ast.Gt: ">", ast.GtE: "≥", ast.Lt: "<", ast.LtE: "≤", ast.Eq: "=", ast.NotEq: "≠"}
    op = ops.get(type(node.ops[0]))
    if op is None:
        return None
    try:
        return evaluate(ast.unparse(node.left), env), op, evaluate(ast.unparse(node.comparators[0]), env)
    except Exception:  # a name the record does not hold: show the truth value alone
        return None


def condition_html(c: Mapping[str, Any], env: Mapping[str, Any]) -> str:
    mark = '<span class="ok">✓</span>' if c.get("holds") else '<span class="no">✗</span>'
    text = f"{mark} <code>{esc(c.get('condition'))}</code>"
    if "lhs" in c:
        text += f" <span class='muted'>({esc(num(c.get('lhs')))} vs {esc(num(c.get('rhs')))})</span>"
    elif "value" in c:
        text += f" <span class='muted'>(= {esc(num(c.get('value')))})</span>"
    else:
        s = _sides(str(c.get("condition")), env)
        if s is not None:
            text += f" <span class='muted'>({esc(num(s[0]))} {esc(s[1])} {esc(num(s[2]))})</span>"
    return f"<li>{text}</li>"


def _expectations(spec: Mapping[str, Any]) -> dict[str, list[str]]:
    """{ARM: the states its run must show}: the rule's roles' `expect`, or the `arms` of a rule in the
    paired form (a verdict judged by the code of an earlier commit)."""
    if is_paired_form(spec):
        return {str(a).upper(): list(v) for a, v in spec["arms"].items()}
    return arm_expectations(spec)


def _state_class(r: Mapping[str, Any]) -> str:
    if r.get("good") is True:
        return "good"
    if r.get("good") is False or r.get("state") in UNJUDGED or r.get("status") not in (None, "complete"):
        return "bad"
    return "other"


def run_details(verdict: Mapping[str, Any], r: Mapping[str, Any]) -> str:
    """One run's conditions, in the rule's precedence order, as a collapsible block."""
    env = _env(verdict, r)
    expect = ""
    expected = _expectations(verdict.get("rule_spec") or {}).get(str(r.get("arm", "")).upper())
    if expected:
        expect = f"; the rule expects {' or '.join(expected)}"
    head = (
        f"{esc(str(r.get('arm')).upper())} {esc(num(r.get('rate'), 6))} × λref seed {esc(r.get('seed'))}: "
        f"<span class='state {_state_class(r)}'>{esc(run_state(r))}</span>{esc(expect)}"
    )
    body = []

    def states(conds_by_state: Mapping[str, Any]) -> None:
        for name, conds in conds_by_state.items():
            if not conds:
                body.append(
                    f"<div><strong>{esc(name)}</strong>: <span class='muted'>no condition (the fallback)</span></div>"
                )
                continue
            body.append(
                f"<div><strong>{esc(name)}</strong></div><ul class='conds'>"
                + "".join(condition_html(c, env) for c in conds)
                + "</ul>"
            )

    conditions = r.get("conditions") or {}
    if any(isinstance(v, Mapping) for v in conditions.values()):  # a staged run: {label set: {label: [conditions]}}
        labels = r.get("labels") or {}
        for lset, by_label in conditions.items():
            body.append(f"<h5>{esc(lset)}: <span class='state'>{esc(labels.get(lset, '?'))}</span></h5>")
            states(by_label if isinstance(by_label, Mapping) else {lset: by_label})
    else:
        states(conditions)
    flags = r.get("flags") or {}
    if flags:
        body.append("<div>flags: " + ", ".join(f"{esc(k)} = {esc(num(v))}" for k, v in flags.items()) + "</div>")
    if r.get("reason"):
        body.append(f"<div>reason: {esc(r['reason'])}</div>")
    return (
        f"<details id='cond-{run_key(r)}'><summary>{head}"
        f"</summary>{''.join(body) or absent('no conditions recorded')}</details>"
    )


def _rate_block(verdict: Mapping[str, Any], rv: Mapping[str, Any]) -> str:
    rate = rv.get("rate")
    seeds = [str(s) for s in verdict.get("seeds") or sorted(rv.get("seeds") or {})]
    arms = list(verdict.get("arms") or [])
    runs = {(str(r["arm"]).upper(), str(r["seed"])): r for r in verdict.get("runs") or [] if r.get("rate") == rate}
    good = {str(s) for s in rv.get("good_seeds") or []}
    head = "".join(f"<th>seed {esc(s)}{' ✓' if s in good else ''}</th>" for s in seeds)
    rows = []
    for arm in arms:
        cells = []
        for s in seeds:
            r = runs.get((arm.upper(), s))
            if r is None:
                cells.append("<td class='cell-missing'>missing</td>")
                continue
            cls = {"good": "cell-good", "bad": "cell-bad"}.get(_state_class(r), "")
            cells.append(
                f"<td class='{cls}'><a class='state {_state_class(r)}' href='#cond-{run_key(r)}'>{esc(run_state(r))}"
                "</a></td>"
            )
        rows.append(f"<tr><th>{esc(arm.upper())}</th>{''.join(cells)}</tr>")
    details = "".join(run_details(verdict, runs[(a.upper(), s)]) for a in arms for s in seeds if (a.upper(), s) in runs)
    return (
        f"<div class='rate'><h3>{esc(num(rate, 6))} × λref: {badge(rv.get('verdict'))}</h3><p>{esc(rv.get('reason'))}"
        f"</p><table class='states'><thead><tr><th>arm</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        f"<h4>Conditions of each run</h4>{details}</div>"
    )


def _group_block(verdict: Mapping[str, Any], g: Mapping[str, Any]) -> str:
    """A staged family's group (a rate, a burst size, ...): outcome, counts, conditions, seeds."""
    env = {
        **((verdict.get("rule_spec") or {}).get("params") or {}),
        **(g.get("aggregates") or {}),
        **(g.get("derived") or {}),
    }
    parts = [
        f"<div class='rate'><h3>{esc(g.get('group'))}{' × λref' if g.get('rate') is not None else ''}: "
        f"{badge(g.get('outcome'), 'none')}</h3>",
        f"<p>{esc(g.get('reason'))}</p>",
    ]
    if g.get("counts"):
        parts.append("<p>seed counts: " + ", ".join(f"{esc(k)} {esc(v)}" for k, v in g["counts"].items()) + "</p>")
    for name, conds in (g.get("conditions") or {}).items():
        if conds:
            parts.append(
                f"<div><strong>{esc(name)}</strong></div><ul class='conds'>"
                + "".join(condition_html(c, env) for c in conds)
                + "</ul>"
            )
    for name, c in (g.get("checks") or {}).items():
        parts.append(f"<div>check <strong>{esc(name)}</strong></div><ul class='conds'>{condition_html(c, env)}</ul>")
    seeds = g.get("seeds") or {}
    roles = sorted({role for s in seeds.values() for role in (s.get("roles") or {})})
    if seeds and roles:
        head = "".join(f"<th>{esc(x)}</th>" for x in roles)
        rows = []
        for s, d in seeds.items():
            cells = "".join(f"<td>{esc((d.get('roles') or {}).get(x, {}).get('label'))}</td>" for x in roles)
            rows.append(f"<tr><th>seed {esc(s)}{'' if d.get('decided', True) else ' (undecided)'}</th>{cells}</tr>")
        parts.append(
            f"<table class='states'><thead><tr><th></th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        )
    rate = g.get("rate")
    runs = [r for r in verdict.get("runs") or [] if rate is None or r.get("rate") == rate]
    parts.append("<h4>Conditions of each run</h4>" + "".join(run_details(verdict, r) for r in runs))
    parts.append("</div>")
    return "".join(parts)


def verdict_section(verdict: Mapping[str, Any] | None, note: str, path: str | None) -> str:
    if verdict is None:
        return absent(note[:1].upper() + note[1:] if note else "Not scored yet.")
    refs = verdict.get("references") or {}
    out = [
        f"<p>Verdict {badge(verdict.get('verdict'))} by rule <code>{esc(verdict.get('rule'))}</code> (version "
        f"{esc(verdict.get('rule_version'))}); λ_ref = {esc(refs.get('lambda_ref'))} sessions/s, all-miss rate = "
        f"{esc(refs.get('all_miss_token_rate'))} tokens/s; seeds "
        f"{esc(', '.join(str(s) for s in verdict.get('seeds') or []))}. From "
        f"<code>{esc(Path(path).name if path else '')}</code>. Click a state for the conditions that decided it.</p>"
    ]
    blocks = [_rate_block(verdict, rv) for rv in verdict.get("rates") or []]
    blocks += [_group_block(verdict, g) for g in verdict.get("groups") or []]
    out.append(
        "<div class='rates'>" + "".join(blocks) + "</div>" if blocks else absent("the verdict holds no rate or group")
    )
    tests = [(n, c) for n, c in (verdict.get("test_conditions") or {}).items() if c] + [
        (n, [c]) for n, c in (verdict.get("test_checks") or {}).items()
    ]
    if tests:
        out.insert(
            1,
            f"<p>Test outcome {badge(verdict.get('verdict'))}, from the outcomes tried in order:</p>"
            + "".join(
                f"<div><strong>{esc(n)}</strong></div><ul class='conds'>"
                + "".join(condition_html(c, {}) for c in cs)
                + "</ul>"
                for n, cs in tests
            ),
        )
    ol = verdict.get("open_loop") or {}
    if ol.get("not_within"):
        out.append(
            f"<p><strong>Open-loop bound exceeded</strong> by {esc(', '.join(map(str, ol['not_within'])))} "
            "(session-start lateness p99 above the test's bound; states unchanged).</p>"
        )
    reg = verdict.get("registered")
    if reg:
        out.append(registered_block(reg))
    return "\n".join(out)


def registered_block(reg: Mapping[str, Any]) -> str:
    j = reg.get("judged_by") or {}
    r = reg.get("registration") or {}
    out = [
        "<h3>Registered analysis</h3><ul>",
        f"<li>registration <code>{esc(r.get('path'))}</code> ({esc(r.get('status'))}), SHA-256 "
        f"<code>{esc(r.get('sha256'))}</code>, commit <code>{esc(r.get('commit') or 'not committed')}</code></li>",
        f"<li>judged by commit <code>{esc(j.get('commit'))}</code> ({esc(j.get('mode'))}): {esc(j.get('reason'))}</li>",
        f"<li>decisive: {badge('yes', 'PASS') if reg.get('decisive') else badge('no', 'none')}; rule "
        f"<code>{esc(reg.get('rule'))}</code>; references from the registration</li>",
        f"<li>runs counted: {len(reg.get('runs_counted') or [])}; left out: {len(reg.get('runs_excluded') or [])}</li>",
    ]
    for x in reg.get("runs_excluded") or []:
        out.append(
            f"<li class='muted'>left out <code>{esc(Path(str(x.get('run_dir'))).name)}</code>: "
            f"{esc('; '.join(x.get('reasons') or []))}</li>"
        )
    out.append("</ul>")
    kills = reg.get("kill_conditions") or []
    if kills:
        rows = "".join(
            f"<tr><td>{esc(k.get('id'))}</td><td>{esc(k.get('description'))}</td><td>"
            + {True: badge("TRIGGERED", "FAIL"), False: "no", None: "undetermined"}.get(
                k.get("triggered"), esc(k.get("triggered"))
            )
            + f"</td><td>{esc(k.get('detail') or k.get('reason') or '')}</td></tr>"
            for k in kills
        )
        out.append(
            "<h4>Kill conditions</h4><table><thead><tr><th>id</th><th>condition</th><th>triggered</th><th>detail</th>"
            f"</tr></thead><tbody>{rows}</tbody></table>"
        )
    else:
        out.append(absent("The registration names no kill condition."))
    return "".join(out)
