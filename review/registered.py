"""The registered analysis: a test's verdict as its registration fixes it.

`agentload analyze --registration REG RUNS...` differs from a plain `analyze` in three ways, each
the paper's (App. E.5, E.11; rules digest §2.4, Decision 19):

* the rule spec and the references are the registration's; nothing on the command line can
  change them (a plain analyze takes --rule / --lambda-ref overrides, this one refuses them);
* only runs bound to the registration count: meta.json's registration SHA-256 is the file's, the
  plan SHA-256 is the registered plan of that arm, rate and seed, the cell is the registered cell
  (engine, version, model, GPU; pool within `pool_tolerance_tokens`), and the run's code commit is
  the registration's or a descendant that changes nothing under harness/, analysis/, prereg/ or
  slurm/. Every other run is listed with the reason and left out; registered runs that are absent
  count as missing;
* the analysis code that judges is the code of the registration's commit. When the checkout has
  moved on (any change under those folders since that commit, or uncommitted changes there), that
  commit is checked out in a temporary `git worktree` and its own `analyze` command judges the
  bound runs, given the registration's rule spec and references as files; the verdict says which
  commit judged and how.

The kill conditions are then evaluated on the judged per-seed states (analysis/kill.py) and reported
beside the rate verdicts.

Every registration is judged by the one analysis (analysis/staged_analysis.py) with its frozen rule
spec, arms, rates, seeds and references, the code path a plain `analyze --test` takes; the paired
test E2 writes its paired verdict (analysis/paired.py), every other family (BASIN, TOOLSLOW, SHED,
rescue, CUT, MIRROR, the scores) its staged one, where a run counts only if it names this
registration. A registration made before E2 became a staged spec froze its rule in the paired form;
only its own commit's code can judge that, so it is judged in a worktree of that commit whatever
the checkout holds. Rules that compare with a model prediction read a frozen prediction file
(`--predictions`, else the predictions.json a `test run` froze beside the runs); the verdict
records its SHA-256.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
import yaml

from analysis.judge import exit_status
from analysis.kill import evaluate_kill_conditions
from analysis.paired import is_paired
from analysis.predictions import Predictions
from analysis.reports import module_for, write_report
from analysis.rules import is_paired_form
from analysis.staged_analysis import analyze_staged
from harness.errors import UsageError
from harness.recording.schema import meta_files_under
from prereg.labels import git_facts
from prereg.registration import RegistrationError, cell_dict, load_registration
from provenance.codepaths import CODE_DIRS, is_code_path
from provenance.git import GitError, Repo
from provenance.meta import sha256_file
from review.binding import bind_run
from slurm.manifest import RUNS


class RegisteredAnalysisError(UsageError):
    """The registered analysis cannot be run as asked (the message says what to change)."""


def _expand(paths: Sequence[str | Path]) -> list[Path]:
    out: list[Path] = []
    for x in paths:
        p = Path(x)
        if (p / "meta.json").exists():
            out.append(p)
        else:
            out += sorted(q.parent for q in meta_files_under(p))
    return out


def _code_moved(repo: Any, reg_commit: str) -> list[str]:
    """Code paths that differ between the registration's commit and the checkout (committed or not)."""
    head = repo.head()
    changed = {p for p in repo.changed_paths(reg_commit, head) if is_code_path(p)} if head != reg_commit else set()
    # `git diff --name-only HEAD`: staged and unstaged changes, one path a line (porcelain status
    # lines lose their leading column when the output is stripped)
    dirty = repo.git("diff", "--name-only", "HEAD", "--", *[d.rstrip("/") for d in CODE_DIRS])
    changed.update(p for p in dirty.splitlines() if p.strip() and is_code_path(p))
    return sorted(changed)


def is_family(reg: Any) -> bool:
    """A registration whose verdict is a family's staged one (every rule but the paired test E2)."""
    return not is_paired(reg.rule)


def arm_names(reg: Any) -> list[str]:
    """The registered arms by their own names (a staged rule's roles name arms so, whatever key
    the registration lists an arm config under)."""
    return [reg.arm_configs[a].name if a in reg.arm_configs else a for a in reg.arms]


def find_predictions(reg: Any, dirs: Sequence[Path], given: str | Path | None) -> Path | None:
    """The frozen prediction file a family rule reads: the one given, else the predictions.json a
    `test run` froze beside the runs (their common folder or its parent). None for a rule that
    reads no prediction; a rule that reads one and finds none is a clear error, not a silent NaN."""
    if given is not None:
        p = Path(given)
        if not p.is_file():
            raise RegisteredAnalysisError(f"--predictions {p}: no such file")
        return p
    if not is_family(reg) or not reg.rule.get("predictions"):
        return None
    if dirs:
        common = Path(os.path.commonpath([str(d) for d in dirs]))
        for cand in (common / "predictions.json", common.parent / "predictions.json"):
            if cand.is_file():
                return cand
    raise RegisteredAnalysisError(
        f"rule {reg.rule.get('name')!r} compares with frozen predictions, and no predictions.json is beside the runs; "
        "pass --predictions FILE (the file frozen before the runs)"
    )


def _judge_here(reg: Any, dirs: list[Path], predictions: Path | None = None) -> tuple[dict[str, Any], list[Any]]:
    if is_paired_form(reg.rule):
        raise RegisteredAnalysisError(
            f"registration {reg.name}: its rule is in the paired form of registrations made before E2 became a "
            "staged spec, which only its own commit's code judges; commit the registration (or judge it at "
            "its commit) so that commit's analysis can judge it"
        )
    refs = {"lambda_ref": reg.references.lambda_ref, "all_miss_token_rate": reg.references.all_miss_token_rate}
    preds = Predictions.load(predictions) if predictions is not None else None
    return analyze_staged(
        dirs,
        reg.rule,
        arms=arm_names(reg),
        rates=reg.multiples(),
        seeds=list(reg.seeds),
        refs_override=refs,
        predictions=preds,
        test_name=reg.test,
        expect_cell=reg.cell.name,
        expect_registration={"sha256": reg.sha256},
    )


def _entry_module(tree: Path) -> str:
    """The `agentload` entry module of a checkout: cli.main since the package DAG, harness.cli before it."""
    return "cli.main" if (tree / "cli" / "main.py").is_file() else "harness.cli"


def _judge_in_worktree(
    repo: Any, commit: str, reg: Any, dirs: list[Path], out: Path, predictions: Path | None = None
) -> dict[str, Any]:
    """Run `analyze` of the registration's commit on the bound runs, in a temporary worktree."""
    tmp = Path(tempfile.mkdtemp(prefix="agentload-judge-"))
    wt = tmp / "tree"
    files = tmp / "frozen"
    files.mkdir()
    (files / "rule.yaml").write_text(yaml.safe_dump(reg.rule, sort_keys=False))
    repo.git("worktree", "add", "--detach", "--quiet", str(wt), commit)
    try:
        env = {**os.environ, "PYTHONPATH": str(wt)}
        cmd = [
            sys.executable,
            "-m",
            _entry_module(wt),
            "analyze",
            *[str(d.resolve()) for d in dirs],
            "--rule",
            str(files / "rule.yaml"),
            "--lambda-ref",
            repr(reg.references.lambda_ref),
            "--all-miss-rate",
            repr(reg.references.all_miss_token_rate),
            "--out",
            str(out.resolve()),
        ]
        if predictions is not None:
            cmd += ["--predictions", str(predictions.resolve())]
        probe = subprocess.run(
            [sys.executable, "-c", "import analysis, sys; sys.stdout.write(analysis.__file__)"],
            cwd=wt,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        module = probe.stdout.strip()
        if probe.returncode != 0 or not Path(module).resolve().is_relative_to(wt.resolve()):
            raise RegisteredAnalysisError(
                f"the registration's commit {commit[:12]} holds no analysis code that can judge (its analysis package "
                f"resolved to {module or probe.stderr.strip()[-300:]!r}, not to the checkout of that commit)"
            )
        test_file = _frozen_test(reg, files)
        proc = subprocess.run(
            [*cmd, "--test", str(test_file)], cwd=wt, env=env, capture_output=True, text=True, timeout=3600
        )
        registered_grid = proc.returncode in (0, 1)
        if not registered_grid:  # that commit's configs cannot read the registered test: judge what the runs name
            proc = subprocess.run(cmd, cwd=wt, env=env, capture_output=True, text=True, timeout=3600)
        else:
            cmd = [*cmd, "--test", str(test_file)]
        vpath = out / "verdict.json"
        if proc.returncode not in (0, 1) or not vpath.is_file():
            raise RegisteredAnalysisError(
                f"the analysis code of commit {commit[:12]} failed (exit {proc.returncode}): "
                f"{proc.stderr.strip()[-2000:]}"
            )
        verdict = json.loads(vpath.read_text())
        if not isinstance(verdict, dict):
            raise RegisteredAnalysisError(f"{vpath}: expected a verdict (a JSON object), got {type(verdict).__name__}")
        verdict["_judge"] = {
            "command": cmd[2:],
            "module": module,
            "registered_grid": registered_grid,
            "stdout_tail": proc.stdout[-4000:],
        }
        return verdict
    finally:
        repo.git("worktree", "remove", "--force", str(wt), check=False)
        repo.git("worktree", "prune", check=False)
        shutil.rmtree(tmp, ignore_errors=True)  # the frozen rule and test files: the verdict holds what they said


def _frozen_test(reg: Any, folder: Path) -> Path:
    """The registered test as config files (cell, workload, protocol, arms, test), so the analysis
    code of another commit learns the registered arms, rates and seeds (a missing run counts)."""

    def dump(name: str, data: dict[str, Any]) -> str:
        p = folder / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(yaml.safe_dump(data, sort_keys=False))
        return str(p)

    cell = dump("cell.yaml", cell_dict(reg.cell))  # as registered: no field that commit may not know
    wl = dump("workload.yaml", reg.workload.model_dump(mode="json"))
    prot = dump("protocol.yaml", reg.protocol.model_dump(mode="json"))
    for a in reg.arms:  # bare arm names resolve to arms/<name>.yaml beside the test file
        dump(f"arms/{a}.yaml", reg.arm_configs[a].model_dump(mode="json"))
    rule = (
        str(reg.rule.get("name") or "e2") if is_family(reg) else "e2"
    )  # the --rule file judges; the name reads in that commit's configs
    test = {
        "kind": "test",
        "name": reg.test,
        "rule": rule,
        "cell": cell,
        "workload": wl,
        "protocol": prot,
        "arms": list(reg.arms),
        "rates": reg.multiples(),
        "seeds": list(reg.seeds),
        "cap": reg.cap,
    }
    if (
        is_family(reg) and reg.path is not None
    ):  # a staged rule counts only runs bound to the registration the test names
        test["registration"] = str(Path(reg.path).resolve())
    return Path(dump("test.yaml", test))


def registered_analysis(
    registration: str | Path,
    runs: Sequence[str | Path],
    out_dir: str | Path | None = None,
    *,
    pool_tolerance_tokens: int = 0,
    force_worktree: bool = False,
    predictions: str | Path | None = None,
    git: bool = True,
) -> dict[str, Any]:
    """The registered verdict of `runs` under `registration`; writes verdict.json and report.md.

    `predictions`: the frozen prediction file a family rule that compares with a model reads
    (default: the predictions.json beside the runs). `git=False` asks no repository (an evidence
    bundle's copy of the registration, inside a clone that never held its commit): the runs' code
    commits are not checked here (the bundle's proofs and `provenance verify` check them) and the
    checkout's code judges in process."""
    reg_path = Path(registration)
    reg = load_registration(reg_path)
    if reg.status == "INCOMPLETE":
        raise RegisteredAnalysisError(
            f"{reg_path}: status INCOMPLETE ({'; '.join(reg.status_reasons)}): it binds no test"
        )
    if abs(reg.references.lambda_miss - reg.references.lambda_ref) > 1e-12 * reg.references.lambda_ref:
        raise RegisteredAnalysisError(
            f"{reg_path}: references.lambda_miss differs from lambda_ref; the analysis judges with lambda_miss = "
            "lambda_ref"
        )
    repo = None
    reg_commit = None
    state = "outside a git repository"
    if not git:
        state = "no repository asked (an evidence bundle's copy)"
    else:
        try:
            repo = Repo.containing(reg_path)
            facts = git_facts(reg_path)
            state = facts.state
            reg_commit = facts.commit if facts.state == "committed" else None
        except GitError:
            pass
    dirs = _expand(runs)
    bindings = [
        bind_run(d, reg, repo, reg_commit, pool_tolerance_tokens=pool_tolerance_tokens, check_code=git) for d in dirs
    ]
    bound = [Path(b.run_dir) for b in bindings if b.bound]
    pred_path = find_predictions(reg, dirs, predictions)
    out = (
        Path(out_dir)
        if out_dir is not None
        else (
            Path(os.path.commonpath([str(d) for d in dirs])) / "registered-analysis"
            if dirs
            else Path("registered-analysis")
        )
    )
    out.mkdir(parents=True, exist_ok=True)

    moved: list[str] = []
    if repo is not None and reg_commit is not None:
        moved = _code_moved(repo, reg_commit)
    # a rule in the paired form is judged by its commit's code even when no code path moved since
    force_worktree = force_worktree or is_paired_form(reg.rule)
    if repo is not None and reg_commit is not None and (moved or force_worktree):
        verdict = _judge_in_worktree(repo, reg_commit, reg, bound, out / "judged", pred_path)
        judge = {
            "commit": reg_commit,
            "mode": "worktree",
            "moved_paths": moved[:20],
            "reason": "the checkout's code differs from the registration's commit, so that commit's analysis judged",
            **verdict.pop("_judge"),
        }
        analyzed = None
    else:
        verdict, analyzed = _judge_here(reg, bound, pred_path)
        head = repo.head() if repo is not None else None
        judge = {
            "commit": head,
            "mode": "in-process",
            "reason": (
                "the checkout's code is the registration's commit's"
                if reg_commit
                else f"the registration is not committed ({state}): the checkout's code judged, and nothing is decisive"
            ),
        }

    preds_block = {"path": str(pred_path), "sha256": sha256_file(pred_path)} if pred_path is not None else None
    kills = evaluate_kill_conditions(
        [k.model_dump() for k in reg.kill_conditions], verdict, reg.multiples(), list(reg.seeds)
    )
    result = {
        **verdict,
        "registered": {
            "registration": {
                "name": reg.name,
                "path": str(reg_path),
                "sha256": reg.sha256,
                "status": reg.status,
                "commit": reg_commit,
                "git_state": state,
            },
            "decisive": reg.status == "FILLED" and reg_commit is not None,
            "judged_by": judge,
            "rule": reg.rule.get("name"),
            "family": is_family(reg),
            "references": reg.references.model_dump(),
            "predictions": preds_block,
            "runs_counted": [b.run_dir for b in bindings if b.bound],
            "runs_excluded": [b.to_json() for b in bindings if not b.bound],
            "kill_conditions": kills,
            "any_kill_triggered": any(k["triggered"] is True for k in kills),
        },
    }
    _write(result, analyzed, out)
    return result


def verdict_markdown(result: dict[str, Any]) -> str:
    """The verdict's own report text (analysis/reports: the E2 tables, or the family's)."""
    plain = {k: v for k, v in result.items() if k != "registered"}
    return str(module_for(_report_view(plain)).markdown(plain))


def _report_view(verdict: dict[str, Any]) -> dict[str, Any]:
    """The verdict as module_for reads it: one judged by an earlier commit in the paired form names
    no report, and is E2's."""
    if is_paired_form(verdict.get("rule_spec") or {}):
        return {**verdict, "rule_spec": {**verdict["rule_spec"], "report": "e2"}}
    return verdict


def _write(result: dict[str, Any], analyzed: Any, out: Path) -> None:
    (out / "registered-verdict.json").write_bytes(
        orjson.dumps(result, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
    )
    (out / "registered-report.md").write_text(registered_markdown(result))
    plain = {k: v for k, v in result.items() if k != "registered"}
    if analyzed is not None:
        write_report(plain, analyzed, out)
    else:
        (out / "report.md").write_text(verdict_markdown(result) + "\n")


def registered_markdown(result: dict[str, Any]) -> str:
    """The registered block as a reader sees it: who judged, which runs counted, the kill conditions."""
    r = result["registered"]
    j = r["judged_by"]
    reg = r["registration"]
    lines = [
        f"## Registered analysis: {reg['name']} ({reg['status']})",
        "",
        f"- registration `{reg['path']}`, SHA-256 `{reg['sha256']}`, commit `{reg['commit'] or 'not committed'}`",
        f"- judged by commit `{j['commit']}` ({j['mode']}): {j['reason']}",
        f"- decisive: {'yes' if r['decisive'] else 'no'}; rule `{r['rule']}`; references λ_ref = "
        f"{r['references']['lambda_ref']}, all-miss = {r['references']['all_miss_token_rate']} tokens/s (from the "
        "registration; no overrides)",
        f"- runs counted: {len(r['runs_counted'])}; left out: {len(r['runs_excluded'])}",
    ]
    if r.get("predictions"):
        lines.insert(-1, f"- frozen predictions `{r['predictions']['path']}`, SHA-256 `{r['predictions']['sha256']}`")
    for x in r["runs_excluded"]:
        lines.append(f"  - `{x['run_dir']}`: {'; '.join(x['reasons'])}")
    lines += [
        "",
        verdict_markdown(result),
        "",
        "### Kill conditions",
        "",
        "| id | condition | triggered |",
        "| --- | --- | --- |",
    ]
    for k in r["kill_conditions"]:
        t = {True: "**TRIGGERED**", False: "no", None: "undetermined"}[k["triggered"]]
        lines.append(f"| {k['id']} | {k['description']} | {t} |")
    return "\n".join(lines) + "\n"


def cmd(args: Any) -> int:
    """`analyze --registration REG RUNS...`; overrides are refused, not ignored."""
    given = [
        o
        for o, v in (
            ("--rule", args.rule),
            ("--lambda-ref", args.lambda_ref),
            ("--all-miss-rate", args.all_miss_rate),
            ("--test", args.test),
        )
        if v
    ]
    if given:
        raise RegisteredAnalysisError(
            f"analyze --registration: {', '.join(given)} cannot be combined with a registration (its rule, references "
            "and test are the registered ones)"
        )
    res = registered_analysis(args.registration, args.runs, args.out, predictions=getattr(args, "predictions", None))
    print(registered_markdown(res))
    return exit_status(res.get("rule_spec") or {}, res)  # as a plain analyze


def collection_verdict(doc: dict[str, Any], base: Path, say: Callable[[str], None]) -> dict[str, Any]:
    """The registered verdict of a collected submission (`jobs collect`): its summary for collection.json."""
    reg_path = Path(doc["registration"]["abs_path"])
    runs = base / RUNS
    if not runs.is_dir() or not any(runs.glob("*/meta.json")):
        return {"ran": False, "reason": f"no run directories under {runs}"}
    try:
        res = registered_analysis(reg_path, [runs], base / "analysis")
    except (RegisteredAnalysisError, RegistrationError, OSError) as exc:
        return {"ran": False, "reason": str(exc)}
    say(registered_markdown(res))
    r = res["registered"]
    return {
        "ran": True,
        "out": str(base / "analysis"),
        "verdict": res.get("verdict"),
        "rates": [{"rate": x["rate"], "verdict": x["verdict"], "seeds": x.get("seeds")} for x in res.get("rates", [])],
        "runs_counted": len(r["runs_counted"]),
        "runs_excluded": r["runs_excluded"],
        "decisive": r["decisive"],
        "judged_by": {k: r["judged_by"].get(k) for k in ("commit", "mode", "reason")},
        "any_kill_triggered": r["any_kill_triggered"],
    }
