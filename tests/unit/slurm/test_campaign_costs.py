"""docs/gpu-campaign.md's numbers are the code's (slurm/campaign.py, slurm/budget.py): the cost table,
the E2 example, and the calibration's --time; and the costing itself, from a template's protocol and
allowances. The page's runnable commands are run as written by tests/integration/test_gpu_campaign.py."""

from __future__ import annotations

import re

from support.paths import REPO

from prereg.registration import Allowances
from slurm.budget import job_time_limit, run_budget
from slurm.campaign import TEMPLATES, calibration_cost, campaign_costs, markdown_table, template_cost

ROOT = REPO
DOC = ROOT / "docs" / "gpu-campaign.md"


def _table(text: str) -> str:
    m = re.search(r"<!-- cost-table: python -m slurm.campaign -->\n(.*?)\n<!-- /cost-table -->", text, re.S)
    assert m, f"{DOC}: no cost table between its markers"
    return m.group(1)


def test_the_page_shows_the_computed_cost_table() -> None:
    assert _table(DOC.read_text(encoding="utf-8")) == markdown_table(), (
        "regenerate the table with `python -m slurm.campaign`"
    )


def test_the_e2_example_and_the_calibration_limit_are_the_code_s() -> None:
    text = DOC.read_text(encoding="utf-8")
    e2 = template_cost(TEMPLATES / "e2-sglang-a100-300k.yaml")
    assert e2 is not None
    a = Allowances()
    sentence = (
        f"E2: {e2.jobs} jobs x ({e2.run_s:,.0f} s + {a.start_s:.0f} s start + {a.smoke_s:.0f} s smoke "
        f"+ {a.teardown_s:.0f} s teardown) "
        f"= {e2.gpu_hours:.1f} GPU-hours, each job asking for {e2.limit_min} min"
    )
    assert sentence in text, sentence
    cal = calibration_cost("sglang-a100-300k")
    assert f"--time {cal.limit_min} " in text and f"`--time {cal.limit_min}` is the longest" in text


def test_a_test_s_cost_is_its_jobs_times_the_budget() -> None:
    e2 = template_cost(TEMPLATES / "e2-sglang-a100-300k.yaml")
    assert e2 is not None and e2.jobs == 18 and e2.run_s == 8700.0
    budget = run_budget(8700.0, Allowances(), "sglang", None)
    assert e2.need_s == budget.needed_s == 8700 + 900 + 120 + 60
    assert e2.limit_min == job_time_limit(budget).minutes and e2.gpu_hours == 18 * 9780 / 3600
    assert e2.gpu_hours_limit == 18 * e2.limit_min / 60
    names = {c.name for c in campaign_costs()}
    assert {"e2-sglang-a100-300k", "e2-vllm-a100-300k", "basin-1", "toolslow"} <= names
    assert not names & {
        "tutorial",
        "e2-vllm-cpu-tiny-131k",
        "grid-sglang-fcfs-r0",
    }  # no CPU, simulated or exploratory test
    cal = calibration_cost("sglang-a100-300k")
    assert (
        cal.jobs == 9 + 4 + 6
        and cal.limit_min == job_time_limit(run_budget(3000.0, Allowances(), "sglang", None)).minutes
    )
