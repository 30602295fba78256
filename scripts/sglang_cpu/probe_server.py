"""Start a real SGLang server, ask it everything the harness relies on, stop it; print JSON facts.

Usage (stdlib only; any python 3.10+ runs it, the server runs from the argv given):

    python scripts/sglang_cpu/probe_server.py --out facts.json --log server.log -- \\
        ENGINE_PY -m sglang.launch_server --model-path DIR --port P ... --device cpu

The host and port are read from the argv. The server gets SGLANG_USE_CPU_ENGINE=1 and
HF_HUB_OFFLINE=1 and private TMPDIR / XDG_CACHE_HOME under --cache. It is started in its own
process group and that group is stopped at the end (SIGTERM, then SIGKILL after 20 s), also on
errors. What it measures is written up in docs/sglang-cpu.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

VOCAB = (4, 32000)


def http(method: str, url: str, body: Any = None, timeout: float = 120.0) -> tuple[int | None, bytes, float]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read(), time.monotonic() - t0
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), time.monotonic() - t0
    except (urllib.error.URLError, OSError) as exc:
        return None, repr(exc).encode(), time.monotonic() - t0


def as_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def shrink(obj: Any, n: int = 6) -> Any:
    """Long id lists shown as their length and first entries."""
    if isinstance(obj, list) and len(obj) > n and all(isinstance(x, int) for x in obj):
        return {"len": len(obj), "head": obj[:n]}
    if isinstance(obj, list):
        return [shrink(x, n) for x in obj]
    if isinstance(obj, dict):
        return {k: shrink(v, n) for k, v in obj.items()}
    return obj


class Probe:
    def __init__(self, base: str, model: str, rng: random.Random) -> None:
        self.base = base
        self.model = model
        self.rng = rng

    def ids(self, n: int) -> list[int]:
        return [self.rng.randrange(*VOCAB) for _ in range(n)]

    def completion(
        self, prompt: list[int] | str, max_tokens: int = 16, timeout: float = 600.0, **more: Any
    ) -> tuple[int | None, Any, float]:
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
            "stream": False,
            **more,
        }
        status, raw, dt = http("POST", self.base + "/v1/completions", body, timeout=timeout)
        return status, as_json(raw), dt

    def generate(self, input_ids: list[int], max_new_tokens: int = 16) -> tuple[int | None, Any, float]:
        body = {
            "input_ids": input_ids,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True},
        }
        status, raw, dt = http("POST", self.base + "/generate", body)
        return status, as_json(raw), dt

    @staticmethod
    def cached(resp: Any) -> Any:
        try:
            det = resp["usage"].get("prompt_tokens_details")
        except (TypeError, KeyError, AttributeError):
            return "no usage"
        return det if det is None else det.get("cached_tokens")


def metric_names(text: str) -> dict[str, Any]:
    types: dict[str, str] = {}
    samples: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line and not line.startswith("#"):
            m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
            if m:
                samples.setdefault(m.group(1), []).append(f"{m.group(2) or ''} {m.group(3)}")
    return {"types": types, "samples": samples}


def run(
    argv: list[str], out: Path, log_path: Path, cache: Path, context: int, skip_slow: bool, busy_tokens: int
) -> dict[str, Any]:
    host = argv[argv.index("--host") + 1]
    port = int(argv[argv.index("--port") + 1])
    served = (
        argv[argv.index("--served-model-name") + 1]
        if "--served-model-name" in argv
        else argv[argv.index("--model-path") + 1]
    )
    base = f"http://{host}:{port}"
    for sub in ("tmp", "xdg"):
        (cache / sub).mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "SGLANG_USE_CPU_ENGINE": "1",
        "HF_HUB_OFFLINE": "1",
        "TMPDIR": str(cache / "tmp"),
        "XDG_CACHE_HOME": str(cache / "xdg"),
    }
    facts: dict[str, Any] = {
        "argv": argv,
        "env_added": {k: env[k] for k in ("SGLANG_USE_CPU_ENGINE", "HF_HUB_OFFLINE")},
    }
    log = log_path.open("wb")
    t_start = time.monotonic()
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    facts["pid"] = proc.pid
    try:
        health_seen: list[list[Any]] = []
        while True:
            if proc.poll() is not None:
                facts["start"] = {"exited": proc.returncode}
                return facts
            status, _, _ = http("GET", base + "/health", timeout=5)
            t = round(time.monotonic() - t_start, 1)
            if not health_seen or health_seen[-1][1] != status:
                health_seen.append([t, status])
            if status == 200:
                break
            if t > 600:
                facts["start"] = {"never_healthy": health_seen}
                return facts
            time.sleep(0.25)
        facts["start"] = {"seconds_to_health_200": round(time.monotonic() - t_start, 1), "health_statuses": health_seen}
        p = Probe(base, served, random.Random(0))

        for path in (
            "/health",
            "/health_generate",
            "/v1/models",
            "/model_info",
            "/server_info",
            "/get_server_info",
            "/version",
            "/get_model_info",
        ):
            status, raw, dt = http("GET", base + path)
            body = as_json(raw)
            facts.setdefault("get", {})[path] = {
                "status": status,
                "seconds": round(dt, 3),
                "body": body if not isinstance(body, dict) else sorted(body),
            }
        status, raw, _ = http("GET", base + "/server_info")
        info = as_json(raw) if status == 200 else {}
        if not isinstance(info, dict):
            info = {}
        keys = (
            "max_total_num_tokens",
            "max_total_tokens",
            "page_size",
            "schedule_policy",
            "chunked_prefill_size",
            "max_running_requests",
            "disable_radix_cache",
            "enable_cache_report",
            "enable_metrics",
            "context_length",
            "served_model_name",
            "model_path",
            "radix_eviction_policy",
            "attention_backend",
            "device",
            "version",
            "max_prefill_tokens",
            "schedule_conservativeness",
            "dtype",
        )
        facts["server_info_top"] = {k: info.get(k, "<absent>") for k in keys}
        internal = info.get("internal_states")
        if isinstance(internal, list) and internal and isinstance(internal[0], dict):
            facts["server_info_internal_states0"] = {
                k: v for k, v in internal[0].items() if not isinstance(v, (dict, list)) or k in ("memory_usage",)
            }
        facts["server_info_where"] = {
            k: [
                loc
                for loc, d in (
                    ("top", info),
                    ("internal_states[0]", (internal or [{}])[0] if isinstance(internal, list) else {}),
                )
                if isinstance(d, dict) and k in d
            ]
            for k in (
                "max_total_num_tokens",
                "page_size",
                "context_length",
                "chunked_prefill_size",
                "max_running_requests",
            )
        }

        # /v1/completions with ids, exactly as the adapter sends it
        prompt = p.ids(200)
        s1, r1, dt1 = p.completion(prompt)
        facts["completion_first"] = {"status": s1, "seconds": round(dt1, 3), "body": shrink(r1)}
        s2, r2, dt2 = p.completion(prompt)
        facts["completion_repeat"] = {
            "status": s2,
            "cached": p.cached(r2),
            "usage": r2.get("usage") if isinstance(r2, dict) else r2,
            "same_output": isinstance(r1, dict)
            and isinstance(r2, dict)
            and r1["choices"][0].get("token_ids") == r2["choices"][0].get("token_ids"),
        }
        # without return_token_ids
        s, r, _ = p.completion(p.ids(50), 4, return_token_ids=False)
        facts["completion_without_return_token_ids"] = {
            "status": s,
            "choice_keys": sorted(r["choices"][0]) if isinstance(r, dict) else r,
        }
        # a text prompt
        s, r, _ = p.completion("w5 w6 w7 w8", 4)
        facts["completion_text_prompt"] = {"status": s, "usage": r.get("usage") if isinstance(r, dict) else r}
        # the model name: a wrong one
        s, r, _ = p.completion(p.ids(20), 2, model="not-the-served-name")
        facts["completion_wrong_model_name"] = {"status": s, "body": shrink(r)}
        # streamed, with usage
        body = {
            "model": served,
            "prompt": p.ids(30),
            "max_tokens": 4,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        }
        st, raw, _ = http("POST", base + "/v1/completions", body)
        chunks = [c[6:] for c in raw.decode().split("\n\n") if c.startswith("data: ")]
        facts["completion_stream"] = {
            "status": st,
            "n_chunks": len(chunks),
            "first": as_json(chunks[0].encode()) if chunks else None,
            "last_two": [as_json(c.encode()) for c in chunks[-2:]],
        }

        # /generate with input_ids
        gp = p.ids(120)
        s, g1, _ = p.generate(gp)
        facts["generate_first"] = {"status": s, "body": shrink(g1)}
        s, g2, _ = p.generate(gp)
        facts["generate_repeat_meta"] = {
            "status": s,
            "cached_tokens": (g2.get("meta_info") or {}).get("cached_tokens") if isinstance(g2, dict) else g2,
        }

        # follow-ups: L0 2000, d 100, delta 550 (the workload's first turns)
        base_prompt = p.ids(2000)
        s, t1, dt = p.completion(base_prompt, 100)
        out_ids = t1["choices"][0]["token_ids"]
        s, t2, dt2 = p.completion(base_prompt + out_ids + p.ids(550), 100)
        facts["follow_up_2000_100_550"] = {
            "turn1_cached": p.cached(t1),
            "turn1_seconds": round(dt, 3),
            "turn2_prompt": t2["usage"]["prompt_tokens"],
            "turn2_cached": p.cached(t2),
            "turn2_seconds": round(dt2, 3),
        }
        # a multi-turn session: 300 + 50 out + 100 new per turn
        sess = p.ids(300)
        turns = []
        for _ in range(4):
            s, r, _ = p.completion(sess, 50)
            turns.append({"prompt": r["usage"]["prompt_tokens"], "cached": p.cached(r)})
            sess = sess + r["choices"][0]["token_ids"] + p.ids(100)
        facts["session_300_50_100"] = turns
        # repeats of several lengths
        facts["repeat_by_length"] = {}
        for n in (1, 2, 31, 32, 33, 64, 65, 100, 1024):
            q = p.ids(n)
            p.completion(q, 1)
            s, r, _ = p.completion(q, 1)
            facts["repeat_by_length"][n] = p.cached(r)

        # context limits
        for n, mt in ((context - 1, 1), (context - 1, 16), (context, 1), (context + 10, 1)):
            s, r, dt = p.completion(p.ids(n), mt)
            facts.setdefault("context", {})[f"{n}+{mt}"] = {
                "status": s,
                "seconds": round(dt, 2),
                "body": shrink(r)
                if s != 200
                else {"usage": r.get("usage"), "n_out": len(r["choices"][0].get("token_ids") or [])},
            }

        # metrics
        status, raw, _ = http("GET", base + "/metrics")
        mn = metric_names(raw.decode()) if status == 200 else {}
        facts["metrics"] = {"status": status, **mn}

        # flush: idle GET, idle POST, POST ?timeout, and while a request runs
        canary = p.ids(1024)
        p.completion(canary, 1)
        s, r, _ = p.completion(canary, 1)
        facts["canary_before"] = p.cached(r)
        for method, path in (("GET", "/flush_cache"), ("POST", "/flush_cache"), ("POST", "/flush_cache?timeout=5")):
            st, raw, dt = http(method, base + path)
            facts.setdefault("flush_idle", {})[f"{method} {path}"] = {
                "status": st,
                "body": raw.decode("utf-8", "replace"),
                "seconds": round(dt, 3),
            }
        s, r, _ = p.completion(canary, 1)
        facts["canary_after"] = p.cached(r)

        def busy(result: dict[str, Any], n_out: int) -> None:
            t0 = time.monotonic()
            s, _r, _ = p.completion(p.ids(1000), n_out, timeout=900)
            result["status"], result["seconds"], result["done_at"] = (
                s,
                round(time.monotonic() - t0, 2),
                time.monotonic(),
            )

        if not skip_slow:
            for method, path in (
                ("GET", "/flush_cache"),
                ("POST", "/flush_cache"),
                ("POST", "/flush_cache?timeout=300"),
            ):
                bg: dict[str, Any] = {}
                th = threading.Thread(target=busy, args=(bg, busy_tokens))
                th.start()
                time.sleep(1.5)
                t0 = time.monotonic()
                st, raw, dt = http(method, base + path, timeout=600)
                t_answer = time.monotonic()
                th.join()
                facts.setdefault("flush_busy", {})[f"{method} {path}"] = {
                    "status": st,
                    "body": raw.decode("utf-8", "replace"),
                    "seconds": round(dt, 2),
                    "request_seconds": bg.get("seconds"),
                    "answered_after_request_done": t_answer >= bg.get("done_at", 0),
                    "answer_minus_request_end_s": round(t_answer - bg.get("done_at", t_answer), 2),
                }
        status, raw, _ = http("GET", base + "/metrics")
        vals = metric_names(raw.decode())["samples"] if status == 200 else {}
        facts["metrics_values_end"] = {
            k: v for k, v in vals.items() if k.startswith("sglang:") and not k.endswith(("_bucket", "_created"))
        }
        return facts
    finally:
        t0 = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=20)
        while time.monotonic() - t0 < 20:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            facts["stop_sigkill"] = True
        facts["stop_seconds"] = round(time.monotonic() - t0, 1)
        log.close()
        out.write_text(json.dumps(facts, indent=1, default=str))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--log", type=Path, required=True)
    ap.add_argument("--cache", type=Path, default=Path(".engine-venv/cache"))
    ap.add_argument(
        "--busy-tokens",
        type=int,
        default=300,
        help="output tokens of the request that keeps the server busy during the flush probes",
    )
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--skip-slow", action="store_true", help="leave out the flush-while-busy probes")
    ap.add_argument("argv", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    argv = a.argv[1:] if a.argv and a.argv[0] == "--" else a.argv
    if not argv:
        ap.error("the server argv after --")
    facts = run(argv, a.out, a.log, a.cache, a.context, a.skip_slow, a.busy_tokens)
    print(json.dumps({k: facts.get(k) for k in ("start", "stop_seconds")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
