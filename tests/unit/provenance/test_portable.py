"""A record that may be committed names no path of the host that wrote it (provenance/portable.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from provenance.portable import portable_argv, remote_label


@pytest.mark.parametrize(
    ("url", "want"),
    [
        ("/work/remotes/agentload.git", "agentload.git"),
        ("/work/remotes/agentload.git/", "agentload.git"),
        ("file:///srv/git/agentload.git", "agentload.git"),
        ("../remote", "remote"),
        ("https://github.com/owner/agentload.git", "https://github.com/owner/agentload.git"),
        ("https://alice:token@example.org:8443/a.git", "https://example.org:8443/a.git"),
        ("ssh://git@example.org/owner/a.git", "ssh://example.org/owner/a.git"),
        ("git@github.com:owner/agentload.git", "git@github.com:owner/agentload.git"),
        (None, None),
    ],
)
def test_a_local_remote_is_recorded_by_name_a_network_one_without_credentials(url: str | None, want: str) -> None:
    assert remote_label(url) == want


def test_a_command_line_names_no_host_path(tmp_path: Path) -> None:
    repo = tmp_path / "checkout"
    (repo / "predictions").mkdir(parents=True)
    argv = [
        str(repo / ".venv" / "bin" / "agentload"),
        "predict",
        "freeze",
        str(repo / "predictions" / "p.yaml"),
        "predictions/q.yaml",
        f"--testdir={tmp_path / 'elsewhere' / 'td'}",
        "--message",
        "a message with /slashes/ inside",
    ]
    assert portable_argv(argv, repo) == [
        "agentload",
        "predict",
        "freeze",
        "predictions/p.yaml",
        "predictions/q.yaml",
        "--testdir=td",
        "--message",
        "a message with /slashes/ inside",
    ]
