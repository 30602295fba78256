"""The registration file: a typed model, a strict loader and a deterministic writer.

Why this module exists: a registration is the one file that fixes, before any job runs, everything a
registered test's jobs and its verdict may use: the cell, workload and protocol, the arms, rates,
seeds and cap, the reference values from calibration, the rule spec with its thresholds, the kill
conditions, and the SHA-256 of every calibration input and frozen plan it binds. Its identity is the
SHA-256 of its bytes, so the loader never normalises the file: what it hashes is what it parsed.

Every consumer (the job script, the submission command, the registered analysis, prediction files)
goes through `load_registration`, so a malformed file fails the same way everywhere, with the file,
the field path, the value and what was expected (`RegistrationError`, a `ConfigError`).

The format is documented in docs/registration.md.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, PrivateAttr

from analysis.rules import is_paired_form, validate_rule
from harness.config import (
    DEFAULT_START_LATENESS_P99,
    DEFAULT_TOP_RATE,
    ArmConfig,
    CellConfig,
    ProtocolConfig,
    StrictModel,
    TestBundle,
    TestConfig,
    WorkloadConfig,
    load_yaml,
    parse_config,
    rate_above_top,
)
from harness.config.files import dump_yaml, safe_load
from harness.errors import ConfigError, RuleError

FORMAT = "agentload-registration"
FORMAT_VERSION = 1
STATUSES = ("FILLED", "EXPLORATORY", "INCOMPLETE")
_HEX64 = r"^[0-9a-f]{64}$"
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class RegistrationError(ConfigError):
    """A registration (or a calibration input, or a template) is malformed or refused; the message
    names the file, the field, the value and what was expected."""


_Strict = StrictModel  # unknown keys refused, frozen, finite floats (harness/config/finite.py)


class References(_Strict):
    """The reference values the rule is judged with (paper App. E.3, E.5).

    lambda_ref: E0a's turns-based all-miss session rate, the unit of every rate multiple.
    lambda_miss: the value the rule uses as lambda_miss; the paper's rule takes the cell's lambda_ref.
    lambda_miss_sessions: E0a's completed-session estimate, recorded beside it (descriptive).
    all_miss_token_rate: E0a's uncached prefill tokens/s, the TRAPPED token reference.
    """

    lambda_ref: float = Field(..., gt=0)
    lambda_ref_se: float | None = Field(None, ge=0)
    lambda_miss: float = Field(..., gt=0)
    lambda_miss_sessions: float | None = Field(None, gt=0)
    all_miss_token_rate: float | None = Field(..., gt=0, description="null only in an INCOMPLETE registration")
    all_miss_token_rate_se: float | None = Field(None, ge=0)


class Rate(_Strict):
    multiple: float = Field(..., gt=0, description="multiple of lambda_ref")
    sessions_per_s: float = Field(..., gt=0)


class InputFile(_Strict):
    path: str = Field(..., min_length=1, description="repository-relative path of the committed input copy")
    sha256: str = Field(..., pattern=_HEX64)
    role: Literal["stage-c", "e0a", "e0b", "parent", "design", "other"] = "other"


class PlanHash(_Strict):
    arm: str
    rate: float = Field(..., gt=0)
    seed: int = Field(..., ge=0)
    sha256: str = Field(..., pattern=_HEX64)


class Allowances(_Strict):
    """Seconds a job needs beyond the run itself (rules digest, Decision 16)."""

    start_s: float = Field(900.0, ge=0)
    smoke_s: float = Field(120.0, ge=0)
    teardown_s: float = Field(60.0, ge=0)


class Parent(_Strict):
    name: str
    path: str
    sha256: str = Field(..., pattern=_HEX64)


class KillCondition(_Strict):
    """A registered condition that, if triggered after the runs, withdraws the test's claim.

    kind decides how prereg.kill evaluates it; params hold its thresholds as data; `frozen` holds a
    value fixed at fill time (the window-noise condition is decided by calibration alone)."""

    id: str
    kind: Literal["arm_fails_fraction", "capped_not_recovered", "window_noise"]
    description: str
    params: dict[str, Any] = Field(default_factory=dict)
    frozen: dict[str, Any] | None = None


class FillWarning(_Strict):
    id: str
    text: str
    value: float | None = None


class Registration(_Strict):
    """A parsed registration. `sha256`, `path` and `raw` are the file's identity, not fields."""

    format: Literal["agentload-registration"]
    format_version: Literal[1]
    name: str = Field(..., pattern=_NAME)
    description: str = ""
    status: Literal["FILLED", "EXPLORATORY", "INCOMPLETE"]
    status_reasons: list[str] = Field(default_factory=list)
    parent: Parent | None = None
    test: str = Field(..., min_length=1)
    cell: CellConfig
    workload: WorkloadConfig
    protocol: ProtocolConfig
    arms: list[str]
    arm_configs: dict[str, ArmConfig] = Field(default_factory=dict)
    rates: list[Rate]
    seeds: list[int]
    cap: int | None = Field(None, ge=1)
    top_rate: float = Field(
        DEFAULT_TOP_RATE,
        gt=0,
        description="sessions/s of the CRN base stream the plans are thinned from (the test's top_rate)",
    )
    start_lateness_p99: float = Field(
        DEFAULT_START_LATENESS_P99,
        gt=0,
        description="plan seconds: the open-loop bound on the p99 of session-start lateness",
    )
    references: References
    rule: dict[str, Any]
    kill_conditions: list[KillCondition] = Field(default_factory=list)
    warnings: list[FillWarning] = Field(default_factory=list)
    allowances: Allowances = Allowances()
    inputs: list[InputFile] = Field(default_factory=list)
    plans: list[PlanHash] = Field(default_factory=list)
    fill: dict[str, Any] = Field(default_factory=dict)

    _path: Path | None = PrivateAttr(None)
    _sha256: str | None = PrivateAttr(None)
    _raw: bytes | None = PrivateAttr(None)

    # -- identity ------------------------------------------------------------------------------
    @property
    def path(self) -> Path | None:
        return self._path

    @property
    def sha256(self) -> str:
        """SHA-256 of the file's bytes (of the canonical dump when the object was built in memory)."""
        return self._sha256 or hashlib.sha256(dump_registration(self)).hexdigest()

    @property
    def raw(self) -> bytes:
        return self._raw if self._raw is not None else dump_registration(self)

    # -- conveniences for jobs and the verdict -------------------------------------------------
    @property
    def decisive(self) -> bool:
        """Only a FILLED registration can make a test's verdict decisive (paper Table 14)."""
        return self.status == "FILLED"

    def multiples(self) -> list[float]:
        return [r.multiple for r in self.rates]

    def plan_sha256(self, arm: str, rate: float, seed: int) -> str | None:
        """The registered SHA-256 of the frozen plan of (arm, rate, seed), or None if not bound."""
        for p in self.plans:
            if p.arm.lower() == arm.lower() and math.isclose(p.rate, rate, rel_tol=0, abs_tol=1e-9) and p.seed == seed:
                return p.sha256
        return None

    def bundle(self) -> TestBundle:
        """The test as a harness.config.TestBundle built from the registration alone (its cell,
        workload, protocol and arm configs), so a job plays exactly the registered plans."""
        missing = [a for a in self.arms if a not in self.arm_configs]
        if missing:
            raise RegistrationError(
                f"{self._path}: arm_configs: no config for arm(s) {missing}; expected one per registered arm"
            )
        # the registration's own rule dict is authoritative; the test names it by its name
        test = TestConfig(
            name=self.test,
            description=self.description,
            rule=str(self.rule.get("name", "e2")),
            cell=self.cell.name,
            workload=self.workload.name,
            protocol=self.protocol.name,
            arms=list(self.arms),
            rates=self.multiples(),
            seeds=list(self.seeds),
            cap=self.cap,
            registration=str(self._path) if self._path else self.name,
            top_rate=self.top_rate,
            start_lateness_p99=self.start_lateness_p99,
        )
        return TestBundle(
            test=test,
            cell=self.cell,
            workload=self.workload,
            protocol=self.protocol,
            arms=dict(self.arm_configs),
            path=self._path,
        )

    def bound_input(self, role: str) -> tuple[Path, str] | None:
        """The input file bound in `role` (e.g. "e0a") as (its path in this checkout, its repository
        path as the registration names it), or None when no input has that role. A method, not a
        helper of one package: the run code (runs/, which may not import prereg's modules) and the
        prediction code both find the registered E0a through the registration they are given."""
        inp = next((i for i in self.inputs if i.role == role), None)
        if inp is None:
            return None
        root = self._path.parents[2] if self._path is not None else Path.cwd()  # prereg/registrations/X.yaml
        return root / inp.path, inp.path

    def binding(self, path: str | None = None, commit: str | None = None) -> dict[str, Any]:
        """The meta.json "registration" block of a run bound to this registration."""
        return {
            "name": self.name,
            "path": path if path is not None else (self._path.as_posix() if self._path else None),
            "sha256": self.sha256,
            "commit": commit,
        }

    # -- consistency ---------------------------------------------------------------------------
    def problems(self) -> list[str]:
        """Cross-field inconsistencies, each as 'field: got ...; expected ...'."""
        problems: list[str] = []
        if self.status == "EXPLORATORY" and self.parent is None:
            problems.append("parent: an EXPLORATORY registration must name the FILLED parent it derives from")
        if self.status != "EXPLORATORY" and self.parent is not None:
            problems.append(f"parent: only an EXPLORATORY registration has a parent; status is {self.status}")
        if self.status == "INCOMPLETE" and not self.status_reasons:
            problems.append("status_reasons: an INCOMPLETE registration must say why (expected at least one reason)")
        if len({a.lower() for a in self.arms}) != len(self.arms):
            problems.append(f"arms: expected distinct arm names, got {self.arms}")
        if len(set(self.seeds)) != len(self.seeds):
            problems.append(f"seeds: expected distinct seeds, got {self.seeds}")
        mults = self.multiples()
        if len(set(mults)) != len(mults):
            problems.append(f"rates: expected distinct multiples, got {mults}")
        for i, r in enumerate(self.rates):
            if self.status != "INCOMPLETE":  # an INCOMPLETE one binds no plan, and may say why in its reasons
                above = rate_above_top(r.multiple, self.references.lambda_ref, self.top_rate)
                if above:
                    problems.append(f"rates[{i}].multiple: {above} (top_rate {self.top_rate:g})")
            want = r.multiple * self.references.lambda_ref
            if not math.isclose(r.sessions_per_s, want, rel_tol=1e-9, abs_tol=1e-12):
                problems.append(
                    f"rates[{i}].sessions_per_s: got {r.sessions_per_s}; expected multiple x lambda_ref = "
                    f"{r.multiple} x {self.references.lambda_ref} = {want!r}"
                )
        if self.status in ("FILLED", "EXPLORATORY"):
            if self.references.all_miss_token_rate is None:
                problems.append(
                    f"references.all_miss_token_rate: got null; expected E0a's all-miss token rate in a {self.status} "
                    "registration (the TRAPPED rule needs it)"
                )
            if not self.rates:
                problems.append(f"rates: a {self.status} registration needs at least one rate")
            if not self.seeds:
                problems.append(f"seeds: a {self.status} registration needs at least one seed")
            for i, r in enumerate(self.rates):
                if r.sessions_per_s > self.top_rate:
                    problems.append(
                        f"rates[{i}]: {r.sessions_per_s:.4g} sessions/s exceeds top_rate {self.top_rate}; expected at "
                        "most the plans' base rate"
                    )
            want_plans = {(a.lower(), round(m, 9), s) for a in self.arms for m in mults for s in self.seeds}
            have = [(p.arm.lower(), round(p.rate, 9), p.seed) for p in self.plans]
            if len(set(have)) != len(have):
                problems.append("plans: an (arm, rate, seed) is listed twice")
            missing = sorted(want_plans - set(have))
            extra = sorted(set(have) - want_plans)
            if missing:
                problems.append(
                    f"plans: no plan hash for (arm, rate, seed) {missing[:4]}{' ...' if len(missing) > 4 else ''}; "
                    "expected one per arm x rate x seed"
                )
            if extra:
                problems.append(
                    f"plans: hashes for (arm, rate, seed) {extra[:4]} that are not registered arms x rates x seeds"
                )
        for arm in self.arm_configs:
            if arm.lower() not in {a.lower() for a in self.arms}:
                problems.append(f"arm_configs.{arm}: not one of the registered arms {self.arms}")
        for a in self.arms:
            cfg = self.arm_configs.get(a)
            if cfg is not None and cfg.gate is not None and cfg.gate.cap is None and self.cap is None:
                problems.append(f"cap: arm {a} has a gate without its own cap, so the registration needs a cap")
        try:
            # A rule frozen in the paired form (registrations made before E2 became a staged spec) is
            # read, not judged, here: only its commit's code judges it (review/registered.py).
            if not is_paired_form(self.rule):
                validate_rule(self.rule)
        except (RuleError, KeyError, TypeError) as exc:
            problems.append(f"rule: expected a valid rule spec (analysis.rules): {exc}")
        return problems


def registration_document(data: bytes) -> Any:
    """The YAML document of a registration's bytes, as yaml.safe_load reads it (the same document,
    or the same yaml.YAMLError), through libyaml where PyYAML has it: a reader that takes a
    registration from its bytes (review/records.py, on every `status`) then pays about a tenth of the
    Python parser's time for a file of several hundred lines."""
    return safe_load(data)


def registration_from_data(data: Any, source: Path | str = "<memory>", raw: bytes | None = None) -> Registration:
    """Validate a loaded mapping as a registration; errors are RegistrationError with the file name."""
    if isinstance(data, dict):
        fmt = data.get("format")
        if fmt != FORMAT:
            raise RegistrationError(
                f"{source}: format: got {fmt!r}; expected {FORMAT!r} (is this a registration file?)"
            )
        ver = data.get("format_version")
        if ver != FORMAT_VERSION:
            raise RegistrationError(
                f"{source}: format_version: got {ver!r}; expected {FORMAT_VERSION} (this code reads version "
                f"{FORMAT_VERSION})"
            )
    try:
        reg = parse_config(data, Registration, source)
    except ConfigError as exc:
        raise RegistrationError(str(exc)) from None
    problems = reg.problems()
    if problems:
        lines = [f"{source}: inconsistent registration ({len(problems)} problem(s))"] + [f"  {p}" for p in problems]
        raise RegistrationError("\n".join(lines))
    if raw is not None:
        reg._raw = raw
        reg._sha256 = hashlib.sha256(raw).hexdigest()
    if str(source) != "<memory>":
        reg._path = Path(source)
    return reg


def load_registration(path: str | Path, expect_sha256: str | None = None) -> Registration:
    """Read, hash and validate a registration file.

    The SHA-256 is of the bytes on disk, read once, so the hash and the parsed content are of the
    same bytes. With `expect_sha256`, a different hash is refused before anything else is trusted.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise RegistrationError(f"{p}: cannot read the registration: {exc.strerror or exc}") from None
    sha = hashlib.sha256(raw).hexdigest()
    if expect_sha256 is not None and sha != expect_sha256.lower():
        raise RegistrationError(
            f"{p}: SHA-256 is {sha}; expected {expect_sha256.lower()} (the file is not the registered one)"
        )
    data = load_yaml(p)
    return registration_from_data(data, p, raw)


# ---------------------------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------------------------


# Cell fields added after registrations were first written, that only CPU cells set (SGLang's CPU
# launch settings, the engine's CPU quota, a host kind's launch extras, its speed pin): left out of the file while
# unset, so a registration written before they existed keeps its bytes, its SHA-256 and every run bound to it. Reading
# the file back gives the same object (the fields default to None).
_CELL_OMITTED_WHEN_UNSET = ("device", "mem_fraction_static", "engine_cpu_quota", "launch_extras", "engine_speed_pin")


def cell_dict(cell: CellConfig) -> dict[str, Any]:
    """A registered cell as plain data, as the registration writes it: the fields added since the
    first registrations left out while unset, so the configs of an older commit read it too."""
    data = cell.model_dump(mode="json")
    for key in _CELL_OMITTED_WHEN_UNSET:
        if data.get(key) is None:
            data.pop(key, None)
    return data


def registration_dict(reg: Registration) -> dict[str, Any]:
    """The registration as plain data, in the documented key order. Every other field is written,
    defaults included, so a reviewer reads the whole test from the file."""
    data = reg.model_dump(mode="json")
    data["cell"] = cell_dict(reg.cell)
    return data


def dump_registration(reg: Registration) -> bytes:
    return dump_yaml(registration_dict(reg))


def write_registration(reg: Registration | dict[str, Any], path: str | Path) -> str:
    """Validate, write and return the SHA-256 of the bytes written. The same registration always
    gives the same bytes."""
    if isinstance(reg, dict):
        reg = registration_from_data(reg)
    data = dump_registration(reg)
    # reading back must give the same object: a writer that loses information would freeze a lie
    back = registration_from_data(yaml.safe_load(data.decode("utf-8")), "<written>")
    if registration_dict(back) != registration_dict(reg):
        raise RegistrationError(
            f"{path}: the written registration does not read back identically (a value does not round-trip)"
        )
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
