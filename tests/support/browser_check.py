"""Open an HTML page in headless Chromium and report what a reader's browser would show: console
errors, uncaught exceptions, failed or network loads, each image's natural size, each chart's
SVG, each table's rows, the local links; and save a full-page screenshot.

Why the DevTools protocol: it is the browser's own account of the page (console messages,
exceptions, every request and its failure), not a guess from the HTML text. Chromium is started
with `--remote-debugging-port=0` and a private profile; the port is read from the
DevToolsActivePort file it writes there, and the protocol is spoken over its websocket with aiohttp
(already a dependency). One page target is attached in flat session mode.

Standalone: python tests/support/browser_check.py PAGE.html [--screenshot OUT.png] [--chromium BIN]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

LOCAL_SCHEMES = ("file:", "data:", "about:", "blob:", "chrome-error:")

# Run in the page after load: everything the checks need, as JSON.
PROBE = r"""
(() => {
  const imgs = [...document.images].map(i => ({src: i.src.slice(0, 40), complete: i.complete,
                                               w: i.naturalWidth, h: i.naturalHeight, alt: i.alt}));
  const charts = [...document.querySelectorAll('[data-chart]')].map(c => {
    const svg = c.querySelector('svg');
    const r = svg ? svg.getBoundingClientRect() : null;
    return {id: c.id, live: c.classList.contains('live'), svg: !!svg,
            paths: svg ? svg.querySelectorAll('path.line').length : 0, w: r ? r.width : 0, h: r ? r.height : 0};
  });
  const svgs = [...document.querySelectorAll('svg.timeline-strip')].map(s => ({
            marks: s.querySelectorAll('circle').length, w: s.getBoundingClientRect().width}));
  const tables = [...document.querySelectorAll('table')].map(t => ({section: (t.closest('section') || {}).id || null,
            cls: t.className, head: t.tHead ? t.tHead.rows.length : 0,
            rows: t.tBodies.length ? [...t.tBodies].reduce((n, b) => n + b.rows.length, 0) : 0}));
  const links = [...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href'));
  const sections = [...document.querySelectorAll('section')].map(s => ({id: s.id, text: s.innerText.length,
            absent: [...s.querySelectorAll('.absent')].map(x => x.innerText)}));
  return JSON.stringify({title: document.title, imgs, charts, svgs, tables, links, sections,
                         height: document.documentElement.scrollHeight, width: document.documentElement.scrollWidth});
})()
"""


@dataclass
class PageCheck:
    """What the browser saw."""

    url: str
    errors: list[str] = field(default_factory=list)  # console errors, exceptions, error log entries
    failed: list[str] = field(default_factory=list)  # requests that failed or answered >= 400
    network: list[str] = field(default_factory=list)  # requests that would leave the machine
    probe: dict[str, Any] = field(default_factory=dict)
    zoom: dict[str, Any] | None = None
    screenshot: Path | None = None

    @property
    def problems(self) -> list[str]:
        out = [f"console/exception: {e}" for e in self.errors] + [f"failed load: {f}" for f in self.failed]
        out += [f"network fetch: {n}" for n in self.network]
        return out


def find_chromium() -> str | None:
    env = os.environ.get("AGENTLOAD_CHROMIUM")
    if env and Path(env).is_file():
        return env
    for name in ("chromium", "chromium-browser", "google-chrome-stable", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


class _CDP:
    """A minimal DevTools protocol client: numbered commands, events into a list."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.n = 0
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.waiters: list[tuple[str, asyncio.Future[Any]]] = []
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            d = json.loads(msg.data)
            if "id" in d and d["id"] in self.pending:
                fut = self.pending.pop(d["id"])
                if "error" in d:
                    fut.set_exception(RuntimeError(f"DevTools error: {d['error']}"))
                else:
                    fut.set_result(d.get("result", {}))
            elif "method" in d:
                self.events.append(d)
                for name, fut in list(self.waiters):
                    if name == d["method"] and not fut.done():
                        fut.set_result(d)
                        self.waiters.remove((name, fut))

    async def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None, timeout: float = 30.0
    ) -> Any:
        self.n += 1
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[self.n] = fut
        msg: dict[str, Any] = {"id": self.n, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        await self.ws.send_str(json.dumps(msg))
        return await asyncio.wait_for(fut, timeout)

    def wait_for(self, method: str) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiters.append((method, fut))
        return fut


def _launch(chromium: str, profile: Path) -> subprocess.Popen[bytes]:
    args = [
        chromium,
        "--headless=new",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-features=Translate,MediaRouter,OptimizationHints",
        "--remote-debugging-port=0",
        "--remote-allow-origins=*",
        f"--user-data-dir={profile}",
        "--window-size=1400,1000",
        "about:blank",
    ]
    if os.geteuid() == 0:
        args.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


async def _endpoint(profile: Path, proc: subprocess.Popen[bytes], timeout: float) -> str:
    port_file = profile / "DevToolsActivePort"
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise RuntimeError(f"chromium exited with {proc.returncode} before it listened: {err[-2000:]}")
        if port_file.is_file():
            lines = port_file.read_text().split()
            if len(lines) >= 2:
                return f"ws://127.0.0.1:{lines[0]}{lines[1]}"
        await asyncio.sleep(0.1)
    raise RuntimeError(f"chromium did not write {port_file} within {timeout:g} s")


def _describe(ev: dict[str, Any]) -> str | None:
    m, p = ev["method"], ev.get("params", {})
    if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
        return (
            "console."
            + p["type"]
            + ": "
            + " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
        )
    if m == "Runtime.exceptionThrown":
        d = p.get("exceptionDetails", {})
        return (
            f"uncaught {d.get('exception', {}).get('description') or d.get('text')} "
            f"at {d.get('url')}:{d.get('lineNumber')}"
        )
    if m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
        e = p["entry"]
        return f"{e.get('source')}: {e.get('text')} {e.get('url') or ''}".strip()
    return None


async def _check(url: str, chromium: str, screenshot: Path | None, zoom: bool, timeout: float) -> PageCheck:
    res = PageCheck(url)
    profile = Path(tempfile.mkdtemp(prefix="agentload-chromium-"))
    proc = _launch(chromium, profile)
    try:
        ws_url = await _endpoint(profile, proc, timeout)
        async with aiohttp.ClientSession() as http, http.ws_connect(ws_url, max_msg_size=0) as ws:
            cdp = _CDP(ws)
            target = (await cdp.send("Target.createTarget", {"url": "about:blank"}))["targetId"]
            sid = (await cdp.send("Target.attachToTarget", {"targetId": target, "flatten": True}))["sessionId"]
            for dom in ("Runtime", "Log", "Network", "Page"):
                await cdp.send(f"{dom}.enable", session=sid)
            await cdp.send(
                "Emulation.setDeviceMetricsOverride",
                {"width": 1400, "height": 1000, "deviceScaleFactor": 1, "mobile": False},
                session=sid,
            )
            loaded = cdp.wait_for("Page.loadEventFired")
            nav = await cdp.send("Page.navigate", {"url": url}, session=sid)
            if nav.get("errorText"):
                res.failed.append(f"{url}: {nav['errorText']}")
            await asyncio.wait_for(loaded, timeout)
            # two animation frames: the charts draw on DOMContentLoaded, layout settles after
            await cdp.send(
                "Runtime.evaluate",
                {
                    "expression": "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(1))))",
                    "awaitPromise": True,
                },
                session=sid,
            )
            probe = await cdp.send("Runtime.evaluate", {"expression": PROBE, "returnByValue": True}, session=sid)
            res.probe = json.loads(probe["result"]["value"])
            if zoom and res.probe["charts"]:
                res.zoom = await _drag_zoom(cdp, sid)
            if screenshot is not None:
                h = min(int(res.probe["height"]) + 10, 30000)
                await cdp.send(
                    "Emulation.setDeviceMetricsOverride",
                    {"width": 1400, "height": h, "deviceScaleFactor": 1, "mobile": False},
                    session=sid,
                )
                await asyncio.sleep(0.3)
                shot = await cdp.send(
                    "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=sid, timeout=120
                )
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                screenshot.write_bytes(base64.b64decode(shot["data"]))
                res.screenshot = screenshot
            await asyncio.sleep(0.2)  # late console messages
            for ev in cdp.events:
                d = _describe(ev)
                if d:
                    res.errors.append(d)
                p = ev.get("params", {})
                if ev["method"] == "Network.requestWillBeSent":
                    u = p.get("request", {}).get("url", "")
                    if not u.startswith(LOCAL_SCHEMES):
                        res.network.append(u)
                elif ev["method"] == "Network.loadingFailed":
                    res.failed.append(f"{p.get('errorText')} ({p.get('type')}, request {p.get('requestId')})")
                elif (
                    ev["method"] == "Network.responseReceived" and int(p.get("response", {}).get("status") or 0) >= 400
                ):
                    res.failed.append(f"{p['response'].get('status')} {p['response'].get('url')}")
            with contextlib.suppress(Exception):
                await cdp.send("Browser.close", timeout=5)
            cdp.reader.cancel()
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 15)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait(10)
        shutil.rmtree(profile, ignore_errors=True)
    return res


async def _drag_zoom(cdp: _CDP, sid: str) -> dict[str, Any]:
    """Drag across the first chart's top panel as a user would; report the x-range before and after."""
    box = await cdp.send(
        "Runtime.evaluate",
        {
            "expression": """(() => { const c = document.querySelector('[data-chart]');
        c.scrollIntoView({block: 'center'}); const r = c.querySelector('rect.hit').getBoundingClientRect();
        return JSON.stringify({x: r.left, y: r.top, w: r.width, h: r.height, x0: c.chart.x0, x1: c.chart.x1}); })()""",
            "returnByValue": True,
        },
        session=sid,
    )
    b = json.loads(box["result"]["value"])
    y = b["y"] + b["h"] / 2
    xa, xb = b["x"] + 0.25 * b["w"], b["x"] + 0.5 * b["w"]
    await cdp.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": xa, "y": y}, session=sid)
    await cdp.send(
        "Input.dispatchMouseEvent",
        {"type": "mousePressed", "x": xa, "y": y, "button": "left", "clickCount": 1},
        session=sid,
    )
    for k in range(1, 6):
        await cdp.send(
            "Input.dispatchMouseEvent",
            {"type": "mouseMoved", "x": xa + (xb - xa) * k / 5, "y": y, "button": "left", "buttons": 1},
            session=sid,
        )
    await cdp.send(
        "Input.dispatchMouseEvent",
        {"type": "mouseReleased", "x": xb, "y": y, "button": "left", "clickCount": 1},
        session=sid,
    )
    # hover on a drawn point of the zoomed chart: the tooltip must name the run and the value
    pt = await cdp.send(
        "Runtime.evaluate",
        {
            "expression": """(() => { const c = document.querySelector('[data-chart]');
        const p = c.querySelector('path.line'); const s = c.querySelector('svg').getBoundingClientRect();
        const q = p.getPointAtLength(p.getTotalLength() / 2);
        return JSON.stringify({x: s.left + q.x, y: s.top + q.y}); })()""",
            "returnByValue": True,
        },
        session=sid,
    )
    q = json.loads(pt["result"]["value"])
    await cdp.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": q["x"], "y": q["y"]}, session=sid)
    after = await cdp.send(
        "Runtime.evaluate",
        {
            "expression": """(() => { const c = document.querySelector('[data-chart]');
        const t = c.querySelector('.tip');
        return JSON.stringify({x0: c.chart.x0, x1: c.chart.x1,
                               tip: t.style.display === 'block' ? t.textContent : null}); })()""",
            "returnByValue": True,
        },
        session=sid,
    )
    a = json.loads(after["result"]["value"])
    await cdp.send(
        "Input.dispatchMouseEvent", {"type": "mouseMoved", "x": 1, "y": 1}, session=sid
    )  # leave: the tooltip hides
    await cdp.send(
        "Runtime.evaluate",
        {"expression": "document.querySelector('[data-chart]').chart.zoom(0, 1e12); window.scrollTo(0, 0)"},
        session=sid,
    )
    return {"before": [b["x0"], b["x1"]], "after": [a["x0"], a["x1"]], "tip": a["tip"]}


def check_page(
    page: str | Path,
    *,
    screenshot: str | Path | None = None,
    chromium: str | None = None,
    zoom: bool = True,
    timeout: float = 60.0,
) -> PageCheck:
    """Open `page` (a local file) in headless Chromium and report what it saw."""
    bin_ = chromium or find_chromium()
    if bin_ is None:
        raise FileNotFoundError("no Chromium: install it with scripts/setup-chromium.sh, or set AGENTLOAD_CHROMIUM")
    url = Path(page).resolve().as_uri()
    return asyncio.run(_check(url, bin_, Path(screenshot) if screenshot else None, zoom, timeout))


def artifact_dir() -> Path:
    """Where the browser tests leave their screenshots: $AGENTLOAD_ARTIFACTS, else results/browser/."""
    env = os.environ.get("AGENTLOAD_ARTIFACTS")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "results" / "browser"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("page")
    ap.add_argument("--screenshot")
    ap.add_argument("--chromium")
    a = ap.parse_args(argv)
    res = check_page(a.page, screenshot=a.screenshot, chromium=a.chromium)
    print(
        json.dumps(
            {"problems": res.problems, "zoom": res.zoom, "screenshot": str(res.screenshot), **res.probe}, indent=1
        )[:20000]
    )
    return 1 if res.problems else 0


if __name__ == "__main__":
    sys.exit(main())
