"""Card numbers as hypothesis writes them: any 12 to 19 digits completed with their Luhn check
digit (computed here, not by the code under test), written plain or in groups split by spaces
or dashes, and the text that may stand beside one (no digit right beside it: then its digits
would be part of a longer number, which is not one)."""

from __future__ import annotations

import re
from itertools import pairwise

from hypothesis import strategies as st

_DOUBLED = [0, 2, 4, 6, 8, 1, 3, 5, 7, 9]


def with_check_digit(payload: str) -> str:
    """`payload` followed by the digit that makes it Luhn-valid (computed here, not by the
    code under test)."""
    total = sum(
        _DOUBLED[int(ch)] if i % 2 == 0 else int(ch) for i, ch in enumerate(reversed(payload))
    )
    return payload + str((10 - total % 10) % 10)


card_digits = (
    st.integers(min_value=11, max_value=18)
    .flatmap(lambda n: st.text("0123456789", min_size=n, max_size=n))
    .map(with_check_digit)
)


@st.composite
def written(draw: st.DrawFn, digits: str) -> str:
    """`digits` as a sender might write them: plain, or in groups split by spaces or dashes."""
    sep = draw(st.sampled_from(["", " ", "-"]))
    if not sep:
        return digits
    cuts = sorted(draw(st.sets(st.integers(1, len(digits) - 1), max_size=len(digits) - 1)))
    bounds = [0, *cuts, len(digits)]
    return sep.join(digits[a:b] for a, b in pairwise(bounds))


_DIGIT_AT_END = re.compile(r"\d\Z")
_DIGIT_AT_START = re.compile(r"\A\d")
# Beside a digit, a card number's digits are part of a longer number (which is not one).
prefixes = st.text(max_size=12).filter(lambda s: not _DIGIT_AT_END.search(s))
suffixes = st.text(max_size=12).filter(lambda s: not _DIGIT_AT_START.search(s))


def inside_hex(prefix: str, suffix: str) -> bool:
    """Whether a card number between these sits inside a hex id, which what is shown leaves
    as it is (a trace id holds such runs by chance): a hex letter beside it, no other."""
    letters = [c for c in (prefix[-1:], suffix[:1]) if c.isalpha()]
    return bool(letters) and all(c in "abcdefABCDEF" for c in letters)


# What is shown masks a card number anywhere but inside a hex id.
shown_sides = st.tuples(prefixes, suffixes).filter(lambda sides: not inside_hex(*sides))


def in_clear(digits: str, text: str) -> int:
    """How often `digits` show in `text`, in any grouping (spaces and dashes dropped)."""
    return re.sub(r"[ -]", "", text).count(digits)
