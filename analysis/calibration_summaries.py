"""Calibration summaries: the three input files a registration is filled from (paper App. E.3).

Why a file format of its own: the fill must be a pure function of committed inputs, and those
inputs come from two places, our own calibration runs (`agentload calibrate all` writes them) and a
paper's printed tables (written by hand). One small, strict schema serves both, so a reviewer can
compare a transcription with the table it came from line by line, and a registration can carry the
SHA-256 of each file it read. The schemas are documented in docs/registration.md.

Malformed inputs fail here, before any formula runs, with the file, the field, the value and what
was expected: an unknown key, a missing n, a negative rate, a grid that is not strictly increasing,
an E0b grid with a hole, summaries that disagree with their rows.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from harness.config import StrictModel, load_yaml, parse_config
from harness.config.files import dump_yaml
from harness.errors import ConfigError

CAL_FORMAT = "agentload-calibration"
STAGE_FILES = {"stage-c": "stage-c.yaml", "e0a": "e0a.yaml", "e0b": "e0b.yaml"}
_HEX64 = r"^[0-9a-f]{64}$"


class InputError(ConfigError):
    """A calibration summary is malformed or inconsistent (file, field, value, expectation)."""


# every model is a StrictModel (unknown keys refused, frozen, finite floats: harness/config/finite.py), named
# directly: through an alias the pydantic mypy plugin does not see the fields of its subclasses


class RunDirHash(StrictModel):
    path: str
    sha256: str = Field(..., pattern=_HEX64)


class _Summary(StrictModel):
    format: Literal["agentload-calibration"]
    format_version: Literal[1]
    cell: str = Field(..., min_length=1)
    source: str = ""
    run_dirs: list[RunDirHash] = Field(default_factory=list)


# -- Stage C -----------------------------------------------------------------------------------
class StageCProtocol(StrictModel):
    warmup_s: float = Field(900.0, ge=0)
    window_s: float = Field(1800.0, gt=0)


class StageCPoint(StrictModel):
    n: int = Field(..., ge=1, description="closed population")
    seed: int = Field(0, ge=0)
    mu_sessions: float = Field(..., ge=0, description="completed sessions/s over the window")
    mu_turns: float | None = Field(None, ge=0, description="turns/s / E[T]")
    hit_fraction: float | None = Field(None, ge=0, le=1)
    uncached_token_rate: float | None = Field(None, ge=0)


class StageC(_Summary):
    stage: Literal["stage-c"]
    protocol: StageCProtocol = StageCProtocol()
    points: list[StageCPoint] = Field(..., min_length=1)

    def curve(self) -> list[tuple[int, float]]:
        """(n, mean over seeds of mu_sessions), n increasing: the mu(n) the fill uses."""
        by: dict[int, list[float]] = {}
        for p in self.points:
            by.setdefault(p.n, []).append(p.mu_sessions)
        return [(n, math.fsum(v) / len(v)) for n, v in sorted(by.items())]


# -- E0a ---------------------------------------------------------------------------------------
class E0aProtocol(StrictModel):
    warmup_s: float = Field(900.0, ge=0)
    window_s: float = Field(1800.0, gt=0)
    n: int = Field(32, ge=1)


class E0aRow(StrictModel):
    seed: int = Field(..., ge=0)
    n: int = Field(..., ge=1)
    mu_sessions: float | None = Field(None, ge=0)
    mu_turns: float | None = Field(None, gt=0)
    uncached_token_rate: float | None = Field(None, gt=0)


class E0a(_Summary):
    stage: Literal["e0a"]
    protocol: E0aProtocol = E0aProtocol()
    per_seed: list[E0aRow] = Field(default_factory=list)
    check: E0aRow | None = None
    lambda_ref: float | None = Field(None, gt=0)
    lambda_ref_se: float | None = Field(None, ge=0)
    lambda_sessions: float | None = Field(None, gt=0)
    lambda_sessions_se: float | None = Field(None, ge=0)
    all_miss_token_rate: float | None = Field(None, gt=0)
    all_miss_token_rate_se: float | None = Field(None, ge=0)


# -- E0b ---------------------------------------------------------------------------------------
class E0bProtocol(StrictModel):
    duration_s: float = Field(3000.0, gt=0)
    rise_span_s: float = Field(1500.0, gt=0)
    final_max: float = Field(50.0, gt=0, description="stable needs final backlog < final_max")
    rise_max: float = Field(10.0, description="stable needs rise <= rise_max")
    bin_s: float = Field(10.0, gt=0, description="backlog bins of the final value and the fitted rise")
    top_rate: float = Field(2.0, gt=0, description="sessions/s of the base stream the arrivals were thinned from")
    config: str = Field("e0b", min_length=1, description="the protocol config the runs were made under")

    def as_data(self) -> dict[str, Any]:
        """The protocol as written: bins, top rate and config only where not the paper's (as in
        e0b_summary_dict), so a fill trace of the paper's protocol keeps its bytes."""
        data = self.model_dump(mode="json")
        for key, default in _PAPER_E0B.items():
            if data.get(key) == default:
                del data[key]
        return data


_PAPER_E0B: dict[str, Any] = {"bin_s": 10.0, "top_rate": 2.0, "config": "e0b"}


class E0bPoint(StrictModel):
    multiple: float = Field(..., gt=0)
    seed: int = Field(0, ge=0)
    stable: bool
    final_backlog: float | None = Field(None, ge=0)
    rise: float | None = None
    sessions: int | None = Field(None, ge=0)
    realized_multiple: float | None = Field(None, gt=0)


class E0b(_Summary):
    stage: Literal["e0b"]
    protocol: E0bProtocol = E0bProtocol()
    lambda_ref: float | None = Field(None, gt=0, description="the unit of the multiples")
    grid: list[float] = Field(..., min_length=1)
    seeds: list[int] = Field(..., min_length=1)
    points: list[E0bPoint] = Field(..., min_length=1)


_MODELS: dict[str, type[_Summary]] = {"stage-c": StageC, "e0a": E0a, "e0b": E0b}


# ---------------------------------------------------------------------------------------------
# cross-field checks
# ---------------------------------------------------------------------------------------------
def _check_stage_c(s: StageC, src: str) -> None:
    last: dict[int, tuple[int, int]] = {}
    for i, p in enumerate(s.points):
        prev = last.get(p.seed)
        if prev is not None and p.n <= prev[1]:
            raise InputError(
                f"{src}: points[{i}].n: got {p.n} after n = {prev[1]} (points[{prev[0]}]) for seed {p.seed}; "
                "expected n strictly increasing within a seed (one run per n and seed, in grid order)"
            )
        last[p.seed] = (i, p.n)


def _close(a: float, b: float, tol: float) -> bool:
    return abs(a - b) <= tol * max(abs(a), abs(b))


def _mean(vals: list[float]) -> float:
    return math.fsum(vals) / len(vals)


def _se(vals: list[float]) -> float | None:
    if len(vals) < 2:
        return None
    m = _mean(vals)
    var = math.fsum((v - m) ** 2 for v in vals) / (len(vals) - 1)
    return math.sqrt(var / len(vals))


@dataclass(frozen=True)
class E0aValues:
    """E0a's summary values: given in the file, else computed from its rows; `computed` says which."""

    lambda_ref: float
    lambda_ref_se: float | None
    lambda_sessions: float | None
    lambda_sessions_se: float | None
    all_miss_token_rate: float | None
    all_miss_token_rate_se: float | None
    computed: tuple[str, ...]


def e0a_values(e: E0a, src: str, tolerance: float = 0.005) -> E0aValues:
    """Resolve E0a's summaries against its rows (App. E.3: means over seeds, s.e. over seeds)."""
    computed: list[str] = []
    out: dict[str, float | None] = {}
    for key, col in (
        ("lambda_ref", "mu_turns"),
        ("lambda_sessions", "mu_sessions"),
        ("all_miss_token_rate", "uncached_token_rate"),
    ):
        rows = [getattr(r, col) for r in e.per_seed]
        present = [v for v in rows if v is not None]
        if present and len(present) != len(rows):
            i = rows.index(None)
            raise InputError(
                f"{src}: per_seed[{i}].{col}: got null while other seeds give it; expected every seed's value or none"
            )
        given = getattr(e, key)
        if present:
            m = _mean(present)
            if given is not None and not _close(given, m, tolerance):
                raise InputError(
                    f"{src}: {key}: got {given}; expected the mean of per_seed.{col} = {m:.6g} "
                    f"(within a relative {tolerance}; the rows and the summary disagree)"
                )
            if given is None:
                computed.append(key)
            out[key] = given if given is not None else m
            se_given = getattr(e, f"{key}_se")
            se = _se(present)
            if se_given is None and se is not None:
                computed.append(f"{key}_se")
            out[f"{key}_se"] = se_given if se_given is not None else se
        else:
            out[key] = given
            out[f"{key}_se"] = getattr(e, f"{key}_se")
    seeds = [r.seed for r in e.per_seed]
    if len(set(seeds)) != len(seeds):
        raise InputError(f"{src}: per_seed: got seeds {seeds}; expected one row per seed")
    if out["lambda_ref"] is None:
        raise InputError(
            f"{src}: lambda_ref: required field is missing; expected lambda_ref or per_seed rows with mu_turns"
        )
    return E0aValues(
        float(out["lambda_ref"]),
        out["lambda_ref_se"],
        out["lambda_sessions"],
        out["lambda_sessions_se"],
        out["all_miss_token_rate"],
        out["all_miss_token_rate_se"],
        tuple(computed),
    )


def stable_by_rule(final_backlog: float, rise: float, protocol: E0bProtocol) -> bool:
    """The registered E0b stability rule: final backlog below final_max and rise at most rise_max."""
    return final_backlog < protocol.final_max and rise <= protocol.rise_max


def _check_e0b(e: E0b, src: str) -> None:
    for i in range(1, len(e.grid)):
        if e.grid[i] <= e.grid[i - 1]:
            raise InputError(
                f"{src}: grid[{i}]: got {e.grid[i]} after {e.grid[i - 1]}; expected a strictly increasing grid of "
                "multiples"
            )
    for i, g in enumerate(e.grid):
        if not (g > 0):
            raise InputError(f"{src}: grid[{i}]: got {g}; expected a positive multiple of lambda_ref")
    if len(set(e.seeds)) != len(e.seeds):
        raise InputError(f"{src}: seeds: got {e.seeds}; expected distinct seeds")
    seen: dict[tuple[float, int], int] = {}
    for i, p in enumerate(e.points):
        if p.multiple not in e.grid:
            raise InputError(f"{src}: points[{i}].multiple: got {p.multiple}; expected one of the grid {e.grid}")
        if p.seed not in e.seeds:
            raise InputError(f"{src}: points[{i}].seed: got {p.seed}; expected one of seeds {e.seeds}")
        key = (p.multiple, p.seed)
        if key in seen:
            raise InputError(
                f"{src}: points[{i}]: multiple {p.multiple}, seed {p.seed} already given in points[{seen[key]}]; "
                "expected one run per multiple and seed"
            )
        seen[key] = i
        # the flag must agree with whatever the source printed (a source may print one number only)
        want: bool | None = None
        if p.final_backlog is not None and p.rise is not None:
            want = stable_by_rule(p.final_backlog, p.rise, e.protocol)
        elif (p.final_backlog is not None and p.final_backlog >= e.protocol.final_max) or (
            p.rise is not None and p.rise > e.protocol.rise_max
        ):
            want = False
        if want is not None and want != p.stable:
            raise InputError(
                f"{src}: points[{i}].stable: got {p.stable}; expected {want} by the rule final_backlog < "
                f"{e.protocol.final_max} and rise <= {e.protocol.rise_max} (final {p.final_backlog}, rise {p.rise})"
            )
    # a hole: a grid multiple at or below the first unstable one without a run for some seed
    first_unstable = min((p.multiple for p in e.points if not p.stable), default=None)
    for m in e.grid:
        if first_unstable is not None and m > first_unstable:
            break
        for s in e.seeds:
            if (m, s) not in seen:
                upto = (
                    f"up to the first unstable multiple {first_unstable}"
                    if first_unstable is not None
                    else "(no run was unstable, so the whole grid)"
                )
                raise InputError(
                    f"{src}: points: no run at multiple {m} for seed {s}; expected a run for every seed at every "
                    f"grid multiple {upto}: the grid has a hole"
                )


# ---------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------
def load_summary(path: str | Path, stage: str | None = None) -> _Summary:
    """Read one summary file strictly; `stage` (if given) must match the file's."""
    p = Path(path)
    try:
        data = load_yaml(p)
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    if not isinstance(data, dict):
        raise InputError(f"{p}: expected a mapping at the top level, got {type(data).__name__}")
    if data.get("format") != CAL_FORMAT:
        raise InputError(f"{p}: format: got {data.get('format')!r}; expected {CAL_FORMAT!r}")
    got = data.get("stage")
    if got not in _MODELS:
        raise InputError(f"{p}: stage: got {got!r}; expected one of {sorted(_MODELS)}")
    if stage is not None and got != stage:
        raise InputError(f"{p}: stage: got {got!r}; expected {stage!r} for a file named {p.name}")
    try:
        model = parse_config(data, _MODELS[got], p)
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    if isinstance(model, StageC):
        _check_stage_c(model, str(p))
    elif isinstance(model, E0b):
        _check_e0b(model, str(p))
    elif isinstance(model, E0a):
        e0a_values(model, str(p))
    return model


@dataclass(frozen=True)
class CalibrationInputs:
    """The three summaries of one cell with the path and SHA-256 of each file read."""

    folder: Path
    stage_c: StageC
    e0a: E0a
    e0b: E0b
    files: dict[str, tuple[Path, str]]  # stage -> (path, sha256 of the bytes parsed)


def load_inputs(folder: str | Path) -> CalibrationInputs:
    """Read stage-c.yaml, e0a.yaml and e0b.yaml from `folder` (all three are required)."""
    d = Path(folder)
    if not d.is_dir():
        raise InputError(f"{d}: not a folder of calibration summaries (expected {', '.join(STAGE_FILES.values())})")
    models: dict[str, Any] = {}
    files: dict[str, tuple[Path, str]] = {}
    for stage, name in STAGE_FILES.items():
        p = d / name
        if not p.is_file():
            raise InputError(f"{p}: missing; expected the {stage} summary in the inputs folder")
        files[stage] = (p, hashlib.sha256(p.read_bytes()).hexdigest())
        models[stage] = load_summary(p, stage)
    cells = {s: m.cell for s, m in models.items()}
    if len(set(cells.values())) != 1:
        raise InputError(f"{d}: cell: got {cells}; expected the three summaries to be of one cell")
    return CalibrationInputs(d, models["stage-c"], models["e0a"], models["e0b"], files)


def dir_sha256(path: str | Path) -> str:
    """SHA-256 of a run directory: of the lines "<sha256>  <relative path>" over its files, by path."""
    root = Path(path)
    lines = []
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        lines.append(f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.relative_to(root).as_posix()}\n")
    return hashlib.sha256("".join(lines).encode()).hexdigest()


# ---------------------------------------------------------------------------------------------
# writing summaries from measured runs (agentload calibrate all)
# ---------------------------------------------------------------------------------------------
def _run_dir_list(dirs: list[Path], folder: Path) -> list[dict[str, str]]:
    return [
        {"path": Path(os.path.relpath(d.resolve(), folder.resolve())).as_posix(), "sha256": dir_sha256(d)} for d in dirs
    ]


def _head(stage: str, cell: str, source: str) -> dict[str, Any]:
    return {"format": CAL_FORMAT, "format_version": 1, "stage": stage, "cell": cell, "source": source}


def stage_c_summary(
    cell: str, stats: list[Any], *, warmup: float, window: float, run_dirs: list[Path], folder: Path, source: str
) -> dict[str, Any]:
    """A stage-c.yaml mapping from Stage C window statistics (analysis.calibration.WindowStats)."""
    pts = sorted(stats, key=lambda s: (s.seed, s.n))
    return {
        **_head("stage-c", cell, source),
        "protocol": {"warmup_s": float(warmup), "window_s": float(window)},
        "points": [
            {
                "n": s.n,
                "seed": s.seed,
                "mu_sessions": s.mu_sessions,
                "mu_turns": s.mu_turns,
                "hit_fraction": s.hit_fraction,
                "uncached_token_rate": s.uncached_token_rate,
            }
            for s in pts
        ],
        "run_dirs": _run_dir_list(run_dirs, folder),
    }


def e0a_summary_dict(
    cell: str,
    per_seed: list[Any],
    summary: Any,
    *,
    n: int,
    warmup: float,
    window: float,
    run_dirs: list[Path],
    folder: Path,
    source: str,
) -> dict[str, Any]:
    """An e0a.yaml mapping from E0a's per-seed statistics and their summary."""

    def row(s: Any) -> dict[str, Any]:
        return {
            "seed": s.seed,
            "n": s.n,
            "mu_sessions": s.mu_sessions,
            "mu_turns": s.mu_turns,
            "uncached_token_rate": s.uncached_token_rate,
        }

    def fin(x: float | None) -> float | None:
        return None if x is None or not math.isfinite(x) else float(x)

    return {
        **_head("e0a", cell, source),
        "protocol": {"warmup_s": float(warmup), "window_s": float(window), "n": int(n)},
        "per_seed": [row(s) for s in per_seed],
        "check": row(summary.check) if summary.check is not None else None,
        "lambda_ref": summary.lambda_ref,
        "lambda_ref_se": fin(summary.lambda_ref_se),
        "lambda_sessions": fin(summary.lambda_sessions) or None,
        "lambda_sessions_se": fin(summary.lambda_sessions_se),
        "all_miss_token_rate": summary.all_miss_token_rate,
        "all_miss_token_rate_se": fin(summary.all_miss_token_rate_se),
        "run_dirs": _run_dir_list(run_dirs, folder),
    }


def e0b_summary_dict(
    cell: str,
    stats: list[Any],
    *,
    lambda_ref: float,
    grid: list[float],
    seeds: list[int],
    duration: float,
    rise_span: float,
    final_max: float,
    rise_max: float,
    run_dirs: list[Path],
    folder: Path,
    source: str,
    bin_s: float = 10.0,
    top_rate: float = 2.0,
    protocol: str = "e0b",
) -> dict[str, Any]:
    """An e0b.yaml mapping from from-empty statistics (analysis.calibration.E0bStats). The bins, top
    rate and protocol name are written only where they differ from the paper's (10 s, 2.0, e0b), so
    a summary of the paper's protocol keeps the schema's first form."""
    prot = E0bProtocol(
        duration_s=float(duration),
        rise_span_s=float(rise_span),
        final_max=float(final_max),
        rise_max=float(rise_max),
        bin_s=float(bin_s),
        top_rate=float(top_rate),
        config=protocol,
    ).as_data()
    return {
        **_head("e0b", cell, source),
        "protocol": prot,
        "lambda_ref": float(lambda_ref),
        "grid": [float(g) for g in grid],
        "seeds": [int(s) for s in seeds],
        "points": [
            {
                "multiple": s.multiple,
                "seed": s.seed,
                "stable": s.stable,
                "final_backlog": s.final_backlog,
                "rise": s.rise,
                "sessions": s.sessions,
                "realized_multiple": s.realized_multiple,
            }
            for s in stats
        ],
        "run_dirs": _run_dir_list(run_dirs, folder),
    }


def write_summary(data: dict[str, Any], path: str | Path) -> str:
    """Write a summary and read it back through the strict loader; returns the file's SHA-256."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    raw = dump_yaml(data)
    p.write_bytes(raw)
    load_summary(p, data["stage"])
    return hashlib.sha256(raw).hexdigest()
