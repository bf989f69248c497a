"""Which shard of a sharded run a rollout belongs to: pure, and the same on
every machine.

`--evalreplay-shard=K/N` runs shard K of N. A rollout's shard is a blake2b
hash of its task name, stage, instance id and rollout index, modulo N: it
depends on nothing else (not collection order, not the other instances, not
Python's per-process salted `hash()`), so adding instances moves no existing
rollout and every machine computes the same split. Hashing each rollout (not
each instance) keeps the shards balanced when instances have many rollouts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

RolloutKey = tuple[int, str, int]  # (stage, instance_id, rollout), as journal.RolloutKey


@dataclass(frozen=True)
class Shard:
    """Shard `index` (1-based) of `count`."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not 1 <= self.index <= self.count:
            raise ValueError(f"shard K/N needs 1 <= K <= N, got {self.index}/{self.count}")

    def owns(self, task: str, key: RolloutKey) -> bool:
        return shard_of(task, key, self.count) == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def shard_of(task: str, key: RolloutKey, count: int) -> int:
    """The shard (1..count) of one rollout of a task."""
    stage, instance_id, rollout = key
    data = f"{task}\x00{stage}\x00{instance_id}\x00{rollout}".encode("utf-8", "surrogatepass")
    h = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")
    return h % count + 1


def parse_shard(text: str) -> Shard:
    """`K/N` (1 <= K <= N) as a `Shard`; ValueError saying what it takes."""
    k, sep, n = str(text).strip().partition("/")
    try:
        if not sep:
            raise ValueError
        return Shard(int(k), int(n))
    except ValueError:
        raise ValueError(
            f"takes K/N, shard K (1-based) of N with 1 <= K <= N (e.g. 2/4), got {text!r}"
        ) from None
