"""Labels from facts (pure) and from git on a fixture repository with a bare remote."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.gitfixture import commit_file, git, make_repo

from prereg.labels import EXPLORATORY, PRE_REGISTERED, REGISTERED, label_for, label_now

T_COMMIT = "2026-10-24T20:09:12+00:00"
T_PUSH = "2026-10-24T20:09:54+00:00"
T_SUBMIT = "2026-10-24T20:13:39+00:00"


def _lab(**kw: object) -> str:
    base = {
        "status": "FILLED",
        "committed": True,
        "clean": True,
        "commit_time": T_COMMIT,
        "remote_confirmed_at": T_PUSH,
        "first_submit": T_SUBMIT,
    }
    base.update(kw)
    return label_for(**base).label  # type: ignore[arg-type]


def test_e2_timeline_is_pre_registered() -> None:
    # Table 15: committed 15:09:12, on the remote 15:09:54, submitted 15:13:39 (CDT = UTC-5)
    lab = label_for(
        status="FILLED",
        committed=True,
        clean=True,
        commit_time="2026-10-24T15:09:12-05:00",
        remote_confirmed_at="2026-10-24T15:09:54-05:00",
        first_submit="2026-10-24T15:13:39-05:00",
    )
    assert lab.label == PRE_REGISTERED and lab.decisive


def test_vllm_timeline_is_registered() -> None:
    # Table 16: committed 16:23:59, submitted 16:24:36, on the remote only at 16:26:35
    lab = label_for(
        status="FILLED",
        committed=True,
        clean=True,
        commit_time="2026-10-30T16:23:59-05:00",
        remote_confirmed_at="2026-10-30T16:26:35-05:00",
        first_submit="2026-10-30T16:24:36-05:00",
    )
    assert lab.label == REGISTERED
    assert "16:26" not in lab.reason or "confirmed on the remote only" in lab.reason


@pytest.mark.parametrize(
    "kw,expected",
    [
        ({}, PRE_REGISTERED),
        ({"remote_confirmed_at": T_SUBMIT}, PRE_REGISTERED),  # same second: at or before
        ({"remote_confirmed_at": None}, REGISTERED),
        ({"remote_confirmed_at": "2026-10-24T20:14:00+00:00"}, REGISTERED),
        ({"status": "EXPLORATORY"}, EXPLORATORY),
        ({"status": "INCOMPLETE"}, EXPLORATORY),
        ({"status": None}, EXPLORATORY),
        ({"committed": False}, EXPLORATORY),
        ({"clean": False}, EXPLORATORY),
        ({"commit_time": "2026-10-24T20:14:00+00:00", "remote_confirmed_at": None}, EXPLORATORY),
        ({"first_submit": None}, EXPLORATORY),
    ],
)
def test_label_rule(kw: dict[str, object], expected: str) -> None:
    assert _lab(**kw) == expected


def test_naive_time_is_refused() -> None:
    with pytest.raises(ValueError, match="time zone"):
        _lab(first_submit="2026-10-24T20:13:39")


def test_labels_from_git(tmp_path: Path) -> None:
    work, _remote = make_repo(tmp_path)
    reg = work / "prereg" / "registrations" / "x.yaml"
    # untracked -> exploratory
    reg.parent.mkdir(parents=True)
    reg.write_text("a: 1\n")
    lab, facts = label_now(reg, "FILLED")
    assert lab.label == EXPLORATORY and facts.state == "untracked"
    # committed, not pushed -> registered
    commit = commit_file(work, "prereg/registrations/x.yaml", "a: 1\n")
    lab, facts = label_now(reg, "FILLED")
    assert (lab.label, facts.commit, facts.on_remote) == (REGISTERED, commit, False)
    # pushed -> pre-registered
    git(work, "push", "-q", "origin", "main")
    lab, facts = label_now(reg, "FILLED")
    assert lab.label == PRE_REGISTERED and facts.on_remote and facts.remote_head == commit
    # a dirty tracked file anywhere -> exploratory
    (work / "README.md").write_text("changed\n")
    lab, facts = label_now(reg, "FILLED")
    assert lab.label == EXPLORATORY and not facts.clean
    git(work, "checkout", "--", "README.md")
    # the registration itself edited -> exploratory
    reg.write_text("a: 2\n")
    lab, facts = label_now(reg, "FILLED")
    assert lab.label == EXPLORATORY and facts.state == "modified"
    # status decides before git does
    git(work, "checkout", "--", "prereg/registrations/x.yaml")
    assert label_now(reg, "EXPLORATORY")[0].label == EXPLORATORY
