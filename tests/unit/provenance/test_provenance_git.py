"""Git facts from git: committed or not, clean or dirty, and whether the remote really holds a commit."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.gitfixture import commit_file, git, make_repo

from provenance.git import GitError, Repo


def test_file_states_and_remote_containment(tmp_path: Path) -> None:
    work, _ = make_repo(tmp_path)
    repo = Repo(work)
    assert repo.is_clean()
    c1 = commit_file(work, "reg/a.yaml", "x: 1\n")
    assert repo.file_state("reg/a.yaml") == "committed" and repo.last_commit_of("reg/a.yaml") == c1
    # committed, not pushed: the remote does not contain it
    chk = repo.remote_contains(c1)
    assert not chk.contains and chk.remote == "origin" and chk.branch == "main" and chk.remote_head
    git(work, "push", "-q", "origin", "main")
    chk = repo.remote_contains(c1)
    assert chk.contains and chk.remote_head == c1
    # edited in the tree: modified and dirty; new file: untracked
    (work / "reg/a.yaml").write_text("x: 2\n")
    assert repo.file_state("reg/a.yaml") == "modified" and not repo.is_clean()
    (work / "reg/b.yaml").write_text("y\n")
    assert repo.file_state("reg/b.yaml") == "untracked"
    assert repo.blob_at(c1, "reg/a.yaml") == b"x: 1\n"
    assert Repo.containing(work / "reg" / "a.yaml").path.resolve() == work.resolve()


def test_a_forged_tracking_ref_does_not_fool_the_check(tmp_path: Path) -> None:
    work, _ = make_repo(tmp_path)
    repo = Repo(work)
    c1 = commit_file(work, "f.txt", "1\n")
    git(work, "update-ref", "refs/remotes/origin/main", c1)  # the local view claims it is pushed
    assert not repo.remote_contains(c1).contains


def test_git_errors_name_the_command(tmp_path: Path) -> None:
    with pytest.raises(GitError, match="rev-parse"):
        Repo(tmp_path).head()
