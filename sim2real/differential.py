"""Differential runs: one trace through a real engine's own scheduler and through our model, in
lockstep, compared decision by decision.

The real engine is the reference that drives the trace: a follow-up is sent `think` steps after
the *engine* finished the previous turn, and the same request goes to both sides at the same
step. So while the two agree the comparison is exact, and after a disagreement both still see
identical inputs (the disagreement may then propagate; the first divergent step is reported).

Decision kinds (each compared per step, over the steps where either side made such a decision):
  admit    the ordered list of requests admitted this step (new and resumed)
  cached   per request, the cached-prefix length at its first admission
  resume   per resumed request, the tokens found cached when it is recomputed
  order    the batch: which requests ran, in which order, with how many tokens each
  preempt  the ordered list of requests preempted this step
  evict    the multiset of cached blocks (by content digest) evicted this step
  finish   the set of requests that finished this step
  flush    the outcome of each cache-flush attempt
  free     free blocks after the step (vLLM); free slots and evictable cached tokens (SGLang)
           (a state check, every step)
  protected  SGLang: cached tokens locked by running requests (a state check, every step)

On radix engines `evict` compares evicted token counts and `order` also the batch kind (prefill
or decode, SGLang's separate iterations).
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

from sim2real.traces import Trace

KINDS = ("admit", "cached", "resume", "order", "preempt", "evict", "finish", "flush", "free", "protected")


class Side(Protocol):
    def add(self, rid: str, prompt: list[int], max_tokens: int, output: list[int]) -> None: ...
    def step(self) -> dict[str, Any]: ...
    def flush(self) -> bool: ...


@dataclass
class Tally:
    agree: int = 0
    total: int = 0

    def add(self, ok: bool) -> None:
        self.total += 1
        self.agree += int(ok)

    @property
    def rate(self) -> float | None:
        return self.agree / self.total if self.total else None


@dataclass
class TraceResult:
    name: str
    seed: int
    steps: int
    requests: int
    tallies: dict[str, Tally] = field(default_factory=lambda: {k: Tally() for k in KINDS})
    first_divergence: int | None = None
    examples: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=Counter)  # engine-side event counts

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "seed": self.seed,
            "steps": self.steps,
            "requests": self.requests,
            "first_divergence": self.first_divergence,
            "agreement": {k: {"agree": t.agree, "total": t.total, "rate": t.rate} for k, t in self.tallies.items()},
            "engine_events": dict(self.counts),
            "examples": self.examples,
        }


def _ids(pairs: list[list[Any]]) -> list[str]:
    return [p[0] for p in pairs]


def _compare(
    step: int,
    e: dict[str, Any],
    o: dict[str, Any],
    res: TraceResult,
    cached_e: dict[str, int],
    cached_o: dict[str, int],
    max_examples: int,
) -> None:
    checks: dict[str, tuple[Any, Any, bool]] = {}
    adm_e = _ids(e["new"]) + _ids(e["resumed"])
    adm_o = _ids(o["new"]) + _ids(o["resumed"])
    if adm_e or adm_o:
        checks["admit"] = (adm_e, adm_o, adm_e == adm_o)
    for rid, c in e["new"]:
        cached_e.setdefault(rid, c)
    for rid, c in o["new"]:
        cached_o.setdefault(rid, c)
    res_e = dict(map(tuple, e["resumed"]))
    res_o = dict(map(tuple, o["resumed"]))
    for rid in set(res_e) & set(res_o):
        res.tallies["resume"].add(res_e[rid] == res_o[rid])
    if e["batch"] or o["batch"]:
        checks["order"] = (e["batch"], o["batch"], e["batch"] == o["batch"])
    if e["preempted"] or o["preempted"]:
        checks["preempt"] = (e["preempted"], o["preempted"], e["preempted"] == o["preempted"])
    if "evicted_tokens" in e:  # radix engines: evicted token counts (nodes have no block identity)
        if e["evicted_tokens"] or o["evicted_tokens"]:
            checks["evict"] = (e["evicted_tokens"], o["evicted_tokens"], e["evicted_tokens"] == o["evicted_tokens"])
    elif e["evicted"] or o["evicted"]:
        ce, co = Counter(e["evicted"]), Counter(o["evicted"])
        # a block neither side can name ("?") never counts as agreement
        checks["evict"] = (len(e["evicted"]), len(o["evicted"]), ce == co and "?" not in ce)
    if e["finished"] or o["finished"]:
        checks["finish"] = (sorted(e["finished"]), sorted(o["finished"]), set(e["finished"]) == set(o["finished"]))
    if "free_blocks" in e:
        checks["free"] = (e["free_blocks"], o["free_blocks"], e["free_blocks"] == o["free_blocks"])
    else:  # radix engines: free slots and evictable cache (what admission reads), then locked cache
        fe, fo = (e["available"], e["evictable"]), (o["available"], o["evictable"])
        checks["free"] = (fe, fo, fe == fo)
        checks["protected"] = (e["protected"], o["protected"], e["protected"] == o["protected"])
    if "kind" in e and e["kind"] != o["kind"]:
        checks["order"] = ((e["kind"], e["batch"]), (o["kind"], o["batch"]), False)
    bad = {}
    for kind, (a, b, ok) in checks.items():
        res.tallies[kind].add(ok)
        if not ok:
            bad[kind] = {"engine": a, "ours": b}
    if bad:
        if res.first_divergence is None:
            res.first_divergence = step
        if len(res.examples) < max_examples:
            res.examples.append({"step": step, **bad})
    res.counts["admitted"] += len(adm_e)
    res.counts["preempted"] += len(e["preempted"])
    if "evicted_tokens" in e:
        res.counts["evicted_tokens"] += e["evicted_tokens"]
    else:
        res.counts["evicted_blocks"] += len(e["evicted"])
    res.counts["finished"] += len(e["finished"])
    res.counts["chunked_steps"] += sum(1 for _r, n in e["batch"] if n > 1) and 1


def run_trace(trace: Trace, engine: Side, ours: Side, outputs: Any, *, max_examples: int = 8) -> TraceResult:
    """Drive `trace` through both sides. `outputs(prompt, max_tokens)` gives the fake model's ids."""
    spec = trace.spec
    res = TraceResult(spec.name, spec.seed, 0, 0)
    arrivals: list[tuple[int, int, int, list[int]]] = []  # (step, session, turn index, prompt)
    for s in trace.sessions:
        heapq.heappush(arrivals, (s.arrival, s.index, 0, list(s.first_prompt)))
    sessions = {s.index: s for s in trace.sessions}
    inflight: dict[str, tuple[int, int, list[int], list[int]]] = {}
    flushes = set(trace.flush_steps)
    cached_e: dict[str, int] = {}
    cached_o: dict[str, int] = {}
    idle = True
    step = 0
    while step < spec.max_steps:
        if step in flushes:
            fe, fo = engine.flush(), ours.flush()
            res.tallies["flush"].add(fe == fo)
            res.counts["flush_ok"] += int(fe)
            if fe != fo and len(res.examples) < max_examples:
                res.examples.append({"step": step, "flush": {"engine": fe, "ours": fo}})
        while arrivals and arrivals[0][0] <= step:
            _, i, k, prompt = heapq.heappop(arrivals)
            mt = sessions[i].max_tokens[k]
            out = outputs(prompt, mt)
            rid = f"s{i}t{k + 1}"
            engine.add(rid, prompt, mt, out)
            ours.add(rid, prompt, mt, out)
            inflight[rid] = (i, k, prompt, out)
            res.requests += 1
        e = engine.step()
        o = ours.step()
        _compare(step, e, o, res, cached_e, cached_o, max_examples)
        for rid in e["finished"]:
            i, k, prompt, out = inflight.pop(rid)
            s = sessions[i]
            if k + 1 < s.n_turns:
                nxt = list(prompt) if s.repeats[k] else list(prompt) + list(out) + list(s.tools[k])
                heapq.heappush(arrivals, (step + 1 + s.think[k], i, k + 1, nxt))
        step += 1
        idle = not (e["batch"] or o["batch"] or e["waiting"] or e["running"] or o["waiting"] or o["running"])
        if not arrivals and not inflight and idle:
            break
    res.steps = step
    for rid in set(cached_e) | set(cached_o):
        ok = rid in cached_e and rid in cached_o and cached_e[rid] == cached_o[rid]
        res.tallies["cached"].add(ok)
        if not ok and len(res.examples) < max_examples:
            res.examples.append({"request": rid, "cached": {"engine": cached_e.get(rid), "ours": cached_o.get(rid)}})
    if not idle:
        res.examples.append({"step": step, "unfinished": "the trace hit max_steps before both sides were idle"})
    return res


def summarize(results: list[TraceResult]) -> dict[str, Any]:
    """Agreement per decision kind over all traces, and per trace family."""
    total = {k: Tally() for k in KINDS}
    fams: dict[str, dict[str, Tally]] = {}
    for r in results:
        fam = fams.setdefault(r.name, {k: Tally() for k in KINDS})
        for k, t in r.tallies.items():
            for dst in (total[k], fam[k]):
                dst.agree += t.agree
                dst.total += t.total
    return {
        "overall": {k: {"agree": t.agree, "total": t.total, "rate": t.rate} for k, t in total.items()},
        "families": {
            n: {k: {"agree": t.agree, "total": t.total, "rate": t.rate} for k, t in f.items()} for n, f in fams.items()
        },
        "traces": [r.to_json() for r in results],
    }
