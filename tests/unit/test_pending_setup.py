"""The background install's hand-over to the tests (tests/support/pending_setup.py): the exports
scripts/ci-engine-tests.sh --print-env prints are read back exactly, a test that needs them waits
for the install's end, and a failed or endless install fails that test with the log, never a skip."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from support import pending_setup


@pytest.fixture
def announced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    env_file = tmp_path / "engine-env.sh"
    monkeypatch.setenv(pending_setup.ENV_VAR, str(env_file))
    monkeypatch.setattr(pending_setup, "_loaded", [])
    monkeypatch.setattr(pending_setup, "POLL_S", 0.05)
    for name in ("AGENTLOAD_X_PY", "AGENTLOAD_X_MODEL"):
        monkeypatch.delenv(name, raising=False)
    return env_file


def _finish(env_file: Path, exports: str, rc: int) -> None:
    env_file.write_text(exports, encoding="utf-8")
    Path(str(env_file) + ".log").write_text("collecting torch\nERROR: no space left on device\n", encoding="utf-8")
    Path(str(env_file) + ".rc").write_text(f"{rc}\n", encoding="utf-8")


def _bash_exports(values: dict[str, str]) -> str:
    """What the install script prints: bash's own `printf 'export %s=%q'`."""
    script = "".join(f"printf 'export %s=%q\\n' {k} \"${k}\"\n" for k in values)
    return subprocess.run(["bash", "-c", script], env={**os.environ, **values}, capture_output=True, text=True).stdout


def test_bash_quoted_exports_read_back_exactly() -> None:
    values = {"AGENTLOAD_X_PY": "/srv/a b/venv's/bin/python", "AGENTLOAD_X_MODEL": "/m/tiny-$HOME;x"}
    assert pending_setup.parse_exports(_bash_exports(values)) == values
    with pytest.raises(pending_setup.SetupFailed, match="line 2"):
        pending_setup.parse_exports("export A=1\nA=2\n")


def test_no_announced_install_means_nothing_pending(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(pending_setup.ENV_VAR, raising=False)
    assert not pending_setup.pending() and pending_setup.load(wait=True)


def test_a_waiting_test_gets_the_environment_once_the_install_ends(announced: Path) -> None:
    assert pending_setup.pending() and not pending_setup.load(wait=False)  # still installing: no wait
    exports = _bash_exports({"AGENTLOAD_X_PY": "/e/bin/python"})
    done = threading.Timer(0.3, _finish, args=(announced, exports, 0))
    done.start()
    t0 = time.monotonic()
    assert pending_setup.load(wait=True)
    assert time.monotonic() - t0 >= 0.25  # it waited for the .rc file, not just the exports
    assert os.environ["AGENTLOAD_X_PY"] == "/e/bin/python" and not pending_setup.pending()
    del os.environ["AGENTLOAD_X_PY"]


def test_a_failed_install_fails_the_test_that_needs_it_with_the_log(announced: Path) -> None:
    _finish(announced, "", 1)
    assert not pending_setup.load(wait=False)  # a test that does not need it goes on
    with pytest.raises(pending_setup.SetupFailed, match=r"(?s)exit status 1.*no space left on device"):
        pending_setup.load(wait=True)
    assert pending_setup.pending()


def test_an_install_that_never_ends_fails_after_the_wait(announced: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pending_setup, "WAIT_S", 0.2)
    with pytest.raises(pending_setup.SetupFailed, match="did not end within"):
        pending_setup.load(wait=True)
