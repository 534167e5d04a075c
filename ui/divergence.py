"""Where the samples of one prompt part, without I/O.

The n samples of a prompt share their text until one draws differently. A sample has parted from
every other sample at the first character where it differs from each of them: the longest prefix it
shares with any other sample, when that prefix is shorter than the sample. Until then it is `None`:
while the sample still matches another sample that is still being written (its text a prefix of
this one's, or this one's of it), the other may yet go the same way.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of `a` and `b` (slices compared in C, by halving)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def parting_points(texts: Sequence[str], finished: Sequence[bool]) -> list[int | None]:
    """For each sample, the character offset where it parts from every other sample, or None.

    `finished[i]` says sample i has ended: a finished sample whose text is a prefix of another's has
    parted from it where it ended. One sample alone has no other to part from.
    """
    n = len(texts)
    points: list[int | None] = [None] * n
    if n < 2:
        return points
    # The longest prefix a text shares with any other is shared with a neighbour in sorted order.
    order = sorted(range(n), key=texts.__getitem__)
    longest = [0] * n
    for left, right in itertools.pairwise(order):
        shared = common_prefix(texts[left], texts[right])
        longest[left] = max(longest[left], shared)
        longest[right] = max(longest[right], shared)
    for i, text in enumerate(texts):
        if longest[i] >= len(text):
            continue  # all of it is also another sample's text (so far)
        undecided = any(
            j != i and not finished[j] and text.startswith(texts[j]) for j in range(n)
        )  # another, still running, may yet write what this one did
        if not undecided:
            points[i] = longest[i]
    return points
