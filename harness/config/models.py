"""The config models: workload, cell, protocol, arm, test, and a cell's cost parameters.

Every experiment is a composition of these five files. Validation is strict (unknown keys are
errors) because a silently ignored key in a registered test is a protocol deviation nobody sees.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, model_serializer, model_validator

from harness.config.cost import CostModel
from harness.config.files import load_yaml, parse_config, resolve_path
from harness.config.finite import StrictModel
from harness.errors import ConfigError

DEFAULT_TOP_RATE = 2.0  # sessions/s: the paper's base process; a test may register another (TestConfig.top_rate)

# Every model's base is StrictModel (unknown keys refused, frozen, finite floats: harness/config/finite.py),
# named as itself: the pydantic mypy plugin types a model's constructor only for a base it can see
# as a class, and a variable alias of it hid every model's fields from the checker.


# ---------------------------------------------------------------------------------------------
# workload
# ---------------------------------------------------------------------------------------------
class TurnLaw(StrictModel):
    """T = min(Geometric(p = 1/mean) on {1, 2, ...}, cap)."""

    law: Literal["capped_geometric"] = "capped_geometric"
    mean: float = Field(15.0, gt=1.0, description="mean of the uncapped geometric law (1/p)")
    # le=64: draw_session draws a fixed 64 tool-time uniforms per session (workload.MAX_TURN_DRAWS)
    cap: int = Field(60, ge=1, le=64, description="maximum number of turns")


class ToolTimeLaw(StrictModel):
    law: Literal["exponential"] = "exponential"
    mean: float = Field(5.0, gt=0.0, description="mean tool time, seconds")


class TokenRange(StrictModel):
    """Client token ids are drawn uniformly from [low, high)."""

    low: int = Field(4, ge=0)
    high: int = Field(32000, gt=1)

    @model_validator(mode="after")
    def _order(self) -> TokenRange:
        if self.high <= self.low:
            raise ValueError(f"high > low, got low {self.low} and high {self.high}")
        return self


class WorkloadConfig(StrictModel):
    kind: Literal["workload"] = "workload"
    name: str
    description: str = ""
    first_prompt: int = Field(2000, ge=1, description="L0, tokens of the first prompt")
    tool_tokens: int = Field(550, ge=0, description="Delta, new tool-output tokens per follow-up")
    decode_tokens: int = Field(100, ge=1, description="d, output tokens per turn (ignore_eos)")
    turns: TurnLaw = TurnLaw()
    tool_time: ToolTimeLaw = ToolTimeLaw()
    token_ids: TokenRange = TokenRange()

    def prompt_len(self, k: int) -> int:
        """L_k = L0 + (k-1)(Delta + d): the previous prompt, the returned output and the tool output."""
        return self.first_prompt + (k - 1) * (self.tool_tokens + self.decode_tokens)


# ---------------------------------------------------------------------------------------------
# cell
# ---------------------------------------------------------------------------------------------
class CostConfig(StrictModel):
    a: float = Field(9.24e-3, ge=0)
    f0: float = Field(1.26e-3, ge=0)
    b: float = Field(62.6e-6, ge=0)
    c_p: float = Field(2.24e-9, ge=0)
    chunk: int = Field(8192, ge=1)
    c_d: float = Field(0.31e-3, ge=0)
    speed: float = Field(1.0, gt=0)
    token_factor: float = Field(1.0, gt=0)
    c_r: float = Field(0.0, ge=0, description="seconds per request, once, in the iteration that admits it")
    d_r: float = Field(0.0, ge=0, description="seconds a response spends in the server outside the engine's steps")
    cpu_quota: float | None = Field(
        None,
        gt=0,
        description="the CPU quota (cores) these costs hold at; a replay of a run recorded at quota q plays it at "
        "speed x q / cpu_quota (sim2real/quota.py). Absent: the costs are not quota-scaled",
    )

    @model_serializer(mode="wrap")
    def _omit_zero_added_terms(self, handler: Any) -> Any:
        # c_r, d_r and cpu_quota came after cells, registrations and meta.json files were written: left
        # out while unset, so their dumps (and every SHA-256 bound to them) keep their bytes
        data = handler(self)
        if isinstance(data, dict):
            for key in ("c_r", "d_r"):
                if data.get(key) == 0.0:
                    data.pop(key)
            if data.get("cpu_quota") is None:
                data.pop("cpu_quota", None)
        return data

    def model(self) -> CostModel:
        data = self.model_dump()
        data.pop("cpu_quota", None)  # a replay's concern (it sets speed), not the engine model's
        return CostModel(**data)


class SpeedPin(StrictModel):
    """The engine's speed, pinned: at server start a short all-miss probe measures the uncached
    prompt token rate and the CPU quota is searched until the probe reads `token_rate` within
    `tolerance` (harness/servers/speedpin.py). Why: a quota pins the engine's share of a CPU, not its
    speed, and CPUs of one kind differ (a quota'd cell served 1.2x its registered all-miss rate on
    another host of this kind); the registered references hold only where the speed is the cell's."""

    token_rate: float = Field(
        ...,
        gt=0,
        description="uncached prompt tokens/s the probe must read (measured with this probe on the calibrating host)",
    )
    tolerance: float = Field(
        0.04, gt=0, lt=0.5, description="relative: the probe's rate must be within it of token_rate"
    )
    max_cpu_quota: float = Field(
        ...,
        gt=0,
        description="the largest quota (cores) the search may set; a host slower than the target at it is refused",
    )
    min_cpu_quota: float = Field(0.05, gt=0, description="the smallest quota (cores) the search may set")
    max_steps: int = Field(6, ge=1, le=20, description="probes before the search gives up")
    requests: int = Field(24, ge=1, le=4096, description="unique prompts per probe")
    concurrency: int | None = Field(
        None, ge=1, description="probe requests in flight at once (a closed loop); absent = all at once"
    )
    prompt_tokens: int = Field(640, ge=1, description="tokens of each probe prompt (no prefix shared with anything)")
    max_tokens: int = Field(4, ge=1, description="output tokens of each probe request")
    source: str = Field(
        ..., min_length=1, description="where token_rate comes from (the probe runs it was measured on)"
    )

    @model_validator(mode="after")
    def _bounds(self) -> SpeedPin:
        if self.min_cpu_quota > self.max_cpu_quota:
            raise ValueError(f"min_cpu_quota <= max_cpu_quota, got {self.min_cpu_quota} > {self.max_cpu_quota}")
        return self


class EngineId(StrictModel):
    name: Literal["sglang", "vllm"]
    version: str


class CellConfig(StrictModel):
    """Engine + version + GPU + model + KV pool + scheduling settings (paper App. E.2, Table 4)."""

    kind: Literal["cell"] = "cell"
    name: str
    description: str = ""
    engine: EngineId
    model: str
    model_revision: str | None = Field(None, description="model repository revision the weights came from")
    gpu: str
    attention_backend: str | None = Field(None, description="e.g. flashinfer (A100) or fa3 (H200); provenance")
    device: str | None = Field(
        None,
        description="SGLang's --device; absent = the engine's own default (its GPU). 'cpu' also selects "
        "SGLang's CPU engine. vLLM picks its platform from the installed build and takes no flag",
    )
    mem_fraction_static: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="SGLang's --mem-fraction-static; absent = derived by SGLang from free device memory "
        "(right on a GPU). A CPU cell must give it: there the derived value can be negative and the "
        "server does not start",
    )
    engine_cpu_quota: float | None = Field(
        None,
        gt=0,
        description="CPUs the engine's processes may use, enforced by the kernel (harness/servers/cpuquota.py); "
        "a CPU cell sets it so its speed does not move with the host's load. Absent = no quota (a GPU cell)",
    )
    launch_extras: list[str] | None = Field(
        None,
        min_length=1,
        description="engine arguments beyond those the other fields imply that this host kind needs to start the "
        "engine (the CPU vLLM: --kv-cache-memory-bytes, --dtype bfloat16, --enforce-eager), one argument per item: "
        "the adapter appends them to the cell's flags, before any --engine-arg of a command, and meta.json records "
        "them in engine_launch.argv. Never a flag another field sets (the adapter refuses it); the emulator, which "
        "is not the engine, ignores them. Absent = none (a GPU cell)",
    )
    engine_speed_pin: SpeedPin | None = Field(
        None,
        description="pin the engine's speed, not its share: the quota is searched at server start until a probe "
        "reads the cell's token rate (needs engine_cpu_quota, the search's first quota). Absent = the quota alone",
    )
    kv_pool_tokens: int = Field(..., ge=1)
    page_size: int = Field(1, ge=1, description="1 = SGLang token pages; 16/32 = vLLM blocks")
    schedule_policy: Literal["fcfs", "lpm"] = "fcfs"
    lpm_fallback_waiting: int = Field(128, ge=0, description="LPM sorts only while at most this many wait")
    chunked_prefill: int = Field(8192, ge=1)
    max_running: int = Field(256, ge=1)
    prefix_cache: bool = True
    waiting_prefix_refresh: bool = Field(True, description="SGLang: touch waiting prefixes every 32 passes")
    batching: Literal["separate", "mixed"] = Field(
        "separate", description="separate prefill/decode iterations (SGLang) or mixed (vLLM)"
    )
    context_length: int = Field(49152, ge=1)
    cost: CostConfig = CostConfig()
    cost_file: str | None = Field(
        None, description="a cost file (kind: cost) whose parameters fill `cost`; exclusive with `cost`"
    )
    lambda_ref: float | None = Field(None, gt=0, description="E0a turns-based all-miss rate, sessions/s")
    all_miss_token_rate: float | None = Field(None, gt=0, description="E0a uncached prefill tokens/s")

    @model_validator(mode="before")
    @classmethod
    def _cost_file(cls, data: Any, info: ValidationInfo) -> Any:
        # A shared cost file keeps fitted parameters in one place; its values are copied into
        # `cost` so a cell object (and every meta.json that dumps it) is self-contained. A dumped
        # cell carries both: then the inline values must match the file where the file is readable,
        # and stand alone where it is not (reading a run's record on another machine).
        if not isinstance(data, dict) or not isinstance(data.get("cost_file"), str):
            return data
        ref = data["cost_file"]
        try:
            from_file = load_cost_file(ref, (info.context or {}).get("base"))
        except ConfigError as exc:
            if "cost" in data:
                return data
            raise ValueError(f"cost_file {ref!r} to be a readable cost file: {exc}") from None
        if "cost" in data:
            try:
                inline = CostConfig.model_validate(data["cost"])
            except ValidationError:
                return data  # the cost field reports its own errors
            if inline != from_file:
                raise ValueError(
                    f"cost to equal the parameters of cost_file {ref!r} when both are given; "
                    f"got cost {inline.model_dump()} and file {from_file.model_dump()}: give only one"
                )
        return {**data, "cost": from_file.model_dump()}

    @model_validator(mode="after")
    def _consistent(self) -> CellConfig:
        if self.engine.name == "vllm" and self.schedule_policy == "lpm":
            raise ValueError("schedule_policy 'fcfs' on a vLLM cell ('lpm' is SGLang's)")
        for i, arg in enumerate(self.launch_extras or ()):
            if not arg or arg != arg.strip() or "\n" in arg:
                raise ValueError(
                    f"launch_extras[{i}] to be one engine argument without surrounding whitespace, got {arg!r}"
                )
        if self.launch_extras and not self.launch_extras[0].startswith("-"):
            raise ValueError(
                f"launch_extras to start with a flag (--name), got {self.launch_extras[0]!r}: a value needs its flag"
            )
        pin = self.engine_speed_pin
        if pin is not None:
            q = self.engine_cpu_quota
            if q is None:
                raise ValueError(
                    "engine_cpu_quota with engine_speed_pin (the search starts there, inside the quota's cgroup)"
                )
            if not pin.min_cpu_quota <= q <= pin.max_cpu_quota:
                raise ValueError(f"engine_cpu_quota within engine_speed_pin's [min_cpu_quota, max_cpu_quota] = "
                                 f"[{pin.min_cpu_quota:g}, {pin.max_cpu_quota:g}], got {q:g}")  # fmt: skip
        return self


# ---------------------------------------------------------------------------------------------
# protocol
# ---------------------------------------------------------------------------------------------
class BurstSpec(StrictModel):
    time: float = Field(1200.0, ge=0, description="t_b, seconds after run start")
    size: int = Field(200, ge=0)
    width: float = Field(60.0, gt=0, description="burst arrivals are uniform in [time, time+width)")


class WindowSpec(StrictModel):
    start: float = Field(..., ge=0)
    end: float = Field(..., gt=0)

    @model_validator(mode="after")
    def _order(self) -> WindowSpec:
        if self.end <= self.start:
            raise ValueError(f"end > start, got start {self.start} and end {self.end}")
        return self


class ProtocolConfig(StrictModel):
    kind: Literal["protocol"] = "protocol"
    name: str
    description: str = ""
    duration: float = Field(8700.0, gt=0)
    burst: BurstSpec = BurstSpec()
    window: WindowSpec = WindowSpec(start=5700.0, end=8700.0)
    min_window: float = Field(600.0, gt=0, description="shortest evaluation window the rule accepts")
    backlog_bin: float = Field(10.0, gt=0, description="bin width of the backlog series")
    hit_bin: float = Field(100.0, gt=0, description="window of the hit-fraction time series (figures)")
    recovered_span: float = Field(300.0, gt=0, description="RECOVERED is judged over the last span")
    gauge_interval: float = Field(5.0, gt=0, description="engine /metrics scrape period")

    @model_validator(mode="after")
    def _fits(self) -> ProtocolConfig:
        if self.window.end > self.duration:
            raise ValueError(f"window.end <= duration, got window.end {self.window.end} > duration {self.duration}")
        if self.window.end - self.window.start < self.min_window:
            raise ValueError(
                f"a window of at least min_window = {self.min_window} s, got [{self.window.start}, {self.window.end})"
            )
        if self.burst.size > 0 and self.burst.time + self.burst.width > self.duration:
            raise ValueError(
                f"the burst to end before the run, got burst [{self.burst.time}, "
                f"{self.burst.time + self.burst.width}) in a run of {self.duration} s"
            )
        return self


# ---------------------------------------------------------------------------------------------
# arm
# ---------------------------------------------------------------------------------------------
class ToolSlow(StrictModel):
    """Every tool call that starts in [start, end) lasts delta seconds longer.

    Whether a call starts in the window depends on how fast the engine served the turn before it,
    so this is a rule the client applies at run time, not a property of the frozen plan.
    """

    start: float = Field(..., ge=0)
    end: float = Field(..., gt=0)
    delta: float = Field(..., gt=0)

    @model_validator(mode="after")
    def _order(self) -> ToolSlow:
        if self.end <= self.start:
            raise ValueError(f"end > start, got start {self.start} and end {self.end}")
        return self


class Shed(StrictModel):
    """Arrivals in [start, start + duration) are refused (and counted)."""

    start: float = Field(..., ge=0)
    duration: float = Field(..., gt=0)


class Cut(StrictModel):
    """From `start`, base arrivals are thinned to `rate` (a multiple of lambda_ref)."""

    start: float = Field(..., ge=0)
    rate: float = Field(..., gt=0)


class Gate(StrictModel):
    """Client session gate. `fifo_cap`: CAPPED from t=0. `rescue`: engaged at t_on by attrition and pause.

    `cap` may be left out: the registered cap then comes from the test (TestConfig.cap), so one arm
    file serves every cell whose registration fills a different cap.
    """

    kind: Literal["fifo_cap", "rescue"]
    cap: int | None = Field(None, ge=1, description="n_cap; absent = the test's cap")
    t_on: float = Field(0.0, ge=0)
    release_hold: float = Field(300.0, gt=0, description="rescue: both queues empty this long before release")
    release_min_after: float = Field(600.0, ge=0, description="rescue: no release before t_on + this")
    release_tick: float = Field(10.0, gt=0)


class ArmConfig(StrictModel):
    kind: Literal["arm"] = "arm"
    name: str
    description: str = ""
    burst: bool = True
    burst_size: int | None = Field(None, ge=0, description="overrides the protocol's burst size (BASIN)")
    gate: Gate | None = None
    toolslow: ToolSlow | None = None
    shed: Shed | None = None
    cut: Cut | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ArmConfig:
        if not self.burst and self.burst_size not in (None, 0):
            raise ValueError(f"burst_size absent or 0 when burst is false, got burst_size {self.burst_size}")
        return self

    def gate_cap(self, test_cap: int | None = None) -> int | None:
        """The cap the gate enforces: the arm's own, else the test's; None when the arm has no gate."""
        if self.gate is None:
            return None
        cap = self.gate.cap if self.gate.cap is not None else test_cap
        if cap is None:
            raise ConfigError(
                f"arm {self.name!r}: gate.cap is absent and no test cap was given; "
                "expected a cap in the arm file or in the test's 'cap' field"
            )
        return cap


# ---------------------------------------------------------------------------------------------
# test
# ---------------------------------------------------------------------------------------------
class TestReferences(StrictModel):
    """Reference values the test registers in place of the cell's (a cell whose E0a the paper does
    not print: the all-miss token rate is then measured, e.g. by a simulated E0a, and recorded
    here with its source)."""

    lambda_ref: float | None = Field(None, gt=0, description="turns-based all-miss rate, sessions/s")
    all_miss_token_rate: float | None = Field(None, gt=0, description="E0a uncached prefill tokens/s")
    source: str = Field(..., min_length=1, description="where the values come from")


DEFAULT_START_LATENESS_P99 = 0.1  # plan seconds: a test's default open-loop bound (TestConfig.start_lateness_p99)


class TestConfig(StrictModel):
    """Which arms x rates x seeds of a cell, workload and protocol make one registered test."""

    __test__ = False  # not a pytest class

    kind: Literal["test"] = "test"
    name: str
    description: str = ""
    rule: str = Field(
        "e2",
        pattern=r"^[A-Za-z0-9_./-]+$",
        description="rule spec: a name under analysis/rulespecs or configs/rules, or a YAML path",
    )
    rule_params: dict[str, float | int | str] | None = Field(
        None, description="registered overrides of the rule's parameters"
    )
    predictions: str | None = Field(
        None,
        description="frozen prediction file the rule reads; 'freeze' = freeze model F's from the plans before the runs",
    )
    references: TestReferences | None = None
    cell: str
    workload: str
    protocol: str
    arms: list[str] = Field(..., min_length=1)
    rates: list[float] = Field(..., min_length=1)
    seeds: list[int] = Field(..., min_length=1)
    cap: int | None = Field(None, ge=1, description="n_cap for arms whose gate cap is not fixed")
    registration: str | None = None
    top_rate: float = Field(
        DEFAULT_TOP_RATE,
        gt=0,
        description="sessions/s of the CRN base stream every rate is thinned from (part of each plan's "
        "identity); the paper's 2.0 unless the cell is faster. Every rate x lambda_ref must be at most this",
    )
    start_lateness_p99: float = Field(
        DEFAULT_START_LATENESS_P99,
        gt=0,
        description="plan seconds: the largest 99th percentile of the base stream's session-start lateness "
        "(client behind its plan) at which a run still counts as open-loop; a run above it is flagged in its "
        "record and verdict (analysis/openloop.py)",
    )

    @model_validator(mode="after")
    def _positive(self) -> TestConfig:
        for r in self.rates:
            if r <= 0:
                raise ValueError(f"rates to be positive multiples of lambda_ref, got {r}")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"distinct seeds, got {self.seeds}")
        if len(set(self.rates)) != len(self.rates):
            raise ValueError(f"distinct rates, got {self.rates}")
        if len(set(self.arms)) != len(self.arms):
            raise ValueError(f"distinct arms, got {self.arms}")
        return self


def load_cost_file(ref: str | Path, base: Path | None = None) -> CostConfig:
    """Read a cost file: `kind: cost`, optional name/description/fit, and CostConfig's parameters."""
    resolved = resolve_path(ref, base)
    data = load_yaml(resolved)
    if not isinstance(data, dict):
        raise ConfigError(f"{resolved}: expected a mapping at the top level, got {type(data).__name__}")
    if data.get("kind") != "cost":
        raise ConfigError(f"{resolved}: kind: got {data.get('kind')!r}; expected 'cost'")
    # `fit`: how a fitted file was made (data, residuals); a record for readers, not a parameter;
    # `engine` and `cells`: whose costs these are (cost_file_owner), not parameters either
    params = {k: v for k, v in data.items() if k not in COST_FILE_RECORDS}
    return parse_config(params, CostConfig, resolved)


COST_FILE_RECORDS = ("kind", "name", "description", "fit", "engine", "cells")


def cost_file_owner(ref: str | Path, base: Path | None = None) -> tuple[str | None, tuple[str, ...]]:
    """(engine, cells) a cost file says it belongs to: `engine` names the engine whose iterations
    it costs (sglang, vllm), `cells` the cells it was fitted for. Why: costs describe one engine
    on one host; a replay or prediction with another cell's costs says nothing about this one, so
    a replay refuses a file that does not name the run's engine and cell. (None, ()) for a file
    that says neither (made before the fields existed)."""
    resolved = resolve_path(ref, base)
    data = load_yaml(resolved)
    if not isinstance(data, dict):
        raise ConfigError(f"{resolved}: expected a mapping at the top level, got {type(data).__name__}")
    engine = data.get("engine")
    if engine is not None and (not isinstance(engine, str) or not engine):
        raise ConfigError(f"{resolved}: engine: got {engine!r}; expected an engine name (sglang, vllm)")
    cells = data.get("cells")
    if cells is None:
        cells = []
    if not isinstance(cells, list) or not all(isinstance(c, str) and c for c in cells):
        raise ConfigError(f"{resolved}: cells: got {cells!r}; expected a list of cell names")
    return engine, tuple(cells)


def rate_above_top(multiple: float, lambda_ref: float, top_rate: float) -> str | None:
    """Why `multiple` x lambda_ref cannot be thinned from a base stream at `top_rate`, or None.

    One check for the test loader (before any run) and the plan generator (the last line of defence)."""
    lam = multiple * lambda_ref
    if lam <= top_rate:
        return None
    return (
        f"{multiple:g} x lambda_ref {lambda_ref:g} = {lam:.4g} sessions/s exceeds the plan's top rate of "
        f"{top_rate:g} sessions/s; expected at most {top_rate / lambda_ref:.4g} x lambda_ref, or a test "
        f"'top_rate' of at least {lam:.4g} (a different top rate makes different plans, nested only among themselves)"
    )
