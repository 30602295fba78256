"""The simulator against the registered real-engine test: every committed run replayed, no engine.

evidence/e2-vllm-cpu-tiny-65k-quarter/test/runs/ holds the 18 runs of the registered paired test on
the real CPU vLLM (docs/cpu-trap.md). `agentload replay` plays each run's own frozen plan, arm and
cell in the simulator with the cost the project's own command fitted to the cell's calibration
(`configs/costs/vllm-cpu-tiny-65k-fit2.yaml`: `agentload calibrate costs` on the cell's Stage C and
E0a summaries and its calibration runs' engine timings; nothing in it was set by hand, and none of
these 18 runs went into it). Why this is a test and not only a report: the engine model is the
source of frozen predictions and of the design step's calls, so a change to it that no longer
reproduces what the real engine did on these plans must fail here, not in the next registered test.

What holds today (docs/sim2real.md section 3), and is checked: the replay classes every run's state
as the real run was classed, by the registered rule (18 of 18); the hit-fraction trajectory is in
band in every run; the backlog trajectory in every BURST and NOBURST run. What does not hold yet,
and is checked as a floor so that it cannot get worse unnoticed: CAPPED's backlog is in band in
3 of 6 runs, because the gate's drain is slower in the simulator than on the engine (at the cap of
32 sessions, 6-40 s into capped-r1.25-s2, the engine served 42-44 turns/s, the replay 34-38; the
issue's target is 5 of 6). The second test closes it out of sample: each seed replayed with a
quota-scaled cost fitted without it (every arm 6 of 6 in both bands).
About 30 s of simulation each.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from cli.main import main

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "evidence" / "e2-vllm-cpu-tiny-65k-quarter" / "test" / "runs"
COST = ROOT / "configs" / "costs" / "vllm-cpu-tiny-65k-fit2.yaml"


def test_the_registered_cpu_runs_replay_in_their_states(tmp_path: Path) -> None:
    out = tmp_path / "replay"
    assert main(["replay", str(RUNS), "--cost", str(COST), "--out", str(out)]) == 0
    reports = json.loads((out / "parity.json").read_text())  # NaN where a run has no value
    assert len(reports) == 18 and all(r["cost_source"] == "file" for r in reports)
    for r in reports:
        name = Path(r["real"]).name
        st = r["states"]
        assert st["rule"] == "e2-cpu-65k-quarter" and st["rule_source"].startswith("registration "), (name, st)
        assert st["real"]["state"] == st["sim"]["state"], (name, st)
        # matched turns: the same cached tokens on both sides
        assert r["turns"]["cached_equal"] >= 0.95, (name, r["turns"])
        assert r["hit_fraction"]["within_band"], (name, r["hit_fraction"])
    in_band = Counter(r["arm"] for r in reports if r["backlog"]["within_band"])
    arms = Counter(r["arm"] for r in reports)
    assert arms == {"burst": 6, "noburst": 6, "capped": 6}
    assert in_band["burst"] == 6 and in_band["noburst"] == 6, in_band
    assert in_band["capped"] >= 3, in_band  # the open gap: the gate's drain (module docstring)
    # the real states themselves are the registered verdict's: BURST trapped, the others recovered
    real = Counter((r["arm"], r["states"]["real"]["state"]) for r in reports)
    assert real == {("burst", "TRAPPED"): 6, ("noburst", "RECOVERED"): 6, ("capped", "RECOVERED"): 6}


CV_COST = ROOT / "configs" / "costs" / "vllm-cpu-tiny-65k-quota-cv-s{seed}.yaml"


def test_each_seed_replays_in_band_with_a_quota_scaled_cost_that_never_saw_it(tmp_path: Path) -> None:
    """Out of sample (docs/sim2real.md, "Quota-scaled costs"): seed k's six runs replayed with the cost
    `agentload calibrate costs --quota-scaled --reference-weight 4` fitted on the summaries and the other
    two seeds' NOBURST and CAPPED runs (benchmarks/replay_cv.py wrote the three files), each run at
    speed x its recorded quota / the cost's. The issue's target: states 18 of 18, hit and backlog bands
    in at least 5 of 6 runs per arm (measured: 6 of 6 in each; CAPPED's closest, capped-r1.50-s1, at
    0.85 of bins)."""
    reports = []
    for seed in (0, 1, 2):
        held = [str(p) for p in sorted(RUNS.iterdir()) if p.name.endswith(f"-s{seed}")]
        out = tmp_path / f"s{seed}"
        cost = Path(str(CV_COST).format(seed=seed))
        assert main(["replay", *held, "--cost", str(cost), "--out", str(out)]) == 0
        for r in json.loads((out / "parity.json").read_text()):
            run = json.loads((Path(r["real"]) / "meta.json").read_text())
            scaling = json.loads((Path(r["sim"]) / "meta.json").read_text())["replay_of"]["quota_scaling"]
            assert scaling["run_quota"] == run["engine_speed_pin"]["quota"], r["real"]
            assert Path(r["real"]).name not in {Path(p).name for p in yaml_sources(cost)}, (cost, r["real"])  # unseen
            reports.append(r)
    assert len(reports) == 18
    assert all(r["states"]["match"] for r in reports), [
        Path(r["real"]).name for r in reports if not r["states"]["match"]
    ]
    for kind in ("hit_fraction", "backlog"):
        in_band = Counter(r["arm"] for r in reports if r[kind]["within_band"])
        assert all(in_band[a] >= 5 for a in ("burst", "noburst", "capped")), (kind, in_band)


def yaml_sources(cost: Path) -> list[str]:
    """The run directories a fitted cost file names as its sources."""
    import yaml

    doc = yaml.safe_load(cost.read_text())
    return [s["path"] for s in doc["fit"]["sources"] if s["role"] == "run"]
