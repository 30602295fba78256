"""SGLang's prefill admission arithmetic (PrefillAdder / PrefillBudget of SGLang 0.5.22), as pure
functions the SGLang flavour (harness/refengine/sglang.py) calls while it forms a prefill round.

Kept apart from the engine because it follows one engine's code line by line (checked decision by
decision against it by sim2real/): the per-request decode reservation and its clip, the page
rounding of what a round admits, and the ignore_eos replay that decides admission when the radix
cache is off (add_one_req_ignore_eos).
"""

from __future__ import annotations

from harness.refengine.base import CLIP_MAX_NEW

__all__ = ["CLIP_MAX_NEW", "IGNORE_EOS_RESERVE", "ceil_page", "insert_eos_state", "replay_fits"]

IGNORE_EOS_RESERVE = 1  # IGNORE_EOS_RESERVE_TOKENS: slack per running request in the ignore_eos replay


def ceil_page(n: int, page: int) -> int:
    """n tokens rounded up to whole pages (what a round charges for a chunk)."""
    return -(-n // page) * page


def insert_eos_state(states: list[tuple[int, int]], cand: tuple[int, int]) -> None:
    """SGLang's insertion of a candidate (tokens left, tokens held) into the replay's states, kept
    sorted by tokens left: before the first state with as much left; if none has, before the last
    state (SGLang's loop leaves its index there), or first into an empty list."""
    i = 0
    for i in range(len(states)):
        if cand[0] <= states[i][0]:
            break
    states.insert(i, cand)


def replay_fits(states: list[tuple[int, int]], free_now: int) -> bool:
    """The ignore_eos replay: requests finish in order of the tokens they still decode (`states`
    sorted by it), each then freeing what it holds; admission fits if the pool, starting from
    `free_now` free tokens, never runs below one token per running request on the way."""
    freed = 0
    n = len(states)
    for i, (left, occupied) in enumerate(states):
        bs = n - i
        if free_now + freed - left * bs <= IGNORE_EOS_RESERVE * bs:
            return False
        freed += occupied
    return True
