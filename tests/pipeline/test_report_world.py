"""`agentload status` and `agentload report --html` on a small registered test built with the real
parts (tests/support/reportfixture.py): registration committed and pushed, model F predictions frozen before
the runs, a submission manifest, four bound simulated runs, the registered verdict, the scores.
The browser tests open the page in headless Chromium (marker `browser`)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from datetime import UTC
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import orjson
import pytest
from support.reportfixture import build_world, copy_world, squeue_runner

from cli.main import main
from provenance.git import Repo
from review.html import write_html
from review.status import collect_status, format_status
from review.testdir import find_verdicts, open_testdir


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with pytest.MonkeyPatch.context() as mp:
        w = build_world(tmp_path_factory.mktemp("world"), mp)
        yield w


def _td(world: dict[str, Any], path: Path | None = None) -> Any:
    return open_testdir(path or world["testdir"], repo=Repo(world["work"]))


STATES = {"101": "COMPLETED", "102": "RUNNING", "103": "PENDING", "104": "TIMEOUT"}


# ---------------------------------------------------------------------------------------------
# status
# ---------------------------------------------------------------------------------------------
def test_status_of_a_registered_scored_test(world: dict[str, Any]) -> None:
    status = collect_status(_td(world), runner=squeue_runner(STATES))
    st = status.to_json()
    r = st["registration"]
    assert (r["state"], r["name"], r["status"], r["sha256"]) == (
        "present",
        "tiny-e2",
        "FILLED",
        world["binding"]["sha256"],
    )
    assert r["label"] == "pre-registered" and r["label_basis"].startswith("the record"), r
    p = st["predictions"]
    assert (
        p["frozen"]
        and [f["tag"] for f in p["freezes"]] == ["pred-tiny"]
        and p["freezes"][0]["blindness"] == "blind in time"
    )
    assert p["scored"][0]["tag"] == "pred-tiny" and p["scored"][0]["hits"] + p["scored"][0]["misses"] > 0
    j = st["jobs"]
    assert j["source"].startswith("scheduler")
    assert j["counts"] == {"pending": 1, "running": 1, "done": 1, "failed": 1, "refused": 0, "unknown": 0}
    assert {x["job_id"]: x["category"] for x in j["jobs"]} == {
        "101": "done",
        "102": "running",
        "103": "pending",
        "104": "failed",
    }
    ru = st["runs"]
    assert (ru["found"], ru["bound"], ru["registered"], ru["missing"], ru["unbound"]) == (4, 4, 4, [], [])
    v = st["verdict"]
    assert v["registered"] and v["decisive"] and v["verdict"] == world["verdict"]["verdict"]
    assert [x["rate"] for x in v["rates"]] == [1.35] and v["path"].endswith("registered-verdict.json")
    pv = st["provenance"]
    assert pv["ok"] is True and pv["breaks"] == [] and pv["checks"] > 10
    text = format_status(status)
    for line in (
        "registration  tiny-e2 (FILLED)",
        "label         PRE-REGISTERED",
        "predictions   frozen pred-tiny",
        "blind in time",
        "jobs          4: 1 pending, 1 running, 1 done, 1 failed, 0 refused",
        "job 104 noburst r1.35 s1: failed (state TIMEOUT",
        "4 bound of 4 registered",
        "verdict       INCOMPLETE (registered, decisive",
        "provenance    holds",
    ):
        assert line in text, (line, text)


def test_status_command_json_and_text(
    world: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("slurm.scheduler.run_command", squeue_runner(STATES))
    assert main(["status", str(world["testdir"]), "--repo", str(world["work"]), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["test"] == "tiny-e2" and st["jobs"]["counts"]["failed"] == 1 and st["runs"]["bound"] == 4
    assert main(["status", str(world["testdir"]), "--repo", str(world["work"]), "--no-scheduler"]) == 0
    out = capsys.readouterr().out
    assert "4 unknown [from none]" in out and "provenance    holds" in out


def test_a_refused_job_and_an_edited_run_show_as_such(world: dict[str, Any], tmp_path: Path) -> None:
    td_path = copy_world(world, tmp_path / "td")
    run = td_path / "runs" / "noburst-r1.35-s0"
    m = orjson.loads((run / "meta.json").read_bytes())
    m["status"], m["status_reason"] = "REFUSED", "registration SHA-256 differs from the one the job was submitted with"
    (run / "meta.json").write_bytes(orjson.dumps(m))
    # the edit comes after the verdict (status allows a second of clock skew; the world may be younger)
    later = max(p.stat().st_mtime for p in find_verdicts(td_path)) + 10.0
    os.utime(run / "meta.json", (later, later))
    status = collect_status(_td(world, td_path), runner=squeue_runner(STATES))
    st = status.to_json()
    cats = {x["job_id"]: x["category"] for x in st["jobs"]["jobs"]}
    assert cats["103"] == "refused" and st["jobs"]["counts"]["refused"] == 1
    assert st["runs"]["bound"] == 3 and st["runs"]["missing"] == ["NOBURST r1.35 s0"]
    assert any("only a completed run counts" in r for u in st["runs"]["unbound"] for r in u["reasons"])
    assert st["provenance"]["ok"] is False and any(
        b["name"] == "noburst-r1.35-s0 completed" for b in st["provenance"]["breaks"]
    )
    assert st["verdict"].get("stale"), "a run changed after the verdict: the status must say so"
    text = format_status(status)
    assert "1 refused" in text and "BREAK [runs] noburst-r1.35-s0 completed" in text and "STALE" in text


def test_job_states_from_the_accounting_export_when_the_scheduler_cannot_be_asked(
    world: dict[str, Any], tmp_path: Path
) -> None:
    from datetime import datetime

    from slurm.accounting_export import write_accounting_export
    from slurm.parsers import AccountingRow

    td_path = copy_world(world, tmp_path / "td")
    t = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [
        AccountingRow(jid, "agentload", t, t, t, st, st, 0, 0, "node1", "01:00:00", 3600.0, "00:10:00", 600.0, "")
        for jid, st in (("101", "COMPLETED"), ("102", "COMPLETED"), ("103", "CANCELLED"), ("104", "COMPLETED"))
    ]
    write_accounting_export(rows, td_path / "provenance" / "accounting.json")

    def no_scheduler(argv: Any, env: Any) -> Any:
        raise FileNotFoundError(argv[0])

    status = collect_status(_td(world, td_path), runner=no_scheduler)
    st = status.to_json()
    j = st["jobs"]
    assert j["source"].startswith("accounting export") and "could not be asked" in j["note"]
    assert j["counts"]["done"] == 3 and j["counts"]["failed"] == 1
    format_status(status)  # whatever the timeline makes of the export, the status is printed


def test_an_exploratory_test_shows_not_registered_not_a_break(world: dict[str, Any], tmp_path: Path) -> None:
    """Runs that no registration binds (no manifest, no binding in their meta.json) are an
    exploratory test: status and the page say "not registered (exploratory)", and nothing breaks."""
    import shutil

    td_path = tmp_path / "td"
    shutil.copytree(world["testdir"] / "runs", td_path / "runs")
    for run in (td_path / "runs").iterdir():
        m = orjson.loads((run / "meta.json").read_bytes())
        m["registration"] = None
        (run / "meta.json").write_bytes(orjson.dumps(m))
    td = open_testdir(td_path, repo=Repo(world["work"]))
    status = collect_status(td, ask_scheduler=False)
    pv = status.to_json()["provenance"]
    assert pv["state"] == "present" and pv["ok"] is True and pv["breaks"] == [], pv
    assert pv["exploratory"].startswith("no registration"), pv
    assert status.registration.label == "exploratory"
    text = format_status(status)
    assert "provenance    not registered (exploratory): no registration" in text and "BREAK" not in text, text
    page = write_html(td, status=status).read_text()
    assert "not registered (exploratory)</span>" in page and "BREAK(S)" not in page


def test_an_empty_test_directory_says_what_has_not_happened(tmp_path: Path) -> None:
    status = collect_status(open_testdir(tmp_path), ask_scheduler=False)
    st = status.to_json()
    assert st["registration"]["state"] == "absent" and st["registration"]["label"] == "exploratory"
    assert not st["predictions"]["frozen"] and st["jobs"]["state"] == "absent" and st["runs"]["found"] == 0
    assert st["verdict"]["state"] == "absent" and st["provenance"]["state"] == "absent"
    text = format_status(status)
    for phrase in (
        "no registration binds this test",
        "predictions   not frozen",
        "jobs          none: no submission manifest",
        "runs          0 found",
        "not scored yet",
        "provenance    not verified: nothing to verify",
    ):
        assert phrase in text, (phrase, text)


def test_status_refuses_a_missing_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", str(tmp_path / "nope")]) == 2
    assert "not a test directory" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# the HTML page (structure; the browser tests below open it)
# ---------------------------------------------------------------------------------------------
class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[str, str, str]] = []  # (tag, attribute, value)
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for k, v in attrs:
            if k in ("src", "href") and v is not None:
                self.refs.append((tag, k, v))
            if k == "id" and v:
                self.ids.add(v)


@pytest.fixture(scope="module")
def page(world: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    import review.status as status_mod

    status = status_mod.collect_status(_td(world), runner=squeue_runner(STATES))
    out = write_html(_td(world), world["testdir"] / "report.html", status=status)
    return out, out.read_text(encoding="utf-8")


def test_the_page_is_self_contained_and_every_link_resolves(page: tuple[Path, str]) -> None:
    out, text = page
    p = _Refs()
    p.feed(text)
    assert not re.search(r"<link\b", text) and "@import" not in text
    for tag, attr, v in p.refs:
        if attr == "src":
            assert v.startswith("data:"), f"<{tag} src={v[:60]}> is not embedded"
            continue
        assert not re.match(r"^[a-z][a-z0-9+.-]*:", v, re.I), f"link off the page's folder: {v}"
        if v.startswith("#"):
            assert v[1:] in p.ids, f"anchor {v} has no target"
        else:
            assert (out.parent / unquote(v)).exists(), f"link {v} points at nothing"
    run_links = [v for _, a, v in p.refs if a == "href" and v.startswith("runs/") and v.endswith("/")]
    table_links = [v for _, a, v in p.refs if a == "href" and v.endswith(".parquet")]
    assert len(run_links) == 4 and len(table_links) >= 4 * 5  # every run directory, its plan and its tables


def test_the_page_holds_every_record(world: dict[str, Any], page: tuple[Path, str]) -> None:
    _, text = page
    for k in ("status", "verdict", "tables", "figures", "predictions", "provenance", "registration", "runs"):
        assert f"id='{k}'" in text
    assert world["binding"]["sha256"] in text and "pre-registered" in text
    for name in ("burst-r1.35-s0", "burst-r1.35-s1", "noburst-r1.35-s0", "noburst-r1.35-s1"):
        assert f"id='cond-{name.split('-')[0]}-r1_35-s{name[-1]}'" in text  # each run's conditions
    assert "slope &gt; slope_factor * (lam - lam_miss)" in text
    assert re.search(r"\(\d\.\d+(e-\d+)? &gt; \d\.\d+(e-\d+)?\)", text), "the two sides of a comparison are shown"
    assert "mf-burst-r1.35-s0-slope" in text and "blind in time" in text  # predictions scored, with blindness
    # the simulator's predictions with their flip margins, and the scores of robust and knife-edge ones apart
    assert "<th>flip margin</th>" in text and "<table class='margins'>" in text
    assert re.search(r'class="badge (robust|knife-edge)"', text) and "sim-burst-r1.35-s0-state" in text
    assert "registration committed" in text and "prediction freeze on remote" in text and "run start" in text
    assert "36 checks" in text or "checks that hold" in text
    assert "101 (done)" in text and "104 (failed)" in text  # each run's job and its state
    # the Markdown report's tables, rendered: Table 7 layout and the per-run table
    assert "<th>rate verdict</th>" in text and "<th>outstanding last 300 s</th>" in text


def test_the_chart_data_is_the_runs_series(world: dict[str, Any], page: tuple[Path, str]) -> None:
    from analysis.metrics import run_series
    from harness.recording.record import load_run

    _, text = page
    m = re.search(r'<script type="application/json" id="chart-0-data">(.*?)</script>', text, re.S)
    assert m, "no chart data"
    spec = json.loads(m.group(1).replace("<\\/", "</"))
    assert spec["rate"] == 1.35 and len(spec["series"]) == 2 * 4 and spec["bands"] == [{"x0": 1200.0, "x1": 1800.0}]
    s = next(x for x in spec["series"] if x["label"].startswith("BURST seed 0") and x["panel"] == 1)
    run = load_run(world["testdir"] / "runs" / "burst-r1.35-s0")
    want = run_series(run.turns, run.sessions, run.gate_events, 1800.0, 100.0, 10.0, 0.5)["in_system"]
    assert s["y"][:50] == pytest.approx([round(float(v), 2) for v in want[:50]])


def test_report_command_writes_the_page_and_prints_the_markdown(
    world: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "elsewhere" / "page.html"
    assert main(["report", str(world["testdir"]), "--html", "--out", str(out), "--repo", str(world["work"])]) == 0
    assert out.is_file() and "self-contained" in capsys.readouterr().out
    p = _Refs()
    p.feed(out.read_text())
    for _, attr, v in p.refs:  # links relative to the page's own folder
        if attr == "href" and not v.startswith("#"):
            assert (out.parent / unquote(v)).exists(), v
    assert main(["report", str(world["testdir"])]) == 0
    md = capsys.readouterr().out
    assert "## Registered analysis: tiny-e2" in md and "#### Per run" in md


# ---------------------------------------------------------------------------------------------
# in a real browser
# ---------------------------------------------------------------------------------------------
def _chromium() -> str:
    from support.browser_check import find_chromium

    bin_ = find_chromium()
    if bin_ is None:
        if os.environ.get("AGENTLOAD_SKIP_BROWSER") == "1":
            pytest.skip("AGENTLOAD_SKIP_BROWSER=1 and no Chromium installed")
        pytest.fail(
            "no Chromium: run scripts/setup-chromium.sh (Debian package chromium), "
            "or set AGENTLOAD_SKIP_BROWSER=1 to skip"
        )
    return bin_


def _open(page_path: Path, name: str, record_property: Any) -> Any:
    from support.browser_check import artifact_dir, check_page

    shot = artifact_dir() / f"{name}.png"
    res = check_page(page_path, screenshot=shot, chromium=_chromium())
    (artifact_dir() / f"{name}.json").write_text(
        json.dumps({"problems": res.problems, "zoom": res.zoom, **res.probe}, indent=1)
    )
    print(f"screenshot: {shot}")
    record_property("screenshot", str(shot))
    assert res.problems == [], res.problems
    assert shot.is_file() and shot.stat().st_size > 10_000
    return res


@pytest.mark.browser
def test_the_page_renders_in_chromium_without_an_error(page: tuple[Path, str], record_property: Any) -> None:
    res = _open(page[0], "report-registered-test", record_property)
    pr = res.probe
    assert pr["imgs"] and all(i["complete"] and i["w"] > 100 and i["h"] > 100 for i in pr["imgs"]), pr["imgs"]
    assert pr["charts"] and all(
        c["live"] and c["svg"] and c["paths"] == 8 and c["w"] > 300 and c["h"] > 300 for c in pr["charts"]
    ), pr["charts"]
    assert pr["svgs"] and pr["svgs"][0]["marks"] >= 10  # the timeline strip
    rows = {(t["section"], t["cls"]): t["rows"] for t in pr["tables"]}
    assert rows[("verdict", "states")] == 2 and rows[("runs", "runs")] == 4 and rows[("provenance", "timeline")] >= 10
    assert rows[("predictions", "predictions")] >= 5 and rows[("provenance", "checks")] >= 10
    assert rows[("predictions", "margins")] >= 1  # robust / knife-edge scores apart
    md = [t for t in pr["tables"] if t["cls"] == "md"]
    assert [t["rows"] for t in md] == [2, 4]  # Table 7 layout (2 arms) and the per-run table (4 runs)
    assert all(t["rows"] > 0 for t in pr["tables"]), [t for t in pr["tables"] if not t["rows"]]
    z = res.zoom
    assert z["before"] == [0, 1800] and 300 < z["after"][0] < z["after"][1] < 1000, z  # a drag zooms the time axis
    assert z["tip"] and "seed" in z["tip"] and "t = " in z["tip"], z  # hovering names the run and the value


@pytest.mark.browser
def test_a_page_of_absent_records_renders_and_says_so(tmp_path: Path, record_property: Any) -> None:
    out = write_html(
        open_testdir(tmp_path),
        tmp_path / "report.html",
        status=collect_status(open_testdir(tmp_path), ask_scheduler=False),
    )
    res = _open(out, "report-empty-test", record_property)
    absent = [a for s in res.probe["sections"] for a in s["absent"]]
    assert any("Not scored yet" in a for a in absent) and any("No predictions were frozen" in a for a in absent)
    assert any("No registration" in a for a in absent) and any("No run directory yet" in a for a in absent)


def test_before_submission_the_label_is_what_jobs_submitted_now_would_get(
    world: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    td_path = tmp_path / "td"
    shutil.copytree(world["testdir"] / "provenance" / "freezes", td_path / "provenance" / "freezes")
    status = collect_status(
        open_testdir(td_path, repo=Repo(world["work"]), registration=world["reg_file"]), ask_scheduler=False
    )
    st = status.to_json()
    r = st["registration"]
    assert (r["state"], r["status"], r["sha256"]) == ("present", "FILLED", world["binding"]["sha256"])
    assert r["label"] == "pre-registered" and r["label_basis"].startswith("jobs submitted now"), r
    assert (
        r["git"]["on_remote"] is True
        and st["predictions"]["frozen"]
        and st["jobs"]["state"] == "absent"
        and st["runs"]["found"] == 0
    )
    assert st["runs"]["bound"] == 0 and len(st["runs"]["missing"]) == 4  # every registered run still to come
    assert (
        main(
            [
                "status",
                str(td_path),
                "--registration",
                str(world["reg_file"]),
                "--repo",
                str(world["work"]),
                "--no-scheduler",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "[jobs submitted now (prereg.labels.label_now)]" in out and "0 bound of 4 registered" in out
