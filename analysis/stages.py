"""The staged rule engine: every registered test family (the paired test E2, BASIN, TOOLSLOW, SHED,
rescue, CUT, MIRROR, the trap-state scores, persistence, E0b) is one spec judged in four stages.

1. **run**: each run's quantities (window statistics, the spec's measures, frozen predictions,
   the arm's perturbation, the references) feed named `derive` expressions and ordered label sets
   (`labels`: the first label whose conditions all hold; the last is the unconditional fallback).
   `count_if` says which runs count at all (completed, driven by the frozen plan, ...).
2. **seed**: within a group, each seed's runs are found by `roles` (arm, optionally rate) and
   combined by `seed.derive` (e.g. ``"n40.endpoint == 'GOOD'"``). A role may name the labels its
   run must show (`expect`: E2's BURST TRAPPED), giving `<role>.good` and `<role>.missed`. A seed
   whose required runs do not all count is *undecided*, unless `seed.decided_if` holds (E2: a
   counted run already missed its state, so the seed fails whatever the missing one would show).
3. **group** (per registered rate, or one group): boolean seed quantities become counts over the
   decided seeds, `aggregates` pool numeric ones (mean, sum, ...), and ordered `outcomes` decide.
   If undecided seeds could change the outcome (every assignment of their boolean quantities is
   tried), the group is INCOMPLETE and the verdict lists the outcomes still possible.
4. **test**: ordered `outcomes` over the groups (``n_outcome('PASS') == n_groups``) and test-wide
   totals (``total('refuting') >= 2``: R1's refutation across both rates).

Every condition is recorded with its truth and, for a comparison, both sides' values, so a verdict
says why each run, seed, group and the test is what it is. Nothing here measures or predicts:
quantities arrive computed (analysis.measures) and predictions arrive frozen (analysis.predictions);
specs arrive checked (analysis/rulecheck.py).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from analysis.expr import NAN, RUN_NAN_PREFIXES, Env, Evaluator, ordered, truth
from harness.errors import RuleError

COUNTED = "complete"
NOT_COUNTED = ("MISSING", "FAILED", "INVALID", "NOT-COUNTED", "PARTIAL")
MAX_ENUMERATION = 4096  # assignments of undecided seeds tried before a group is simply INCOMPLETE
TEST_FUNCTIONS = ("n_outcome", "total", "at", "edge", "monotone")


def _plain(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if hasattr(v, "item"):
        return v.item()
    return v


# ---------------------------------------------------------------------------------------------
# stage 1: runs
# ---------------------------------------------------------------------------------------------
@dataclass
class StagedRun:
    """One run as the staged engine judged it."""

    arm: str
    rate: float
    seed: int
    status: str  # 'complete' (counts) or one of NOT_COUNTED
    quantities: dict[str, Any] = field(default_factory=dict)
    derived: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, str | None] = field(default_factory=dict)  # None: no item of the set holds
    conditions: dict[str, dict[str, list[dict[str, Any]]]] = field(default_factory=dict)
    flags: dict[str, bool] = field(default_factory=dict)
    count_if: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""
    run_dir: str = ""

    @property
    def counted(self) -> bool:
        return self.status == COUNTED

    def env(self) -> dict[str, Any]:
        """Everything a seed-level expression may read of this run, under the role's prefix."""
        out: dict[str, Any] = {
            **self.quantities,
            **self.derived,
            **self.flags,
            "status": self.status,
            "counted": self.counted,
            "arm": self.arm,
            "rate": self.rate,
            "seed": self.seed,
        }
        for lset, label in self.labels.items():
            out[lset] = label
            for lab, conds in self.conditions.get(lset, {}).items():
                out[f"{lset}.{lab}"] = self.counted and all(c["holds"] for c in conds)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "arm": self.arm,
            "rate": self.rate,
            "seed": self.seed,
            "status": self.status,
            "labels": self.labels,
            "conditions": self.conditions,
            "flags": self.flags,
            "count_if": self.count_if,
            "derived": {k: _plain(v) for k, v in self.derived.items()},
            "quantities": {
                k: _plain(v) for k, v in self.quantities.items() if isinstance(v, (int, float, str, bool)) or v is None
            },
            "reason": self.reason,
            "run_dir": self.run_dir,
        }


def _label_sets(spec: Mapping[str, Any]) -> list[tuple[str, list[Mapping[str, Any]]]]:
    out = [("state", list(spec["states"]))] if "states" in spec else []
    return out + ordered((spec.get("run") or {}).get("labels"), "run.labels")


def judge_staged_run(
    spec: Mapping[str, Any],
    arm: str,
    rate: float,
    seed: int,
    quantities: Mapping[str, Any] | None,
    *,
    status: str = COUNTED,
    reason: str = "",
    run_dir: str = "",
    missing_as_nan: bool = False,
) -> StagedRun:
    """Stage 1 for one run (`missing_as_nan`: a quantity the table lacks reads as NaN instead of
    being a spec error; for scoring printed tables, which never hold every quantity). A run that
    is missing, failed, partial or shorter than min_window keeps
    that status as every label; a run failing `count_if` is NOT-COUNTED but keeps its labels, so the
    report can still say what it would have been."""
    params = spec["params"]
    sets = _label_sets(spec)
    q = dict(quantities or {})
    if quantities is None:
        status = "MISSING"
    if status != COUNTED:
        return StagedRun(
            arm,
            rate,
            seed,
            status,
            q,
            labels={n: status for n, _ in sets},
            reason=reason or status.lower(),
            run_dir=run_dir,
        )
    wlen = q.get("window_len")
    if wlen is not None and "min_window" in params and float(wlen) + 1e-9 < float(params["min_window"]):
        return StagedRun(
            arm,
            rate,
            seed,
            "INVALID",
            q,
            labels={n: "INVALID" for n, _ in sets},
            reason=f"window {float(wlen):g} s shorter than min_window {params['min_window']}",
            run_dir=run_dir,
        )
    env = Env(params, q, {}, nan_prefixes=RUN_NAN_PREFIXES, all_nan=missing_as_nan)
    ev = Evaluator(env)
    run = spec.get("run") or {}
    derived: dict[str, Any] = {}
    for name, expr in ordered(run.get("derive"), "run.derive"):
        derived[name] = ev(expr)
        env.set(name, derived[name])
    counts = [ev.detail(c) for c in run.get("count_if", [])]
    labels: dict[str, str | None] = {}  # None: no item of the set holds
    conds: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for lset, items in sets:
        conds[lset] = {}
        chosen = None
        for it in items:
            ds = [ev.detail(c) for c in it.get("all", [])]
            conds[lset][it["name"]] = ds
            env.set(f"{lset}.{it['name']}", all(d["holds"] for d in ds))
            if chosen is None and all(d["holds"] for d in ds):
                chosen = it["name"]
        labels[lset] = chosen
        env.set(lset, chosen)
    flags = {
        k: truth(ev(e)) for k, e in [*ordered(spec.get("flags"), "flags"), *ordered(run.get("flags"), "run.flags")]
    }
    out = StagedRun(arm, rate, seed, COUNTED, q, derived, labels, conds, flags, counts, reason, run_dir)
    if not all(c["holds"] for c in counts):
        out.status = "NOT-COUNTED"
        out.reason = "; ".join(f"not ({c['condition']})" for c in counts if not c["holds"])
    return out


# ---------------------------------------------------------------------------------------------
# stages 2-4: seeds, groups, test
# ---------------------------------------------------------------------------------------------
AGGREGATES: dict[str, Callable[[list[float]], float]] = {
    "mean": lambda v: sum(v) / len(v) if v else NAN,
    "sum": lambda v: float(sum(v)),
    "min": lambda v: min(v) if v else NAN,
    "max": lambda v: max(v) if v else NAN,
    "median": lambda v: (
        (sorted(v)[len(v) // 2] if len(v) % 2 else 0.5 * sum(sorted(v)[len(v) // 2 - 1 : len(v) // 2 + 1]))
        if v
        else NAN
    ),
    "count": lambda v: float(len(v)),
}


def _arm_names(role: Mapping[str, Any]) -> list[str]:
    a = role["arm"]
    return [x.lower() for x in ([a] if isinstance(a, str) else a)]


def _find(runs: Sequence[StagedRun], role: Mapping[str, Any], rate: float | None, seed: int) -> StagedRun | None:
    want_rate = role.get("rate", rate)
    arms = _arm_names(role)
    hits = [
        r
        for r in runs
        if r.arm.lower() in arms and r.seed == seed and (want_rate is None or abs(r.rate - float(want_rate)) < 1e-9)
    ]
    if len(hits) > 1:
        raise RuleError(f"role {role}: {len(hits)} runs for seed {seed} at rate {want_rate}; expected one")
    return hits[0] if hits else None


@dataclass
class _Seed:
    seed: int
    decided: bool
    env: Env
    derived: dict[str, Any]
    details: dict[str, dict[str, Any]]
    roles: dict[str, dict[str, Any]]


def takes_part(role: Mapping[str, Any], arms: Sequence[str] | None) -> bool:
    """A role plays in every seed, unless it is `registered_only` and the test does not register
    its arm (the paired test judges the arms it runs: a test of NOBURST alone judges NOBURST)."""
    if not role.get("registered_only") or arms is None:
        return True
    return any(a.lower() in _arm_names(role) for a in arms)


def shown_label(role: Mapping[str, Any], run: StagedRun) -> str:
    """The label a role's run shows: that of the role's `show` set, else of the run's first set."""
    show = role.get("show")
    if show:
        return run.labels.get(show) or run.status
    return next(iter(run.labels.values()), None) or run.status


def _judge_seed(
    spec: Mapping[str, Any],
    runs: Sequence[StagedRun],
    rate: float | None,
    seed: int,
    lenient: bool = False,
    arms: Sequence[str] | None = None,
) -> _Seed:
    """Stage 2 for one seed. A role with `expect` also gives `<role>.good` (its run counts and shows
    an expected label) and `<role>.missed` (its run counts and shows another); a role that takes no
    part in this test has nothing to miss (good, not missed). `seed.decided_if` decides a seed
    whose required runs do not all count, when what the others show settles it already."""
    params = spec["params"]
    layers: dict[str, Any] = {"rate": rate if rate is not None else NAN, "seed": seed}
    roles_out: dict[str, dict[str, Any]] = {}
    decided = True
    missing_prefixes = []
    for rname, role in spec["roles"].items():
        if not takes_part(role, arms):
            missing_prefixes.append(rname)
            if "expect" in role:
                layers[f"{rname}.good"], layers[f"{rname}.missed"] = True, False
            continue
        run = _find(runs, role, rate, seed)
        if "expect" in role:
            shown = shown_label(role, run) if run is not None and run.counted else None
            layers[f"{rname}.good"] = shown is not None and shown in role["expect"]
            layers[f"{rname}.missed"] = shown is not None and shown not in role["expect"]
        if run is None:
            layers[f"{rname}.status"] = "MISSING"
            layers[f"{rname}.counted"] = False
            for lset, _ in _label_sets(spec):
                layers[f"{rname}.{lset}"] = "MISSING"
            missing_prefixes.append(rname)
            roles_out[rname] = {"arm": _arm_names(role)[0], "status": "MISSING", "label": "MISSING"}
        else:
            for k, v in run.env().items():
                layers[f"{rname}.{k}"] = v
            roles_out[rname] = {
                "arm": run.arm,
                "status": run.status,
                "label": shown_label(role, run) if run.counted else run.status,
                "run_dir": run.run_dir,
            }
        required = role.get("required", True)
        if isinstance(required, str):
            required = truth(Evaluator(params)(required))
        if required and (run is None or not run.counted):
            decided = False
    env = Env(params, layers, {}, nan_prefixes=missing_prefixes, all_nan=lenient)
    ev = Evaluator(env)
    derived: dict[str, Any] = {}
    details: dict[str, dict[str, Any]] = {}
    seed_spec = spec.get("seed") or {}
    for name, expr in ordered(seed_spec.get("derive"), "seed.derive"):
        details[name] = ev.detail(expr)
        derived[name] = ev(expr)
        env.set(name, derived[name])
    if not decided and seed_spec.get("decided_if") and truth(ev(seed_spec["decided_if"])):
        decided = True
    return _Seed(seed, decided, env, derived, details, roles_out)


def _group_env(
    spec: Mapping[str, Any],
    seeds: list[_Seed],
    n_registered: int,
    rate: float | None,
    override: Mapping[tuple[int, str], bool] | None = None,
) -> tuple[Env, dict[str, Any], dict[str, Any]]:
    params = spec["params"]
    group = spec["group"]
    bools = _bool_names(seeds)
    counts: dict[str, Any] = {}
    for b in bools:
        n = 0
        for s in seeds:
            if override is not None and (s.seed, b) in override:
                n += override[(s.seed, b)]
            elif s.decided:
                n += truth(s.derived.get(b))
        counts[b] = n
    aggs = _aggregate(group.get("aggregates"), [s.env for s in seeds if s.decided], "group.aggregates")
    base = {
        "rate": rate if rate is not None else NAN,
        "n_seeds": n_registered,
        "n_decided": sum(s.decided for s in seeds),
        "n_undecided": sum(not s.decided for s in seeds),
    }
    return Env(params, base, counts, aggs, {}), counts, aggs


def _aggregate(section: Any, envs: Sequence[Mapping[str, Any]], where: str) -> dict[str, Any]:
    """Pool a quantity over seeds (group) or runs (test): fn over the values of `of` where `where`
    holds; NaN values are left out, and an empty pool is NaN (count: 0)."""
    aggs: dict[str, Any] = {}
    for aname, a in ordered(section, where):
        vals = []
        for env in envs:
            ev = Evaluator(env)
            if a.get("where") and not truth(ev(a["where"])):
                continue
            v = ev(a["of"]) if a.get("of") else 1.0
            if isinstance(v, bool):
                v = float(v)
            if isinstance(v, (int, float)) and not math.isnan(float(v)):
                vals.append(float(v))
        aggs[aname] = AGGREGATES[a["fn"]](vals)
    return aggs


def _bool_names(seeds: list[_Seed]) -> list[str]:
    names: list[str] = []
    for s in seeds:
        for k, v in s.derived.items():
            if isinstance(v, bool) and k not in names:
                names.append(k)
    return names


def _decide(
    spec: Mapping[str, Any], env: Env
) -> tuple[str, dict[str, Any], dict[str, Any], dict[str, list[dict[str, Any]]]]:
    group = spec["group"]
    ev = Evaluator(env)
    derived: dict[str, Any] = {}
    for name, expr in ordered(group.get("derive"), "group.derive"):
        derived[name] = ev(expr)
        env.set(name, derived[name])
    checks: dict[str, Any] = {}
    for name, expr in ordered(group.get("checks"), "group.checks"):
        checks[name] = ev.detail(expr)
        env.set(name, checks[name]["holds"])
    conds: dict[str, list[dict[str, Any]]] = {}
    outcome = None
    for it in group["outcomes"]:
        ds = [ev.detail(c) for c in it.get("all", [])]
        conds[it["name"]] = ds
        if outcome is None and all(d["holds"] for d in ds):
            outcome = it["name"]
    return outcome or group["outcomes"][-1]["name"], derived, checks, conds


def _judge_group(
    spec: Mapping[str, Any],
    runs: Sequence[StagedRun],
    rate: float | None,
    seeds: Sequence[int],
    label: str,
    lenient: bool = False,
    arms: Sequence[str] | None = None,
) -> dict[str, Any]:
    ss = [_judge_seed(spec, runs, rate, s, lenient, arms) for s in seeds]
    env, counts, aggs = _group_env(spec, ss, len(seeds), rate)
    outcome, derived, checks, conds = _decide(spec, env)
    possible = {outcome}
    undecided = [s for s in ss if not s.decided]
    bools = _bool_names(ss)
    reason = ""
    min_seeds = spec["group"].get("min_seeds")
    if min_seeds is not None and len(seeds) < int(min_seeds):
        possible = set()
        reason = f"{len(seeds)} seeds registered; the rule needs at least {min_seeds}"
    elif undecided and bools:
        slots = [(s.seed, b) for s in undecided for b in bools]
        if 2 ** len(slots) > MAX_ENUMERATION:
            possible = set()
        else:
            for values in itertools.product((False, True), repeat=len(slots)):
                e2, _, _ = _group_env(spec, ss, len(seeds), rate, dict(zip(slots, values)))
                possible.add(_decide(spec, e2)[0])
    elif undecided:
        possible = set()
    final = outcome if len(possible) == 1 else "INCOMPLETE"
    if not reason:
        if final == "INCOMPLETE":
            miss = ", ".join(f"seed {s.seed}" for s in undecided)
            reason = f"{miss} lack counted runs; outcomes still possible: {sorted(possible) or 'any'}"
        else:
            held = [c["condition"] for c in conds.get(final, [])]
            reason = f"{final}: " + ("; ".join(held) if held else "no earlier outcome's conditions hold")
            if undecided:
                reason += f" (whatever the {len(undecided)} undecided seed(s) would show)"
    return {
        "group": label,
        "rate": rate,
        "outcome": final,
        "possible_outcomes": sorted(possible),
        "reason": reason,
        "counts": counts,
        "aggregates": {k: _plain(v) for k, v in aggs.items()},
        "derived": {k: _plain(v) for k, v in derived.items()},
        "checks": checks,
        "conditions": conds,
        "seeds": {
            str(s.seed): {
                "decided": s.decided,
                "roles": s.roles,
                "derived": {k: _plain(v) for k, v in s.derived.items()},
                "details": s.details,
            }
            for s in ss
        },
    }


def _test_functions(groups: list[dict[str, Any]]) -> dict[str, Callable[..., Any]]:
    def n_outcome(name: str) -> int:
        return sum(1 for g in groups if g["outcome"] == name)

    def total(name: str) -> float:
        return float(sum(g["counts"].get(name, 0) for g in groups))

    def at(rate: float, name: str) -> Any:
        for g in groups:
            if g["rate"] is not None and abs(float(g["rate"]) - float(rate)) < 1e-9:
                for sect in ("counts", "aggregates", "derived"):
                    if name in g[sect]:
                        v = g[sect][name]
                        return NAN if v is None else v
                if name == "outcome":
                    return g["outcome"]
        return NAN

    rated = sorted((g for g in groups if g["rate"] is not None), key=lambda g: float(g["rate"]))

    def edge(name: str) -> float:
        best = NAN
        for g in rated:
            if g["outcome"] != name:
                break
            best = float(g["rate"])
        return best

    def monotone(name: str) -> bool:
        seen_other = False
        for g in rated:
            if g["outcome"] != name:
                seen_other = True
            elif seen_other:
                return False
        return True

    return {"n_outcome": n_outcome, "total": total, "at": at, "edge": edge, "monotone": monotone}


def judge_staged(
    spec: Mapping[str, Any],
    runs: Sequence[StagedRun],
    *,
    rates: Sequence[float],
    seeds: Sequence[int],
    arms: Sequence[str] | None = None,
    missing_as_nan: bool = False,
) -> dict[str, Any]:
    """Stages 2-4 over the registered rates and seeds: the test verdict with every group's and
    seed's evidence (the runs' own evidence is in `StagedRun.to_json`). `arms`: the arms the test
    registers (None: every role plays), for roles that are `registered_only`."""
    if spec.get("group_by", "rate") == "rate":
        groups = [_judge_group(spec, runs, float(r), seeds, f"{float(r):g}", missing_as_nan, arms) for r in rates]
    else:
        groups = [_judge_group(spec, runs, None, seeds, "all", missing_as_nan, arms)]
    test = spec.get("test") or {}
    run_envs = [
        Env(spec["params"], r.env(), nan_prefixes=RUN_NAN_PREFIXES, all_nan=missing_as_nan) for r in runs if r.counted
    ]
    taggs = _aggregate(test.get("aggregates"), run_envs, "test.aggregates")
    env = Env(spec["params"], {"n_groups": len(groups), "n_runs": len(run_envs)}, taggs, {})
    ev = Evaluator(env, _test_functions(groups))
    derived: dict[str, Any] = {}
    for name, expr in ordered(test.get("derive"), "test.derive"):
        derived[name] = ev(expr)
        env.set(name, derived[name])
    checks: dict[str, Any] = {}
    for name, expr in ordered(test.get("checks"), "test.checks"):
        checks[name] = ev.detail(expr)
        env.set(name, checks[name]["holds"])
    conds: dict[str, list[dict[str, Any]]] = {}
    if test.get("outcomes"):
        verdict = None
        for it in test["outcomes"]:
            ds = [ev.detail(c) for c in it.get("all", [])]
            conds[it["name"]] = ds
            if verdict is None and all(d["holds"] for d in ds):
                verdict = it["name"]
    else:
        outs = {g["outcome"] for g in groups}
        verdict = outs.pop() if len(outs) == 1 else "SPLIT"
    return {
        "rule": spec["name"],
        "rule_version": spec.get("version"),
        "family": spec.get("family", spec["name"]),
        "verdict": verdict,
        "test_conditions": conds,
        "test_aggregates": {k: _plain(v) for k, v in taggs.items()},
        "test_derived": {k: _plain(v) for k, v in derived.items()},
        "test_checks": checks,
        "groups": groups,
    }
