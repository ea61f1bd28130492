"""In-memory indexes of the file-log store: per-queue offset index and the recent-record cache."""

from __future__ import annotations

from array import array
from typing import Final

from bridge.storage.base import Message

_append: Final = array.append
"""`array.append`, read once: compiled, `a.append(x)` looks the method up on every call."""
HOLE: Final = -1
"""`seq` of an offset whose record was lost to corruption (read reports it as `lost`)."""

_COMPACT_MIN = 4096
_EVICT_AHEAD: Final = 32
"""A full record cache evicts 1/32 of its entry bound at a time (32 of 1,024)."""


class QueueIndex:
    """Dense offsets of one queue: for each offset the record's seq, frame length and size.

    Array slot `i` holds offset `base + i`; slots below `head` were trimmed by retention and are
    dropped lazily. `cum[i]` is the running total of message sizes up to slot `i` inclusive, so
    the bytes of any suffix are one subtraction. Offsets from `durable` to `end` are assigned
    to records not yet durable; readers see offsets below `visible`, which is `durable` or, for
    records that may be read early (`FileLogStore.submit`'s `early`), beyond it.
    """

    __slots__ = ("base", "cum", "cum_base", "durable", "head", "lens", "seqs", "total", "visible")

    def __init__(self, base: int = 0) -> None:
        self.base = base
        self.head = 0
        self.visible = base
        self.durable = base
        self.seqs = array("q")
        self.lens = array("q")
        self.cum = array("q")
        self.cum_base = 0
        self.total = 0
        """The last entry of `cum` (`cum_base` when empty): kept, not read back per append."""

    @property
    def first(self) -> int:
        """The first retained offset."""
        return self.base + self.head

    @property
    def end(self) -> int:
        """The offset the next appended message gets (durable or not)."""
        return self.base + len(self.seqs)

    def add(self, seq: int, length: int, size: int) -> None:
        _append(self.seqs, seq)
        _append(self.lens, length)
        self.total += size
        _append(self.cum, self.total)

    def add_holes(self, count: int) -> None:
        for _ in range(count):
            self.add(HOLE, 0, 0)

    def reset(self, end: int) -> None:
        """Drop everything; the queue continues at `end`."""
        self.base = end
        self.head = 0
        self.visible = end
        self.durable = end
        self.seqs = array("q")
        self.lens = array("q")
        self.cum = array("q")
        self.cum_base = 0
        self.total = 0

    def pop(self) -> None:
        """Remove the newest entry, not yet visible (rollback of an append whose write failed)."""
        self.seqs.pop()
        self.lens.pop()
        self.cum.pop()
        self.total = self.cum[-1] if self.cum else self.cum_base

    def entry(self, offset: int) -> tuple[int, int, int]:
        """(seq, frame length, size) of a retained offset."""
        i = offset - self.base
        before = self.cum[i - 1] if i > 0 else self.cum_base
        return self.seqs[i], self.lens[i], self.cum[i] - before

    def seq_from(self, offset: int) -> int:
        """The seq of the first record at or after `offset` that is still here (not deleted
        by retention nor lost to corruption); HOLE if there is none."""
        seqs = self.seqs
        i = max(offset - self.base, self.head)
        n = len(seqs)
        while i < n and seqs[i] == HOLE:
            i += 1
        return seqs[i] if i < n else HOLE

    def backlog(self, offset: int) -> tuple[int, int]:
        """(messages, bytes) visible at or after `offset`."""
        first = self.base + self.head
        end = self.visible
        if offset < first:
            offset = first
        if offset >= end:
            return 0, 0
        cum = self.cum
        i = offset - self.base
        before = cum[i - 1] if i > 0 else self.cum_base
        return end - offset, cum[end - self.base - 1] - before

    def trim_below(self, seq_limit: int) -> None:
        """Drop the oldest entries whose record lies below `seq_limit` (deleted segments)."""
        seqs = self.seqs
        head = self.head
        n = self.durable - self.base
        while head < n and seqs[head] < seq_limit:
            head += 1
        self.head = head
        if head and (head == len(seqs) or (head >= _COMPACT_MIN and 2 * head >= n)):
            self.cum_base = self.cum[head - 1]
            del seqs[:head]
            del self.lens[:head]
            del self.cum[:head]
            self.base += head
            self.head = 0


CacheEntry = tuple[Message, tuple[str, ...], int]


class RecordCache:
    """Recently appended records by seq, oldest evicted first, bounded by frame bytes.

    Records not yet durable (seq >= `pinned_from`) are never evicted: subscribers read them as
    soon as they become durable, the hot path.

    The order of eviction is two lists (seqs and frame lengths, in the order added) read from
    `_head`, not a deque of tuples: compiled code appends to and indexes a list natively, while
    a deque is a call through the interpreter, and a tuple per record is one more object. The
    evicted front is cut off once it is most of the lists.
    """

    __slots__ = ("_head", "_lens", "_seqs", "budget", "bytes", "entries", "max_entries")

    def __init__(self, budget: int, max_entries: int = 1_024) -> None:
        self.budget = budget
        self.max_entries = max_entries
        """Also bounded in entries: every entry is a few objects the garbage collector scans and
        that pin the allocator's arenas. A reader with room in its window reads a record the
        loop turn it becomes durable; the cache serves it and one that lags by up to ~1,000
        messages (50 ms at 20,000 msg/s); one further behind reads the log (the page cache).
        More entries cost memory and serve no more readers: 20,000 entries keep ~15 MiB
        resident after every burst of 100-byte messages and 4,096 keep 3 MiB; with 1,024 the
        node's RSS after single_node.py's runs is 39.4 MiB rather than 42.5 MiB (4,096), at the
        same throughput."""
        self.bytes = 0
        self.entries: dict[int, CacheEntry] = {}
        self._seqs: list[int] = []
        self._lens: list[int] = []
        self._head = 0

    def get(self, seq: int) -> CacheEntry | None:
        return self.entries.get(seq)

    def add(self, seq: int, length: int, entry: CacheEntry, pinned_from: int) -> None:
        self.entries[seq] = entry
        self._seqs.append(seq)
        self._lens.append(length)
        self.bytes += length
        if self.bytes > self.budget or len(self.entries) > self.max_entries:
            self.evict(pinned_from, self.max_entries // _EVICT_AHEAD)

    def evict(self, pinned_from: int, ahead: int = 0) -> None:
        """Evict the oldest records not pinned until within the bounds, and `ahead` entries
        more (a full cache evicts a few at a time, not one per record added)."""
        seqs = self._seqs
        lens = self._lens
        entries = self.entries
        head = self._head
        end = len(seqs)
        max_entries = self.max_entries - ahead
        while (
            (self.bytes > self.budget or len(entries) > max_entries)
            and head < end
            and seqs[head] < pinned_from
        ):
            del entries[seqs[head]]
            self.bytes -= lens[head]
            head += 1
        self._move_head(head)

    def _move_head(self, head: int) -> None:
        """Everything before `head` is evicted; the lists lose that front once it is most of
        them."""
        if head >= _COMPACT_MIN and 2 * head >= len(self._seqs):
            del self._seqs[:head]
            del self._lens[:head]
            head = 0
        self._head = head

    def drop_from(self, seq: int) -> None:
        """Forget records at or after `seq` (rollback)."""
        seqs = self._seqs
        lens = self._lens
        while len(seqs) > self._head and seqs[-1] >= seq:
            self.entries.pop(seqs.pop(), None)
            self.bytes -= lens.pop()

    def drop_below(self, seq: int) -> None:
        """Forget records below `seq` (retention)."""
        seqs = self._seqs
        head = self._head
        while head < len(seqs) and seqs[head] < seq:
            self.entries.pop(seqs[head], None)
            self.bytes -= self._lens[head]
            head += 1
        self._move_head(head)
