"""The trap on a real engine in CI: a registered speed-pinned CPU test, reduced to one seed and two arms.

The registration prereg/registrations/e2-vllm-cpu-tiny-65k-fp32.yaml (protocol e2-cpu-quarter,
118.5 s runs, a burst of 120, the rule e2-cpu-65k-quarter; docs/cpu-trap.md) fixes the rates, plans,
rule and references. This test plays its BURST and NOBURST plans of one seed at one registered rate,
each on a fresh server, in wall time, and judges them by the registered rule with the registered
references: BURST must end TRAPPED and NOBURST RECOVERED. CAPPED, the other seeds and the other rate
are the full test's. AGENTLOAD_CPU_TRAP_REGISTRATION names another registration of a speed-pinned
cell (e.g. e2-vllm-cpu-tiny-65k-quarter.yaml, whose full test ran on an AVX-512 host in bf16).
Why not shorter: `agentload prereg design --max-ci-minutes 6` finds no shorter decisive design for
this cell. With half the time after the burst the trap's backlog has not yet turned upward in the
judged window (the simulator calls the registered seeds' BURST plans at 1.25 INDETERMINATE,
DRAINING, INDETERMINATE, and two real runs of seed 1 ended DRAINING, slopes -0.52 and -0.22);
with three quarters, 15 of 20 fresh seeds trap (docs/cpu-trap.md).

Why this passes on any machine of this kind: the cell pins the engine's *speed*, not its share. At
every server start harness/servers/speedpin.py probes the all-miss token rate and moves the CPU quota
until it reads the cell's target; the registered references then hold in plan time = wall time, and
no host scale is needed. Each run's meta.json records the pin (its probes, the quota kept). The cell
vllm-cpu-tiny-65k-fp32 is made for every host of this kind, AVX2 or AVX-512: it computes in fp32
(bf16 without AVX-512 BF16 is ~3x slower per CPU) and its probe has the workload's mean turn (1,240
tokens), because a 640-token probe pinned a speed at which, in fp32 on an AVX2-only EPYC, a trapped
run served only 0.83-0.89 of the all-miss reference (the rule's band starts at 0.85). A host that
cannot give the speed within the pin's largest quota is refused before the run, saying what it
reached: that refusal is checked, and the arms skip with it (the host is slower than the cell's kind).

Time: per arm a server start (25-35 s), the pin (20-60 s: ~10 s a probe; the second arm's search
starts at the quota the first arm was pinned at, so it usually needs fewer), the smoke checks and
canary (~10 s) and the run's 118.5 s: about 6 minutes for both arms on a 2-core machine. The machine
must be otherwise quiet (the `quiet` marker: scripts/test-phases.sh runs these alone): the pin holds
the speed it measured at the start of the run, not against load that arrives later.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
REG = (
    ROOT
    / "prereg"
    / "registrations"
    / os.environ.get("AGENTLOAD_CPU_TRAP_REGISTRATION", "e2-vllm-cpu-tiny-65k-fp32.yaml")
)
# Which seed and rate: the lower registered rate, seed 1, as for the AVX-512 host's test of the 65k
# cell (there every arm of the full test was in its state; at the higher rate NOBURST's hit over the
# RECOVERED span was 0.805-0.909 against > 0.8). On an AVX2 host this registration's seed 1 at 1.25
# read BURST token ratio 0.96, slope +0.84 against 0.21, NOBURST span hit 0.846; seed 0 at 1.5 and
# seed 2 at 1.25 were in their states too (docs/cpu-trap.md).
SEED = int(os.environ.get("AGENTLOAD_CPU_TRAP_SEED", "1"))
RATE = os.environ.get("AGENTLOAD_CPU_TRAP_RATE")  # a registered multiple; default the lower one

# One rerun: the registered rule passes a rate on 2 of 3 good seeds, so one seed's arm can miss its
# state on a good engine; a second miss in a row fails the test.
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(900),
    pytest.mark.wallclock,
    pytest.mark.quiet,
    pytest.mark.flaky(reruns=1, reruns_delay=5),
]


def _row(arm: str, av: dict[str, Any], meta: dict[str, Any]) -> str:
    s = {k: (float("nan") if v is None else v) for k, v in av["stats"].items()}
    hl = meta.get("host_load") or {}
    ol = meta.get("open_loop") or {}
    pin = meta.get("engine_speed_pin") or {}
    return (
        f"{arm:8} {av['state']:13} hit {s.get('hit', float('nan')):.3f}  "
        f"token_ratio {s.get('token_ratio', float('nan')):.2f}  "
        f"slope {s.get('slope', float('nan')):+.3f} (threshold {s.get('slope_threshold', float('nan')):.3f})  "
        f"hit_last {s.get('hit_last', float('nan')):.2f}  "
        f"outstanding_last {s.get('outstanding_last', float('nan')):.0f}  "
        f"start p99 {1e3 * (ol.get('p99_s') or float('nan')):.0f} ms  "
        f"pin quota {pin.get('quota')} ratio {pin.get('ratio')}  "
        f"load {hl.get('loadavg_drive_start')}->{hl.get('loadavg_drive_end')}"
    )


ARMS = [("burst", "TRAPPED"), ("noburst", "RECOVERED")]
# Arms the pin refused, with the pin's reason: the same host, cell and pin refuse every arm alike, so
# the first refusal is checked and the other arms skip at once, citing it (each arm would otherwise
# boot a fresh server and probe it, ~1.5-2 minutes, to be refused again).
REFUSED: dict[str, str] = {}
# The quota the last arm was pinned at: the next arm's pin starts its search there (same host, same
# cell), which saves it a probe or two; it still probes until it reads the cell's speed.
PINNED: list[float] = []


@pytest.mark.parametrize(("arm", "expected"), ARMS, ids=[a for a, _ in ARMS])
def test_each_arm_ends_in_its_registered_state_at_the_pinned_speed(tmp_path: Path, arm: str, expected: str) -> None:
    from analysis.paired import paired_run
    from analysis.staged_analysis import run_quantities
    from prereg.registration import load_registration
    from runs.arms import execute_run
    from runs.cpu_launch import run_options

    python, model = os.environ.get("AGENTLOAD_VLLM_PYTHON"), os.environ.get("AGENTLOAD_TINY_MODEL")
    if not python or not model:
        pytest.skip(
            "AGENTLOAD_VLLM_PYTHON / AGENTLOAD_TINY_MODEL unset: the real-vLLM tests need the engine venv "
            "(scripts/ci-engine-tests.sh sets it up)"
        )
    if REFUSED:
        first, why = next(iter(REFUSED.items()))
        pytest.skip(f"{arm}: the pin refused this host for the {first} arm already: {why}")
    reg = load_registration(REG)
    assert reg.status == "FILLED", reg.status_reasons
    assert reg.cell.engine_speed_pin is not None  # the speed is the cell's, not the host's
    multiples = reg.multiples()
    rate = min(multiples) if RATE is None else next((m for m in multiples if abs(m - float(RATE)) < 1e-9), None)
    assert rate is not None, f"AGENTLOAD_CPU_TRAP_RATE {RATE} is not a registered multiple {multiples}"
    extra = {"registration": reg.binding(path=REG.relative_to(ROOT).as_posix()), "rule": reg.rule["name"]}
    refs = {"lambda_ref": reg.references.lambda_ref, "all_miss_token_rate": reg.references.all_miss_token_rate}
    res = execute_run(
        reg.bundle(),
        arm,
        rate,
        SEED,
        "vllm",
        tmp_path / arm,
        options=run_options(python, model, progress_every=60.0, pin_start=PINNED[-1] if PINNED else None),
        extra_meta=extra,
    )
    if res.status == "FAILED" and "speed pin refused" in (res.reason or ""):
        # The cell's promise on a host that cannot give its speed within the pin's largest quota (or
        # an AVX2-only CPU under a bf16 cell): refused before the run, after probing, saying what the
        # probes reached; checked here, and the trap is then not this host's to show.
        pin = json.loads((tmp_path / arm / "meta.json").read_text())["engine_speed_pin"]
        assert not pin["pinned"] and pin["steps"], pin  # refused after probing, with what it reached
        REFUSED[arm] = pin["reason"]
        pytest.skip(f"{arm}: the pin refused this host, as the cell says it must: {pin['reason']}")
    assert res.status == "COMPLETED", f"{arm}: {res.status}: {res.reason}"
    meta = json.loads((tmp_path / arm / "meta.json").read_text())
    assert meta["plan"]["sha256"] == reg.plan_sha256(arm, rate, SEED)  # the registered plan was played
    assert meta["registration"]["sha256"] == reg.sha256
    pin = meta["engine_speed_pin"]
    assert abs(pin["ratio"] - 1.0) <= reg.cell.engine_speed_pin.tolerance, pin  # the probe read the cell's speed
    PINNED.append(float(pin["quota"]))
    # the one judging path, the run laid out as the paired verdict lists it
    av = paired_run(reg.rule, run_quantities(tmp_path / arm, reg.rule, refs_override=refs, series=False).run)
    report = (
        f"registration {REG.name} (sha256 {reg.sha256[:12]}), rate {rate} x lambda_ref "
        f"{reg.references.lambda_ref:.4g} = {rate * reg.references.lambda_ref:.3g} sessions/s, seed {SEED}\n"
        + _row(arm.upper(), av, meta)
    )
    print("\n" + report)
    assert av["state"] == expected, f"{arm.upper()} did not end {expected} by the registered rule:\n{report}"
