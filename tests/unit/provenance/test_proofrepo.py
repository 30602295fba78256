"""provenance/proofrepo.py: git's answers from proof objects agree with git's own, and a question
the objects cannot answer is unknown (or a change), never a pass."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.gitfixture import commit_file, git, make_repo

from harness.errors import GitError
from provenance.git import Repo
from provenance.proofrepo import ProofRepo
from provenance.proofs import prove


@pytest.mark.parametrize("object_format", ["sha1", "sha256"])
def test_answers_agree_with_git(tmp_path: Path, object_format: str) -> None:
    work, _ = make_repo(tmp_path, object_format)
    c1 = commit_file(work, "prereg/registrations/t.yaml", "name: t\n", "register")
    c2 = commit_file(work, "predictions/t.yaml", "p: 1\n", "predict")
    git(work, "tag", "-a", "pred-t", "-m", "agentload freeze pred-t\n", c2)
    repo = Repo(work)
    proofs = tmp_path / "proofs"
    a = prove(work / "prereg/registrations/t.yaml", proofs / "reg", commit=c1, repo=repo)
    b = prove(work / "predictions/t.yaml", proofs / "pred", tag="pred-t", repo=repo)
    pr = ProofRepo(tmp_path / "copies", [a, b])
    assert not pr.rejected
    assert pr.blob_at(c1, "prereg/registrations/t.yaml") == b"name: t\n"
    assert pr.blob_at(c2, "predictions/t.yaml") == b"p: 1\n"
    assert pr.commit_time(c1) == repo.commit_time(c1) and pr.tag_time("pred-t") == repo.tag_time("pred-t")
    assert pr.tag_target("pred-t") == c2 and pr.local_tag("pred-t") == repo.local_tag("pred-t")
    assert pr.tag_message("pred-t") == repo.tag_message("pred-t")
    assert pr.object_format() == object_format
    # c2's parent is c1 (both stored): an ancestor; c1's parent is not stored: unknown, not "no"
    assert pr.is_ancestor(c1, c2)
    with pytest.raises(GitError, match="ancestry unknown"):
        pr.is_ancestor(c2, c1)
    # the new folder predictions/ is stored on one side only: it reads as changed; prereg/ is unchanged
    assert pr.changed_paths(c1, c2) == repo.changed_paths(c1, c2) == ["predictions/t.yaml"]
    with pytest.raises(GitError, match="holds no repository"):
        pr.head()


def test_a_change_in_a_folder_it_does_not_hold_reads_as_changed(tmp_path: Path) -> None:
    work, _ = make_repo(tmp_path)
    c1 = commit_file(work, "prereg/registrations/t.yaml", "name: t\n", "register")
    c2 = commit_file(work, "harness/code.py", "x = 1\n", "code")
    repo = Repo(work)
    a = prove(work / "prereg/registrations/t.yaml", tmp_path / "p1", commit=c1, repo=repo)
    b = prove(work / "prereg/registrations/t.yaml", tmp_path / "p2", commit=c2, repo=repo)
    pr = ProofRepo(tmp_path, [a, b])
    assert pr.changed_paths(c1, c2) == ["harness/"]  # git says harness/code.py; the folder is all we can say


def test_an_object_that_does_not_hash_to_its_id_is_refused(tmp_path: Path) -> None:
    work, _ = make_repo(tmp_path)
    c1 = commit_file(work, "prereg/registrations/t.yaml", "name: t\n", "register")
    a = prove(work / "prereg/registrations/t.yaml", tmp_path / "p", commit=c1, repo=Repo(work))
    blob = Repo(work).blob_id(c1, "prereg/registrations/t.yaml")
    (a / "objects" / blob).write_bytes(b"name: u\n")
    pr = ProofRepo(tmp_path, [a])
    assert any(blob[:12] in r for r in pr.rejected)
    with pytest.raises(GitError, match="not among the bundle's proof objects"):
        pr.blob_at(c1, "prereg/registrations/t.yaml")
