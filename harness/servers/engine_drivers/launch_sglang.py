"""SGLang's own `ServerArgs` command-line parsing on the harness's launch commands.

Runs INSIDE the SGLang engine venv (stdlib + sglang; the harness never imports sglang): the harness
runs `<sglang python> launch_sglang.py`, writes one JSON request to stdin and reads one JSON reply.
For each launch it does what `python -m sglang.launch_server` does before it resolves anything
(sglang/launch_server.py -> sglang/srt/server_args.py `prepare_server_args`): `ServerArgs.add_cli_args`
on a fresh parser, `parse_args`, `ServerArgs.from_cli_args`, and returns the requested fields. An
unknown flag, a value of the wrong type or outside the flag's choices ends argparse with its own
message, which is returned. SGLang's resolution (`resolve_once`: device, memory and model-derived
settings) is not run: it reads the model's config and probes the device, neither of which a check
without the weights and the GPU can do. It also reports where SGLang's source defines each
Prometheus series asked for (source_scan.py) and which environment variables the source reads.

Request/reply: as launch_vllm.py's (without labels), "engine": "sglang".
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import sys
import traceback
from importlib import metadata
from typing import Any

from source_scan import env_reads, find_series  # (beside this script)

MISSING = "<not an SGLang argument>"


def _plain(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return str(v)


def parse_one(argv: list[str], fields: list[str]) -> dict[str, Any]:
    from sglang.srt.server_args import prepare_server_args

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = prepare_server_args(list(argv))
    except SystemExit as exc:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        return {
            "ok": False,
            "error": f"argument parser (exit {exc.code}): {lines[-1] if lines else 'no message'}",
            "values": {},
        }
    except Exception as exc:  # every refusal is a result
        return {"ok": False, "error": f"prepare_server_args: {type(exc).__name__}: {exc}", "values": {}}
    logging.disable(logging.CRITICAL)  # prepare_server_args configures logging; keep the reply alone on stdout
    return {
        "ok": True,
        "error": None,
        "values": {f: _plain(getattr(args, f)) if hasattr(args, f) else MISSING for f in fields},
    }


def main(out: Any) -> int:
    req = json.loads(sys.stdin.read())
    reply: dict[str, Any] = {"engine": "sglang", "version": metadata.version("sglang"), "launches": []}
    for launch in req.get("launches", []):
        res = parse_one(list(launch["argv"]), list(launch.get("fields", [])))
        reply["launches"].append({"key": launch["key"], **res})
    reply["series"] = find_series("sglang", "sglang:", list(req.get("series", [])))
    reply["labels"] = {"present": [], "missing": []}
    reply["env"] = env_reads("sglang", list(req.get("env", [])))
    out.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    REPLY, sys.stdout = sys.stdout, sys.stderr  # the engine's own prints must not mix with the reply
    try:
        sys.exit(main(REPLY))
    except Exception as exc:  # the harness reads the reason from the reply
        REPLY.write(json.dumps({"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}) + "\n")
        sys.exit(1)
