"""Frozen prediction files: what a rule compares a run with, read as input, never computed here.

A prediction file (JSON) holds model values frozen before the runs they predict (the paper's
model F per-seed slopes for CUT, wave times and slopes for MIRROR, asymptotic z, gamma, alpha, D
and tilted mix for the trap-state scores). It is produced by `agentload theory predict` (or by
hand, from a paper's table) and identified by the SHA-256 of its bytes, which the verdict records.

    {"format": "agentload-predictions", "format_version": 1, "name": ..., "model": ...,
     "rates": [{"rate": 1.65, "values": {"z": ..., "gamma": ..., "D": ...}}],
     "runs":  [{"arm": "cut-a115", "rate": 1.65, "seed": 0, "plan_sha256": "...",
                "values": {"slope": 0.0039, ...}, "trajectory": {"t": [...], "backlog": [...]}}]}

A run reads `pred.<name>` for its rate's values and its own entry's (matched by arm, rate and
seed, the arm case-insensitively or `*` for any arm). An entry frozen for another plan (its
`plan_sha256` differs from the run's) is not a prediction for that run: its values are withheld
and the run's reason says so.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from harness.config import check_finite
from harness.errors import RuleError

FORMAT = "agentload-predictions"


@dataclass
class Predictions:
    data: dict[str, Any]
    path: str | None = None
    sha256: str | None = None

    @classmethod
    def load(cls, path: Path | str) -> Predictions:
        p = Path(path)
        try:
            raw = p.read_bytes()
        except OSError as exc:
            raise RuleError(f"prediction file {p}: cannot read: {exc.strerror}") from None
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise RuleError(f"prediction file {p}: not valid JSON ({exc})") from None
        return cls.from_dict(data, str(p), hashlib.sha256(raw).hexdigest())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], path: str | None = None, sha256: str | None = None) -> Predictions:
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            raise RuleError(
                f"prediction file {path or '<memory>'}: format: expected {FORMAT!r}, got "
                f"{data.get('format') if isinstance(data, Mapping) else data!r}"
            )
        # a strict JSON reader refuses NaN and Infinity already; a mapping built in memory is checked here
        check_finite(data, f"prediction file {path or '<memory>'}", RuleError)
        for i, e in enumerate(data.get("runs", [])):
            for k in ("arm", "rate", "seed", "values"):
                if k not in e:
                    raise RuleError(f"prediction file {path or '<memory>'}: runs[{i}]: missing {k!r}")
        return cls(dict(data), path, sha256)

    def rate_values(self, rate: float) -> dict[str, Any]:
        for r in self.data.get("rates", []):
            if abs(float(r["rate"]) - rate) < 1e-9:
                return dict(r["values"])
        return {}

    def entry(self, arm: str, rate: float, seed: int) -> Mapping[str, Any] | None:
        runs: list[Mapping[str, Any]] = self.data.get("runs", [])
        for e in runs:
            if (
                (e["arm"] == "*" or e["arm"].lower() == arm.lower())
                and abs(float(e["rate"]) - rate) < 1e-9
                and int(e["seed"]) == seed
            ):
                return e
        return None

    def for_run(self, arm: str, rate: float, seed: int, plan_sha256: str | None) -> tuple[dict[str, Any], str]:
        """(`pred.*` quantities, note) for one run."""
        out = {f"pred.{k}": v for k, v in self.rate_values(rate).items()}
        e = self.entry(arm, rate, seed)
        if e is None:
            return out, ""
        want = e.get("plan_sha256")
        if want and plan_sha256 and want != plan_sha256:
            return (
                out,
                f"prediction for {arm} {rate:g} seed {seed} was frozen for plan {want[:12]}, not this run's "
                f"{plan_sha256[:12]}: withheld",
            )
        out.update({f"pred.{k}": v for k, v in e["values"].items() if not isinstance(v, (list, dict))})
        return out, ""

    def trajectory(self, arm: str, rate: float, seed: int) -> dict[str, list[float]] | None:
        e = self.entry(arm, rate, seed)
        return dict(e["trajectory"]) if e and e.get("trajectory") else None

    def describe(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "sha256": self.sha256,
            "name": self.data.get("name"),
            "model": self.data.get("model"),
            "frozen_at": self.data.get("frozen_at"),
        }
