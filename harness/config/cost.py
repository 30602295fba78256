"""Iteration-cost model of a continuous-batching engine (paper App. E.9, "Cost model and server").

One implementation serves the engine model (which charges every iteration with it) and the theory
layer (which builds model F's turn costs and the entry model from it), so that a change of
parameters moves both together. The parameters were fitted to SGLang server-log batch timings on an
A100; other GPUs get one uniform speed factor, and the vLLM flavour one factor on the
token-proportional terms only. Parameters live in cell YAML files, never here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class CostModel:
    """Calibrated iteration costs, in seconds.

    a            fixed launch overhead of one iteration
    f0           floor of the linear (per-token) part
    b            seconds per token processed in an iteration (MLP/projection work)
    c_p          seconds per causal attention pair during prefill
    chunk        prefill chunk budget B_c (tokens per iteration)
    c_d          decode attention cost per request per 8192 tokens of context
    speed        uniform GPU speed factor: every cost is divided by it
    token_factor multiplies only the token-proportional terms (b, c_p, c_d); the vLLM flavour's knob
    c_r          per request, charged once, in the iteration that first admits it: the server's own
                 work for one request outside the forward pass (the HTTP front end taking it in and
                 answering it, the engine core creating it). On a GPU it runs beside the GPU and costs
                 the batch nothing (0, the default); on a CPU engine under a quota the front end and
                 the engine core draw on one CPU budget, so each request's share delays the
                 iterations around it (docs/sim2real.md section 2)
    d_r          seconds each response spends in the server after the engine finished the request,
                 taking none of the engine's time: the front end's path out, and on a quota'd CPU the
                 wait for the quota's next period. Not an iteration cost: the virtual-time driver
                 hands each response to the client d_r after the engine finished it (0: at once)
    """

    a: float = 9.24e-3
    f0: float = 1.26e-3
    b: float = 62.6e-6
    c_p: float = 2.24e-9
    chunk: int = 8192
    c_d: float = 0.31e-3
    speed: float = 1.0
    token_factor: float = 1.0
    c_r: float = 0.0
    d_r: float = 0.0

    def __post_init__(self) -> None:
        for name in ("a", "f0", "b", "c_p", "c_d", "speed", "token_factor", "c_r", "d_r"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"cost model: {name} must be >= 0, got {getattr(self, name)!r}")
        if self.speed <= 0:
            raise ValueError(f"cost model: speed must be > 0, got {self.speed!r}")
        if self.chunk < 1:
            raise ValueError(f"cost model: chunk must be >= 1, got {self.chunk!r}")

    # -- per-request closed forms (theory, App. E.9) -------------------------------------------
    def prefill_time(self, x: float, y: float = 0.0) -> float:
        """GPU time to prefill x new tokens on a cached prefix of y tokens, as one request alone.

        t_P(x, y) = a*max(1, x/B_c) + max(f0, b*x) + c_p*x*(y + (x+1)/2) + c_r, all divided by speed.
        The a*max(1, x/B_c) term charges one launch per chunk of the chunked prefill; c_r is the
        request's own per-request cost (charged where it is admitted).
        """
        tf = self.token_factor
        t = (
            self.a * max(1.0, x / self.chunk)
            + max(self.f0, tf * self.b * x)
            + tf * self.c_p * x * (y + (x + 1.0) / 2.0)
            + self.c_r
        )
        return t / self.speed

    def decode_att(self, mean_context: float) -> float:
        """Per-request decode attention cost b_att = c_d * ybar / 8192 (seconds per request)."""
        return self.token_factor * self.c_d * mean_context / 8192.0

    def decode_time(self, running: float, mean_context: float) -> float:
        """One decode iteration over `running` requests of mean context `mean_context`.

        tau_D(R) = a + max(f0, b*R) + b_att*R, divided by speed.
        """
        tf = self.token_factor
        t = self.a + max(self.f0, tf * self.b * running) + self.decode_att(mean_context) * running
        return t / self.speed

    # -- batched iterations (engine model) ------------------------------------------------------
    def prefill_iteration(self, new_tokens: int, pairs: float, requests: float = 0) -> float:
        """One prefill iteration over chunks totalling `new_tokens`, with `pairs` causal pairs, that
        admits `requests` requests for the first time.

        The engine sums x_i*(y_i + (x_i+1)/2) over the chunks of the batch into `pairs`, so one
        iteration pays one launch overhead; a single request's chunks over successive iterations
        reproduce prefill_time's a*ceil(x/B_c) + ... to within the chunk rounding.
        """
        tf = self.token_factor
        t = self.a + max(self.f0, tf * self.b * new_tokens) + tf * self.c_p * pairs + self.c_r * requests
        return t / self.speed

    def mixed_iteration(
        self, new_tokens: float, pairs: float, decoding: float, decode_context: float, requests: float = 0
    ) -> float:
        """One mixed iteration (vLLM flavour): prefill chunks and one decode token per running request
        share a single launch and a single token budget.

        decode_context is the summed context of the decoding requests (so attention cost is exact
        per request rather than through a mean); `requests` are the requests the iteration admits
        for the first time (each pays c_r once).
        The counts are floats: the fluid model (analysis/theory/entry.py) costs a mean iteration.
        """
        tf = self.token_factor
        tokens = new_tokens + decoding
        t = (
            self.a
            + max(self.f0, tf * self.b * tokens)
            + tf * self.c_p * pairs
            + tf * self.c_d * decode_context / 8192.0
            + self.c_r * requests
        )
        return t / self.speed

    def mixed_decode_ends(
        self, now: float, decoding: int, context_sum: int, max_iters: int, horizon: float
    ) -> list[float]:
        """End times of consecutive decode-only mixed iterations (vLLM flavour) from `now`: iteration
        j costs mixed_iteration(0, 0.0, decoding, float(context_sum + j*decoding)) and each end is
        the previous end plus that cost; taken while they end *before* `horizon`, at most max_iters.

        Why not a loop over mixed_iteration: a healthy vLLM run plans hundreds of thousands of these
        steps, and the method call was a fifth of the fused planner's time. The arithmetic is
        mixed_iteration's own, term by term in its order (the zero prefill and admission terms
        included), so every end is the same float stepping gives (test_cost_model checks it bit
        for bit)."""
        tf = self.token_factor
        head = self.a + max(self.f0, tf * self.b * decoding) + tf * self.c_p * 0.0
        kd = tf * self.c_d
        tail = self.c_r * 0
        speed = self.speed
        ends: list[float] = []
        end = now
        ctx = context_sum
        for _ in range(max_iters):
            nxt = end + (head + kd * float(ctx) / 8192.0 + tail) / speed
            if not nxt < horizon:
                break
            ends.append(nxt)
            end = nxt
            ctx += decoding
        return ends

    def decode_run(self, running: int, context_sum: float, max_iters: int, budget: float) -> tuple[int, float]:
        """Fuse consecutive decode iterations over a fixed set of `running` requests.

        Iteration j (0-based) costs decode_time(running, (context_sum + j*running)/running): every
        request's context grows by one token per iteration. Iterations are taken while they *start*
        before `budget` seconds have passed (the first always), up to `max_iters`; returns
        (iterations, total seconds). An event-driven simulator uses this to skip per-iteration events
        while nothing but the contexts changes, and gets the same iteration boundaries as stepping.
        """
        tf = self.token_factor
        base = (self.a + max(self.f0, tf * self.b * running)) / self.speed
        per_ctx = tf * self.c_d / 8192.0 / self.speed
        step_ctx = per_ctx * running
        t = base + per_ctx * context_sum
        total = t
        k = 1
        while k < max_iters and total < budget:
            t += step_ctx
            total += t
            k += 1
        return k, total

    def scaled(self, speed: float | None = None, token_factor: float | None = None) -> CostModel:
        """A copy with another speed or token factor (e.g. to fit one factor to a measured all-miss rate)."""
        return replace(
            self,
            speed=self.speed if speed is None else speed,
            token_factor=self.token_factor if token_factor is None else token_factor,
        )


def causal_pairs(x: int, y: int) -> float:
    """Causal attention pairs of x new tokens after a cached prefix of y: x*(y + (x+1)/2)."""
    return x * (y + (x + 1.0) / 2.0)
