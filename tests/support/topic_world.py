"""A finite universe of topics and a hypothesis strategy of filters over it, for property tests
that check a filter or rule decision against brute force over every topic it can match."""

from __future__ import annotations

import itertools

from hypothesis import strategies as st

LEVELS = ["a", "b", "$x", ""]
"""Topic levels the filters are made of: a `$` level and an empty one among them."""
WORLD = [
    "/".join(parts)
    for depth in range(1, 5)
    for parts in itertools.product([*LEVELS, "z"], repeat=depth)
]
"""Every topic of up to four levels of `LEVELS` plus "z" (a level no filter names)."""

level = st.sampled_from(LEVELS)


@st.composite
def filters(draw: st.DrawFn) -> str:
    """A topic filter over `LEVELS`, with `+` levels and sometimes a trailing `#`."""
    parts = draw(st.lists(st.one_of(level, st.just("+")), min_size=1, max_size=3))
    if draw(st.booleans()):
        parts.append("#")
    return "/".join(parts)
