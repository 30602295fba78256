"""A rule spec checked before anything is judged with it.

What a registration freezes must be complete: every threshold, span, bin and window a verdict or a
figure uses is the spec's, so nothing is filled in by code when a spec lacks it. This module refuses,
with the field named:

* a malformed structure or condition (the sections of analysis/stages.py, the condition language of
  analysis/expr.py);
* a spec without the parameters every run's window statistics read (`REQUIRED_PARAMS`), or those
  its report reads (analysis/reports `REPORT_PARAMS`);
* a measure that does not give every argument its metric takes (analysis/quantities.py `METRIC_ARGS`);
* a condition that reads a name which is neither a parameter, nor a quantity every run has
  (analysis/quantities.py), nor a name the spec defines before it (a measure, a derived quantity,
  a label, a role's run, a seed quantity, an aggregate). A parameter removed from a spec is so
  refused when the spec is loaded, not discovered as an unknown quantity (or a NaN) in some run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from analysis.expr import names, ordered, parse
from analysis.quantities import GROUP_BASE, LITERAL_ARGS, METRIC_ARGS, PREFIXES, RUN_ENV, RUN_QUANTITIES, TEST_BASE
from analysis.reports import REPORT_PARAMS
from analysis.stages import AGGREGATES, TEST_FUNCTIONS
from harness.errors import RuleError

# Read by every run's window statistics (analysis.metrics.run_statistics), its figure series and the
# run stage, whatever the family: a spec must state each.
REQUIRED_PARAMS: dict[str, str] = {
    "backlog_bin": "the width (s) of the backlog bins of the window statistics and the figures",
    "recovered_span": "the span (s) at the end of a run over which RECOVERED is judged",
    "hit_threshold": "the share of a prompt served from cache above which a turn hits",
    "outstanding_stat": "how the last span's outstanding backlog is summarised: mean, max or end",
    "slope_factor": "the factor of (lam - lam_miss) that gives every run's slope_threshold",
    "min_window": "the shortest evaluation window (s) the rule accepts",
}
OUTSTANDING_STATS = ("mean", "max", "end")
ROLE_KEYS = ("arm", "rate", "show", "required", "expect", "registered_only")


class _Scope:
    """The names an expression may read at one stage: exact names, prefixes, and role prefixes
    whose remainder must be a name of the role's run."""

    def __init__(
        self, exact: Iterable[str] = (), prefixes: Sequence[str] = (), roles: Mapping[str, _Scope] | None = None
    ) -> None:
        self.exact = set(exact)
        self.prefixes = tuple(prefixes)
        self.roles = dict(roles or {})

    def add(self, *names: str) -> None:
        self.exact.update(names)

    def knows(self, name: str) -> bool:
        if name in self.exact or name.startswith(self.prefixes):
            return True
        head, _, rest = name.partition(".")
        return bool(rest) and head in self.roles and self.roles[head].knows(rest)


def _check_exprs(exprs: Sequence[str], where: str, funcs: frozenset[str] = frozenset()) -> None:
    for e in exprs:
        try:
            parse(e, funcs)
        except RuleError as exc:
            raise RuleError(f"{where}: {exc}") from None


def _check_labelled(items: Any, where: str, funcs: frozenset[str] = frozenset()) -> list[str]:
    if not isinstance(items, list) or not items:
        raise RuleError(f"{where}: expected a non-empty list of {{name, all}} entries")
    out = []
    for it in items:
        if not isinstance(it, Mapping) or "name" not in it or not isinstance(it.get("all", []), list):
            raise RuleError(f"{where}: each entry needs a name and a list 'all' of conditions, got {it!r}")
        out.append(it["name"])
        _check_exprs(it.get("all", []), f"{where}.{it['name']}", funcs)
    if len(set(out)) != len(out):
        raise RuleError(f"{where}: duplicate names {out}")
    if items[-1].get("all"):
        raise RuleError(
            f"{where}: the last entry ({items[-1]['name']}) must be the unconditional fallback (empty 'all')"
        )
    return out


def _check_aggregates(name: str, section: Any, where: str, what: str) -> None:
    for aname, a in ordered(section, f"{name}.{where}"):
        fn = a.get("fn") if isinstance(a, Mapping) else None
        if fn not in AGGREGATES or ("of" not in a and fn != "count"):
            raise RuleError(
                f"rule spec {name!r}: {what} {aname!r} needs fn in {sorted(AGGREGATES)} and 'of', got {a!r}"
            )
        _check_exprs([x for x in (a.get("of"), a.get("where")) if x], f"{name}.{where}.{aname}")


def _check_params(name: str, params: Mapping[str, Any], report: str | None) -> None:
    for key, what in {**REQUIRED_PARAMS, **REPORT_PARAMS.get(report or "", {})}.items():
        if key not in params:
            raise RuleError(f"rule spec {name!r}: params.{key}: missing; expected {what}")
    for key in ("backlog_bin", "recovered_span", "min_window"):
        v = params[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise RuleError(f"rule spec {name!r}: params.{key}: got {v!r}; expected a number of seconds > 0")
    h = params["hit_threshold"]
    if isinstance(h, bool) or not isinstance(h, (int, float)) or not 0 <= h < 1:
        raise RuleError(f"rule spec {name!r}: params.hit_threshold: got {h!r}; expected a share in [0, 1)")
    if params["outstanding_stat"] not in OUTSTANDING_STATS:
        raise RuleError(
            f"rule spec {name!r}: params.outstanding_stat: got {params['outstanding_stat']!r}; "
            f"expected one of {list(OUTSTANDING_STATS)}"
        )


def _check_measures(name: str, section: Any) -> None:
    for mname, m in ordered(section, f"{name}.measures"):
        if not isinstance(m, Mapping) or m.get("metric") not in METRIC_ARGS:
            raise RuleError(
                f"rule spec {name!r}: measure {mname!r}: metric must be one of {sorted(METRIC_ARGS)}, got {m!r}"
            )
        want = METRIC_ARGS[m["metric"]]
        given = [k for k in m if k != "metric"]
        missing = [k for k in want if k not in given]
        unknown = [k for k in given if k not in want]
        if missing or unknown:
            raise RuleError(
                f"rule spec {name!r}: measures.{mname}.{(missing or unknown)[0]}: "
                f"{'missing' if missing else 'not an argument of ' + m['metric']}; "
                f"metric {m['metric']} takes {list(want) or 'no arguments'}"
            )


def _label_sets(spec: Mapping[str, Any]) -> dict[str, list[str]]:
    run = spec.get("run") or {}
    sets = {"state": [s["name"] for s in spec["states"]]} if "states" in spec else {}
    sets.update({lname: [it["name"] for it in items] for lname, items in ordered(run.get("labels"), "run.labels")})
    return sets


def _check_roles(name: str, spec: Mapping[str, Any], sets: Mapping[str, list[str]]) -> None:
    roles = spec["roles"]
    if not isinstance(roles, Mapping):
        raise RuleError(f"rule spec {name!r}: roles must map role names to {{arm: ...}}")
    for rname, r in roles.items():
        if not isinstance(r, Mapping) or "arm" not in r:
            raise RuleError(f"rule spec {name!r}: role {rname!r} needs an arm, got {r!r}")
        bad = [k for k in r if k not in ROLE_KEYS]
        if bad:
            raise RuleError(f"rule spec {name!r}: roles.{rname}.{bad[0]}: unknown key; a role takes {list(ROLE_KEYS)}")
        if isinstance(r.get("required", True), str):
            _check_exprs([r["required"]], f"{name}.roles.{rname}.required")
        show = r.get("show") or next(iter(sets), None)
        if r.get("show") is not None and r["show"] not in sets:
            raise RuleError(f"rule spec {name!r}: roles.{rname}.show: got {r['show']!r}; expected one of {list(sets)}")
        if "expect" in r:
            exp = r["expect"]
            if not isinstance(exp, list) or not exp or any(x not in sets.get(show or "", []) for x in exp):
                raise RuleError(
                    f"rule spec {name!r}: roles.{rname}.expect: got {exp!r}; expected a non-empty list of the "
                    f"labels of {show!r}: {sets.get(show or '', [])}"
                )


def validate_staged(spec: Mapping[str, Any]) -> None:
    """Structure, condition syntax, required parameters, measure arguments and the names every
    condition reads; RuleError says where and what."""
    name = spec.get("name", "?")
    for key in ("name", "params", "roles", "group"):
        if key not in spec:
            raise RuleError(f"rule spec {name!r}: missing {key!r}")
    if not isinstance(spec["params"], Mapping):
        raise RuleError(f"rule spec {name!r}: params must be a mapping")
    _check_params(name, spec["params"], spec.get("report"))
    _check_measures(name, spec.get("measures"))
    run = spec.get("run", {}) or {}
    if "states" in spec:
        _check_labelled(spec["states"], f"{name}.states")
    _check_exprs([e for _, e in ordered(run.get("derive"), f"{name}.run.derive")], f"{name}.run.derive")
    for lname, items in ordered(run.get("labels"), f"{name}.run.labels"):
        _check_labelled(items, f"{name}.run.labels.{lname}")
    for section in (spec.get("flags"), run.get("flags")):
        _check_exprs([e for _, e in ordered(section, f"{name}.flags")], f"{name}.flags")
    _check_exprs(list(run.get("count_if", [])), f"{name}.run.count_if")
    _check_roles(name, spec, _label_sets(spec))
    if spec.get("group_by", "rate") not in ("rate", "none"):
        raise RuleError(f"rule spec {name!r}: group_by must be 'rate' or 'none', got {spec.get('group_by')!r}")
    seed = spec.get("seed", {}) or {}
    _check_exprs([e for _, e in ordered(seed.get("derive"), f"{name}.seed.derive")], f"{name}.seed.derive")
    if seed.get("decided_if") is not None:
        _check_exprs([seed["decided_if"]], f"{name}.seed.decided_if")
    group = spec["group"]
    if group.get("min_seeds") is not None and (
        isinstance(group["min_seeds"], bool) or not isinstance(group["min_seeds"], int)
    ):
        raise RuleError(f"rule spec {name!r}: group.min_seeds: got {group['min_seeds']!r}; expected a whole number")
    _check_aggregates(name, group.get("aggregates"), "group.aggregates", "aggregate")
    _check_exprs([e for _, e in ordered(group.get("derive"), f"{name}.group.derive")], f"{name}.group.derive")
    _check_exprs([e for _, e in ordered(group.get("checks"), f"{name}.group.checks")], f"{name}.group.checks")
    _check_labelled(group.get("outcomes"), f"{name}.group.outcomes")
    test = spec.get("test", {}) or {}
    tf = frozenset(TEST_FUNCTIONS)
    _check_aggregates(name, test.get("aggregates"), "test.aggregates", "test aggregate")
    _check_exprs([e for _, e in ordered(test.get("derive"), f"{name}.test.derive")], f"{name}.test.derive", tf)
    _check_exprs([e for _, e in ordered(test.get("checks"), f"{name}.test.checks")], f"{name}.test.checks", tf)
    if test.get("outcomes") is not None:
        _check_labelled(test["outcomes"], f"{name}.test.outcomes", tf)
    check_names(spec)


# ---------------------------------------------------------------------------------------------
# names
# ---------------------------------------------------------------------------------------------
def _reads(spec_name: str, where: str, expr: str, scope: _Scope) -> None:
    for n in sorted(names(expr)):
        if not scope.knows(n):
            raise RuleError(
                f"rule spec {spec_name!r}: {where}: `{expr}` reads {n!r}, which is no parameter (params.{n}), "
                "no quantity every run has, and no name the spec defines before it"
            )


def _labelled(spec_name: str, where: str, items: Any, scope: _Scope) -> None:
    for it in items or []:
        for c in it.get("all", []):
            _reads(spec_name, f"{where}.{it['name']}", c, scope)


def check_names(spec: Mapping[str, Any]) -> None:
    """Every name every expression reads resolves at its stage (see the module docstring)."""
    name = spec.get("name", "?")
    params = set(spec["params"])
    run = spec.get("run") or {}
    # stage 1: the run's quantities, then its measures in order, its derived quantities, its labels
    scope = _Scope(params | RUN_QUANTITIES, PREFIXES)
    for mname, m in ordered(spec.get("measures"), "measures"):
        for k, v in m.items():
            if k != "metric" and k not in LITERAL_ARGS and isinstance(v, str):
                _reads(name, f"measures.{mname}.{k}", v, scope)
        scope.add(mname)
        scope.prefixes += (f"{mname}.",)
    for dname, expr in ordered(run.get("derive"), "run.derive"):
        _reads(name, f"run.derive.{dname}", expr, scope)
        scope.add(dname)
    for c in run.get("count_if", []):
        _reads(name, "run.count_if", c, scope)
    sets = _label_sets(spec)
    for lset, labels in sets.items():
        scope.add(lset, *(f"{lset}.{lab}" for lab in labels))
    _labelled(name, "states", spec.get("states"), scope)
    for lset, items in ordered(run.get("labels"), "run.labels"):
        _labelled(name, f"run.labels.{lset}", items, scope)
    flags = [*ordered(spec.get("flags"), "flags"), *ordered(run.get("flags"), "run.flags")]
    for fname, expr in flags:
        _reads(name, f"flags.{fname}", expr, scope)
    run_env = _Scope(scope.exact | {f for f, _ in flags} | set(RUN_ENV), scope.prefixes)
    # stage 2: each role's run under its role's name, then the seed's derived quantities
    for rname, role in spec["roles"].items():
        if isinstance(role.get("required", True), str):
            _reads(name, f"roles.{rname}.required", role["required"], _Scope(params))
    roles = {
        r: _Scope(run_env.exact | ({"good", "missed"} if "expect" in role else set()), run_env.prefixes)
        for r, role in spec["roles"].items()
    }
    seed_scope = _Scope(params | {"rate", "seed"}, (), roles)
    seed = spec.get("seed") or {}
    for dname, expr in ordered(seed.get("derive"), "seed.derive"):
        _reads(name, f"seed.derive.{dname}", expr, seed_scope)
        seed_scope.add(dname)
    if seed.get("decided_if") is not None:
        _reads(name, "seed.decided_if", seed["decided_if"], seed_scope)
    # stage 3: counts of the seeds' quantities, aggregates over the seeds, derived, checks
    group = spec["group"]
    gscope = _Scope(params | set(GROUP_BASE) | {d for d, _ in ordered(seed.get("derive"), "seed.derive")})
    for aname, a in ordered(group.get("aggregates"), "group.aggregates"):
        for k in ("of", "where"):
            if a.get(k):
                _reads(name, f"group.aggregates.{aname}.{k}", a[k], seed_scope)
        gscope.add(aname)
    for section in ("derive", "checks"):
        for dname, expr in ordered(group.get(section), f"group.{section}"):
            _reads(name, f"group.{section}.{dname}", expr, gscope)
            gscope.add(dname)
    _labelled(name, "group.outcomes", group.get("outcomes"), gscope)
    # stage 4: the groups through the test functions, aggregates over the counted runs
    test = spec.get("test") or {}
    tscope = _Scope(params | set(TEST_BASE))
    for aname, a in ordered(test.get("aggregates"), "test.aggregates"):
        for k in ("of", "where"):
            if a.get(k):
                _reads(name, f"test.aggregates.{aname}.{k}", a[k], run_env)
        tscope.add(aname)
    for section in ("derive", "checks"):
        for dname, expr in ordered(test.get(section), f"test.{section}"):
            _reads(name, f"test.{section}.{dname}", expr, tscope)
            tscope.add(dname)
    _labelled(name, "test.outcomes", test.get("outcomes"), tscope)
