"""Kept KV of finished requests, so that an episode's next turn prefills only its new tokens.

A multi-turn episode sends the engine, turn after turn, a prompt that extends the previous request's tokens
(prompt + generated) by an observation and a generation prompt. When a request finishes, the engine *parks*
the KV it computed: positions ``0 .. len(tokens) - 2`` (the last sampled token was never fed to the model).
A later request whose prompt starts with exactly those tokens *takes* the entry: its KV is copied into the
request's slot and only the rest of the prompt is prefilled. The entry is consumed (an episode's turns are
sequential); when that request finishes, the longer context is parked in turn. Episodes whose contexts are
identical (same prompt, same samples) park one entry each, and each takes one.

Memory. Parked KV lives beside the running slots, on the engine's device, bounded by ``max_tokens`` KV
positions in all (a position costs ``2 × layers × H_kv × D`` values). Parking past the bound evicts the
least recently parked entries first (counted in ``evictions``); an evicted episode's next turn prefills its
whole prompt, with the same result. An entry larger than the bound is not kept.

Lookup. Every entry is indexed by its length and a hash of its tokens, chained over blocks of ``block``
tokens: a prompt's block hashes are computed once (O(prompt)), each distinct entry length then costs one
O(block) hash, and a hit is confirmed by comparing the tokens themselves.

Owns: which KV is kept, its bound and lookup. Does not own: the slot buffers (`kv_cache`), when a request
finishes (`local`).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

__all__ = ["ParkedKV", "PrefixStore"]


@dataclass(eq=False)
class ParkedKV:
    """The KV of ``tokens[:length]``: per layer ``keys[i]`` / ``values[i]`` of shape ``(H_kv, length, D)``.

    ``version``: the policy version of the weights in use when the request that computed it finished (its
    positions may come from older versions, as any in-flight KV does)."""

    tokens: list[int]
    length: int
    keys: list[Tensor]
    values: list[Tensor]
    version: int


class PrefixStore:
    """Parked KV entries under a bound of ``max_tokens`` positions (see the module docstring). Not
    thread-safe: the engine loop owns it."""

    def __init__(self, max_tokens: int, block: int = 64) -> None:
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        self.max_tokens = max_tokens
        self.block = block
        self.tokens_held = 0
        self.evictions = 0
        self.evicted_tokens = 0
        self._entries: OrderedDict[int, tuple[tuple[int, int], ParkedKV]] = OrderedDict()  # oldest first
        self._by_key: dict[tuple[int, int], list[int]] = {}  # (length, hash) -> entry serials, oldest first
        self._lengths: dict[int, int] = {}  # entry length -> entries of that length
        self._serials = itertools.count()

    def __len__(self) -> int:
        return len(self._entries)

    def _key(self, chain: Sequence[int], tokens: Sequence[int], length: int) -> tuple[int, int]:
        whole = length // self.block
        return length, hash((chain[whole], tuple(tokens[whole * self.block : length])))

    def _chain(self, tokens: Sequence[int], upto: int) -> list[int]:
        """``chain[j]``: hash of ``tokens[: j * block]`` for ``j = 0 .. upto // block``."""
        chain = [0]
        for start in range(0, upto - upto % self.block, self.block):
            chain.append(hash((chain[-1], tuple(tokens[start : start + self.block]))))
        return chain

    def fits(self, length: int) -> bool:
        """Whether an entry of ``length`` positions can be kept at all (not empty, within the bound)."""
        return 1 <= length <= self.max_tokens

    def park(self, entry: ParkedKV) -> bool:
        """Keep ``entry`` (evicting the oldest entries to stay within the bound). False when it cannot be
        kept (`fits`)."""
        if not self.fits(entry.length):
            return False
        key = self._key(self._chain(entry.tokens, entry.length), entry.tokens, entry.length)
        while self._entries and self.tokens_held + entry.length > self.max_tokens:
            serial, (old_key, evicted) = self._entries.popitem(last=False)
            self._forget(old_key, serial, evicted)
            self.evictions += 1
            self.evicted_tokens += evicted.length
        serial = next(self._serials)
        self._entries[serial] = (key, entry)
        self._by_key.setdefault(key, []).append(serial)
        self.tokens_held += entry.length
        self._lengths[entry.length] = self._lengths.get(entry.length, 0) + 1
        return True

    def take(self, prompt: Sequence[int]) -> ParkedKV | None:
        """Remove and return the longest entry whose tokens start ``prompt`` and leave at least one prompt
        token to feed (``length <= len(prompt) - 1``), or None."""
        limit = len(prompt) - 1
        candidates = sorted((n for n in self._lengths if n <= limit), reverse=True)
        if not candidates:
            return None
        chain = self._chain(prompt, candidates[0])
        for length in candidates:
            key = self._key(chain, prompt, length)
            for serial in self._by_key.get(key, ()):
                _, entry = self._entries[serial]
                if entry.tokens[:length] == list(prompt[:length]):
                    del self._entries[serial]
                    self._forget(key, serial, entry)
                    return entry
        return None

    def _forget(self, key: tuple[int, int], serial: int, entry: ParkedKV) -> None:
        serials = self._by_key[key]
        serials.remove(serial)
        if not serials:
            del self._by_key[key]
        self.tokens_held -= entry.length
        left = self._lengths[entry.length] - 1
        if left:
            self._lengths[entry.length] = left
        else:
            del self._lengths[entry.length]

    def clear(self) -> None:
        """Drop every entry (not counted as evictions)."""
        self._entries.clear()
        self._by_key.clear()
        self._lengths.clear()
        self.tokens_held = 0
