"""Small registration inputs for tests: a short protocol (cheap plans), the paper's E2 300k inputs,
and a template that uses them, all written into a temporary folder (or a fixture repository)."""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SHORT_PROTOCOL = """kind: protocol
name: short
description: a short paired-test protocol for tests
duration: 900.0
burst: {time: 200.0, size: 20, width: 30.0}
window: {start: 300.0, end: 900.0}
min_window: 300.0
backlog_bin: 10.0
hit_bin: 100.0
recovered_span: 100.0
gauge_interval: 5.0
"""


def template_text(
    name: str = "e2-test", cell: str = "sglang-a100-300k", protocol: str = "short.yaml", extra: str = ""
) -> str:
    return f"""format: agentload-registration-template
format_version: 1
name: {name}
test: {name}
description: a test registration
cell: {cell}
workload: standard
protocol: {protocol}
arms: [burst, noburst, capped]
seeds: [0, 1, 2]
rule: e2
{extra}"""


def write_case(folder: Path, cell: str = "sglang-a100-300k", extra: str = "") -> tuple[Path, Path]:
    """(inputs folder, template path) under `folder`: the paper's inputs for `cell`, a short protocol."""
    inputs = folder / "prereg" / "inputs" / cell
    shutil.copytree(ROOT / "prereg" / "inputs" / "paper" / cell, inputs)
    tdir = folder / "prereg" / "templates"
    tdir.mkdir(parents=True, exist_ok=True)
    (tdir / "short.yaml").write_text(SHORT_PROTOCOL)
    t = tdir / "e2-test.yaml"
    t.write_text(template_text(cell=cell, extra=extra))
    return inputs, t
