"""What a GPU campaign costs: each registered test's GPU-hours, from its protocol and its allowances.

Why computed: a user plans a campaign against an allocation of GPU-hours, and a number typed into a
guide goes stale the day a protocol or an allowance changes. Every registered test of the project
(prereg/templates/*.yaml on a GPU cell) is costed here with the same formula the jobs are
submitted with (slurm/budget.py): one job per arm x rate x seed, each needing the protocol's
duration on a real engine (time scale 1) plus the registration's start, smoke and teardown
allowances, on one GPU (every GPU cell is one device); and the time limit each job asks for, the
most the scheduler can charge. The calibration that precedes a cell's tests (`calibrate all`:
Stage C, E0a with its saturation check, E0b, each run on a fresh server) is costed the same way.
docs/gpu-campaign.md shows `markdown_table()`, and tests/test_gpu_campaign.py checks that the page's
numbers are this module's.

`python -m slurm.campaign` prints the table.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from harness.config import CONFIG_ROOT, CellConfig, ProtocolConfig, config_ref, load_config
from prereg.registration import Allowances, load_registration
from prereg.template import Template, load_template
from runs.calibration import E0A_CHECK_N, E0A_SEEDS, E0B_GRID, E0B_SEEDS, STAGE_C_NS, WARMUP, WINDOW
from slurm.budget import job_time_limit, run_budget
from slurm.gpus import GPUS_PER_JOB

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "prereg" / "templates"
REGISTRATIONS = ROOT / "prereg" / "registrations"


@dataclass(frozen=True)
class Cost:
    """One registered test (or a cell's calibration) on its cell's GPUs."""

    name: str
    cell: str
    gpu: str
    jobs: int
    run_s: float  # the protocol's duration: seconds of one run on a real engine
    need_s: float  # one job: the run + start + smoke + teardown
    limit_min: int  # the time limit each job asks for (slurm/budget.py)
    gpus_per_job: int = GPUS_PER_JOB
    source: str = ""

    @property
    def gpu_hours(self) -> float:
        return self.jobs * self.need_s * self.gpus_per_job / 3600.0

    @property
    def gpu_hours_limit(self) -> float:
        return self.jobs * self.limit_min * 60.0 * self.gpus_per_job / 3600.0


def job_cost(name: str, cell: CellConfig, durations: list[float], allowances: Allowances, source: str) -> Cost:
    """`durations` holds each job's run; jobs of unequal runs (a calibration) are costed run by run
    and their limit is the longest job's."""
    budgets = [run_budget(d, allowances, cell.engine.name, None) for d in durations]
    need = sum(b.needed_s for b in budgets)
    limit = max(job_time_limit(b).minutes for b in budgets)
    return Cost(
        name,
        cell.name,
        cell.gpu,
        len(durations),
        sum(b.run_s for b in budgets) / len(budgets),
        need / len(budgets),
        limit,
        source=source,
    )


def is_gpu_cell(cell: CellConfig) -> bool:
    """A cell that runs on a GPU (not a CPU cell, not the tutorial's simulated one)."""
    return not (
        cell.gpu.lower().startswith("cpu") or (cell.device or "").lower() == "cpu" or cell.name.startswith("tutorial")
    )


def template_cost(path: Path) -> Cost | None:
    """A registered test's cost from its template (and, where filled, its registration's plans);
    None for a test on a CPU or simulated cell, and for an EXPLORATORY derivation (`parent:`)."""
    t: Template = load_template(path)
    if t.parent is not None:
        return None  # an EXPLORATORY derivation: no registered test
    if t.based_on is not None:
        parent = load_registration(ROOT / t.based_on)
        cell, protocol = parent.cell, parent.protocol
        jobs = len(t.arms or []) * len(t.rates or []) * len(t.seeds or [])
        how = (
            f"{len(t.arms or [])} arms x {len(t.rates or [])} rates x {len(t.seeds or [])} seeds "
            f"on {parent.name}'s calibration"
        )
    else:
        if t.cell is None or t.protocol is None:
            return None
        cell = load_config(config_ref(t.cell, "cells"), CellConfig)
        protocol = load_config(config_ref(t.protocol, "protocols"), ProtocolConfig)
        rates = len(t.fill.fractions)
        jobs = len(t.arms or []) * rates * len(t.seeds or [])
        how = f"{len(t.arms or [])} arms x {rates} rates (placed by the fill) x {len(t.seeds or [])} seeds"
        path = REGISTRATIONS / f"{t.name}.yaml"
        if path.is_file():
            reg = load_registration(path)
            if reg.plans:
                jobs = len(reg.plans)
                how += f"; {jobs} plans in {path.relative_to(ROOT)}"
            else:
                how += f"; {path.relative_to(ROOT)} is {reg.status} (no plans yet)"
    if not is_gpu_cell(cell):
        return None
    return job_cost(t.name, cell, [protocol.duration] * jobs, t.allowances, how)


def calibration_cost(cell_name: str, allowances: Allowances | None = None) -> Cost:
    """`calibrate all` on a cell with its defaults: Stage C (one run per population), E0a (each
    seed, and the saturation check), E0b (each multiple and seed, the e0b protocol's duration)."""
    cell = load_config(config_ref(cell_name, "cells"), CellConfig)
    e0b = load_config(CONFIG_ROOT / "protocols" / "e0b.yaml", ProtocolConfig)
    closed = WARMUP + WINDOW
    runs = (
        [closed] * len(STAGE_C_NS)
        + [closed] * (len(E0A_SEEDS) + (1 if E0A_CHECK_N else 0))
        + [e0b.duration] * (len(E0B_GRID) * len(E0B_SEEDS))
    )
    how = (f"Stage C {len(STAGE_C_NS)} x {closed:.0f} s, E0a {len(E0A_SEEDS)} + check x {closed:.0f} s, "
           f"E0b {len(E0B_GRID) * len(E0B_SEEDS)} x {e0b.duration:.0f} s")  # fmt: skip
    return job_cost("calibrate all", cell, runs, allowances or Allowances(), how)


def campaign_costs(templates: Path = TEMPLATES) -> list[Cost]:
    """Every registered test on a GPU cell, by template name."""
    out = [c for p in sorted(templates.glob("*.yaml")) if (c := template_cost(p)) is not None]
    return out


def _h(x: float) -> str:
    return f"{x:,.1f}"


def markdown_table(costs: list[Cost] | None = None, calibrations: list[str] | None = None) -> str:
    """The page's table: per test its jobs, one job's need and limit, and the GPU-hours."""
    costs = campaign_costs() if costs is None else costs
    cells = calibrations if calibrations is not None else sorted({c.cell for c in costs})
    rows = [calibration_cost(c) for c in cells] + costs
    lines = [
        "| test | cell | GPU | jobs | run per job | need per job | limit per job | GPU-hours (need) | GPU-hours (at "
        "the limit) |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for c in rows:
        lines.append(
            f"| {c.name} | {c.cell} | {c.gpu} | {c.jobs} | {c.run_s:,.0f} s | {c.need_s:,.0f} s | {c.limit_min} min | "
            f"{_h(c.gpu_hours)} | {_h(c.gpu_hours_limit)} |"
        )
    tests = [c for c in rows if c.name != "calibrate all"]
    lines.append(
        f"| **all registered tests** | | | {sum(c.jobs for c in tests)} | | | | "
        f"**{_h(sum(c.gpu_hours for c in tests))}** | "
        f"**{_h(sum(c.gpu_hours_limit for c in tests))}** |"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    print(markdown_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
