"""`Fields`: the base of the hot path's plain classes, with the equality and repr a dataclass has.

Compiled with mypyc (setup.py). mypyc gives a dataclass the `__init__` the dataclasses module
writes, which runs as interpreted Python: 150-250 ns more for every object made, and the packets
and messages made per message add up. So those classes are plain native classes with their own
`__init__`, and name their fields in `FIELDS`; this base compares and prints them by those names.
Like a dataclass's, they are equal only to an object of the same class with equal fields, and are
not hashable (their fields may change).
"""

from __future__ import annotations

from typing import ClassVar


class Fields:
    """Equality and repr by the fields a subclass names in `FIELDS`, in its `__init__` order."""

    __slots__ = ()

    FIELDS: ClassVar[tuple[str, ...]] = ()

    def field_values(self) -> tuple[object, ...]:
        """The fields' values, in `FIELDS` order."""
        return tuple([getattr(self, name) for name in self.FIELDS])

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, Fields)
        return self.field_values() == other.field_values()

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def __repr__(self) -> str:
        inner = ", ".join([f"{name}={getattr(self, name)!r}" for name in self.FIELDS])
        return f"{type(self).__name__}({inner})"
