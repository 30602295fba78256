"""Pieces of the HTML report and of `status` on small synthetic records: the Markdown renderer, a
staged family's verdict, a verdict whose run directories are gone, malformed records, the job
categories, and where verdicts are found."""

from __future__ import annotations

import json
import re
from pathlib import Path

import orjson
import pytest

from review.html import write_html
from review.html.figures import json_script
from review.html.markdown import render
from review.html.verdict import _sides
from review.status import collect_status, format_status, job_category
from review.testdir import find_verdicts, open_testdir


def test_markdown_tables_lists_and_inline_marks() -> None:
    md = (
        "### T: **PASS**\n\nsome `a|b` text\n\n"
        "| x | y |\n| --- | --- |\n| 1 | **2** |\n| 3 |\n\n"
        "- one\n  - sub `c`\n  - sub2\n- two\n  continued\n"
    )
    out = render(md)
    assert "<h3>T: <strong>PASS</strong></h3>" in out and "<code>a|b</code>" in out
    assert out.count("<tr>") == 3 and "<td><strong>2</strong></td>" in out and "<td>3</td><td></td>" in out
    assert re.search(
        r"<li>one\s*<ul>\s*<li>sub <code>c</code></li>\s*<li>sub2</li>\s*</ul></li>\s*<li>two continued</li>", out
    ), out


def test_markdown_escapes_everything_and_never_links_off_the_page() -> None:
    out = render("<script>alert(1)</script> [run](runs/a) [web](https://example.org/x) `<b>`\n\n![fig](figure.png)")
    assert "<script>" not in out and "&lt;script&gt;" in out and "&lt;b&gt;" in out
    assert re.findall(r'href="([^"]*)"', out) == ["runs/a"]
    assert "https://example.org" not in re.findall(r'href="([^"]*)"', out)
    assert "<em>fig</em>" in out  # an image line without a hook: its alt text
    hooked = render("![fig](figure.png)", image=lambda alt, src: f"<img alt='{alt}' src='data:{src}'>")
    assert hooked == "<img alt='fig' src='data:figure.png'>"


def test_json_data_cannot_close_its_script_element() -> None:
    s = json_script({"label": "</script><script>alert(1)</script>"}, "x")
    assert s.count("</script>") == 1 and json.loads(s[s.index(">") + 1 : -len("</script>")].replace("<\\/", "</"))[
        "label"
    ].startswith("</script>")


def test_both_sides_of_a_rule_condition_from_the_record() -> None:
    env = {"slope": 0.03, "slope_factor": 0.5, "lam": 0.0966, "lam_miss": 0.0715}
    left, op, right = _sides("slope > slope_factor * (lam - lam_miss)", env)  # type: ignore[misc]
    assert (left, op) == (0.03, ">") and right == pytest.approx(0.5 * (0.0966 - 0.0715))
    assert _sides("slope > missing_name", env) is None and _sides("a and b", env) is None


@pytest.mark.parametrize(
    "state,run,want",
    [
        ("PENDING", None, "pending"),
        ("RUNNING", "RUNNING", "running"),
        ("COMPLETING", None, "running"),
        ("COMPLETED", "COMPLETED", "done"),
        ("FAILED", None, "failed"),
        ("TIMEOUT", None, "failed"),
        ("CANCELLED by 0", None, "failed"),
        ("OUT_OF_MEMORY", None, "failed"),
        ("COMPLETED", "REFUSED", "refused"),
        ("FAILED", "REFUSED", "refused"),
        (None, None, "unknown"),
    ],
)
def test_job_categories(state: str | None, run: str | None, want: str) -> None:
    assert job_category(state, run) == want


def _png(path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1], [0, 1])
    fig.savefig(path, dpi=50)
    plt.close(fig)


STAGED = {
    "test": "cut-a",
    "rule": "cut-a",
    "rule_version": 1,
    "family": "cut",
    "verdict": "THEORY-FAVOURED",
    "seeds": [0, 1],
    "arms": ["cut"],
    "registered_rates": [1.5],
    "references": {"lambda_ref": 0.0715, "all_miss_token_rate": 11243.0},
    "rule_spec": {
        "name": "cut-a",
        "report": "cut",
        "params": {"margin": 0.002, "backlog_bin": 10.0, "hit_threshold": 0.5},
        "arms": {},
    },
    "groups": [
        {
            "group": "1.5",
            "rate": 1.5,
            "outcome": "THEORY-FAVOURED",
            "reason": "2 of 2 seeds closer to model F",
            "counts": {"favoured": 2},
            "conditions": {"THEORY-FAVOURED": [{"condition": "n_favoured >= 2", "holds": True, "lhs": 2, "rhs": 2}]},
            "checks": {},
            "seeds": {
                "0": {"decided": True, "roles": {"cut": {"arm": "cut", "label": "favoured"}}},
                "1": {"decided": True, "roles": {"cut": {"arm": "cut", "label": "favoured"}}},
            },
        }
    ],
    "runs": [
        {
            "arm": "cut",
            "rate": 1.5,
            "seed": s,
            "status": "complete",
            "labels": {"endpoint": "TRAPPED", "persistence": "PERSISTED"},
            "run_dir": f"/gone/cut-r1.5-s{s}",
            "flags": {},
            "reason": "",
            "conditions": {
                "endpoint": {"TRAPPED": [{"condition": "slope > 0.01", "holds": True, "lhs": 0.02, "rhs": 0.01}]},
                "persistence": {
                    "ESCAPED": [{"condition": "persist.escape >= 0", "holds": False, "lhs": None, "rhs": 0}],
                    "PERSISTED": [],
                },
            },
        }
        for s in (0, 1)
    ],
}


def test_a_staged_family_verdict_renders_its_groups_and_its_own_figure(tmp_path: Path) -> None:
    (tmp_path / "analysis").mkdir()
    (tmp_path / "analysis" / "verdict.json").write_bytes(orjson.dumps(STAGED))
    (tmp_path / "analysis" / "report.md").write_text(
        "### cut-a: THEORY-FAVOURED\n\n"
        "| λ/λref | seed | S |\n| --- | --- | --- |\n| 1.5 | 0 | +0.01 |\n| 1.5 | 1 | +0.02 |\n"
    )
    _png(tmp_path / "analysis" / "figure.png")
    td = open_testdir(tmp_path)
    status = collect_status(td, ask_scheduler=False)
    st = status.to_json()
    assert st["verdict"]["verdict"] == "THEORY-FAVOURED" and st["verdict"]["groups"][0]["outcome"] == "THEORY-FAVOURED"
    assert "1.5: THEORY-FAVOURED (2 of 2 seeds closer to model F)" in format_status(status)
    text = write_html(td, status=status).read_text()
    assert (
        "THEORY-FAVOURED" in text and "n_favoured &gt;= 2" in text and "(2 vs 2)" in text and "(0.02 vs 0.01)" in text
    )
    assert "endpoint TRAPPED, persistence PERSISTED" in text and "favoured" in text
    assert "<h5>persistence: <span class='state'>PERSISTED</span></h5>" in text and "persist.escape &gt;= 0" in text
    assert "the cut report module&#x27;s figure" in text and "src='data:image/png;base64," in text
    assert "<td>+0.02</td>" in text  # the family's own Markdown table
    assert text.count("not drawn: cut 1.5 seed") == 2  # the run directories are gone: said, not failed


def test_malformed_records_are_reported_not_fatal(tmp_path: Path) -> None:
    (tmp_path / "submission.json").write_text("{not json")
    (tmp_path / "verdict.json").write_text(json.dumps({"no": "verdict"}))
    (tmp_path / "predictions").mkdir()
    (tmp_path / "predictions" / "x.score.json").write_text("[")
    td = open_testdir(tmp_path)
    assert td.manifest.state == "error" and "not valid JSON" in td.manifest.note
    status = collect_status(td, ask_scheduler=False)
    st = status.to_json()
    assert st["verdict"]["state"] == "error" and "no 'verdict' key" in st["verdict"]["note"]
    assert st["predictions"]["scored"][0]["error"].startswith("not valid JSON")
    assert st["jobs"]["state"] == "error"
    text = format_status(status)
    assert "jobs          none: " in text and "not valid JSON" in text
    page = write_html(td, status=status).read_text()
    assert "no &#x27;verdict&#x27; key" in page and "not valid JSON" in page


def test_verdicts_are_found_registered_first_and_never_inside_a_run(tmp_path: Path) -> None:
    for rel in (
        "verdict.json",
        "analysis/verdict.json",
        "analysis/registered-verdict.json",
        "runs/registered-analysis/registered-verdict.json",
        "runs/burst-r1.35-s0/verdict.json",
    ):
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("{}")
    (tmp_path / "runs" / "burst-r1.35-s0" / "meta.json").write_text("{}")
    got = [str(p.relative_to(tmp_path)) for p in find_verdicts(tmp_path)]
    assert got == [
        "analysis/registered-verdict.json",
        "runs/registered-analysis/registered-verdict.json",
        "verdict.json",
        "analysis/verdict.json",
    ]
