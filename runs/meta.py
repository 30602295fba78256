"""What the runner writes into a run's meta.json before it drives anything (docs/run-format.md).

Why typed: the block is built here, extended by the engine path (runs/realrun.py: the engine's
launch, start and checks), merged with what a job adds (slurm/job.py: its facts, checks and
binding) and read back by the judge, the review and sim2real's replays; a dataclass names every
field once. `to_json` gives the mapping the recorder stores (sorted keys, pydantic configs dumped as
JSON), with the keys meta.json has always had: `rule_params`, `reference_source` and `plan_check`
only when they apply.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.config import ArmConfig, CellConfig, ProtocolConfig, WorkloadConfig


@dataclass(frozen=True)
class PlanRecord:
    """The frozen plan of the run: its file in the run directory, hash, session counts, top rate."""

    file: str
    sha256: str
    counts: Any
    top_rate: float

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "sha256": self.sha256, "counts": self.counts, "top_rate": self.top_rate}


@dataclass(frozen=True)
class PlanCheck:
    """A registered run's plan against the registration's: `ok` when the hashes agree."""

    registered: str
    generated: str

    @property
    def ok(self) -> bool:
        return self.registered == self.generated

    def to_json(self) -> dict[str, Any]:
        return {"registered": self.registered, "generated": self.generated, "ok": self.ok}


#: the keys of meta.json that say which test a run belongs to, and nothing about how it ran
IDENTITY_KEYS = ("test", "test_file", "registration", "rule", "rule_params", "reference_source")


def identity_block(
    test: str,
    test_file: str | None,
    registration: Mapping[str, Any] | str | None,
    rule: Any,
    rule_params: dict[str, Any] | None = None,
    reference_source: str | None = None,
) -> dict[str, Any]:
    """The IDENTITY_KEYS block of meta.json (`rule_params` and `reference_source` only when they
    apply): RunMeta's head, and what a run shared with another test's (runs/shared_sims.py) gets
    in place of the other test's."""
    out: dict[str, Any] = {
        "test": test,
        "test_file": test_file,
        "registration": dict(registration) if isinstance(registration, Mapping) else registration,
        "rule": rule,
    }
    if rule_params:
        out["rule_params"] = rule_params
    if reference_source is not None:
        out["reference_source"] = reference_source
    return out


@dataclass
class RunMeta:
    """The runner's part of meta.json (the recorder owns status, times and tables)."""

    test: str
    test_file: str | None
    registration: Mapping[str, Any] | str | None  # the binding a job passes, else the test config's name
    rule: Any
    arm: str
    arm_config: ArmConfig
    rate: float
    rate_abs: float  # sessions per second: rate x lambda_ref
    seed: int
    references: dict[str, float]
    cap: int | None
    cell: CellConfig
    workload: WorkloadConfig
    protocol: ProtocolConfig
    plan: PlanRecord
    engine_backend: str
    provenance: dict[str, Any]
    rule_params: dict[str, Any] | None = None
    reference_source: str | None = None
    plan_check: PlanCheck | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  # a caller's own blocks, merged last

    def to_json(self) -> dict[str, Any]:
        out = identity_block(
            self.test, self.test_file, self.registration, self.rule, self.rule_params, self.reference_source
        )
        out.update(
            {
                "arm": self.arm,
                "arm_config": self.arm_config,
                "rate": self.rate,
                "rate_abs": self.rate_abs,
                "seed": self.seed,
                "references": self.references,
                "cap": self.cap,
                "cell": self.cell,
                "workload": self.workload,
                "protocol": self.protocol,
                "plan": self.plan.to_json(),
                "engine_backend": self.engine_backend,
                "provenance": self.provenance,
            }
        )
        out.update(self.extra)
        if self.plan_check is not None:
            out["plan_check"] = self.plan_check.to_json()
        return out
