"""Where samples part: the offset of each sample's first difference from every other sample."""

from __future__ import annotations

import os
import random

from ui.divergence import common_prefix, parting_points


def brute_force(texts: list[str], finished: list[bool]) -> list[int | None]:
    points: list[int | None] = []
    for i, text in enumerate(texts):
        shared = [
            next(
                (k for k, (x, y) in enumerate(zip(text, other, strict=False)) if x != y),
                min(len(text), len(other)),
            )
            for j, other in enumerate(texts)
            if j != i
        ]
        longest = max(shared, default=len(text))
        running_prefix = any(j != i and not finished[j] and text.startswith(t) for j, t in enumerate(texts))
        points.append(None if not shared or longest >= len(text) or running_prefix else longest)
    return points


def test_each_sample_parts_where_it_first_differs_from_all_others() -> None:
    texts = ["The sky is blue today.", "The sky is grey today.", "The sea is calm.", "The sky is blue now."]
    done = [True] * 4
    # "The sky is blue " is shared by 0 and 3: each parts at "t"/"n" (offset 16); 1 parts at "g"
    # (11), the sea at "e" (5).
    assert parting_points(texts, done) == [16, 11, 5, 16]
    assert texts[0][16:] == "today." and texts[1][11:] == "grey today."


def test_no_parting_yet_while_a_running_sample_could_still_go_the_same_way() -> None:
    texts = ["The sky", "The sky is blue", "The sea"]
    # sample 1 continues sample 0's text, which is still being written: undecided
    assert parting_points(texts, [False, False, True]) == [None, None, 5]
    # once sample 0 ended, sample 1 went on past it: parted where 0 ended
    assert parting_points(texts, [True, False, True]) == [None, 7, 5]


def test_identical_samples_and_a_single_sample_never_part() -> None:
    assert parting_points(["same", "same", "same"], [True] * 3) == [None, None, None]
    assert parting_points(["alone"], [True]) == [None]
    assert parting_points([], []) == []


def test_matches_a_brute_force_reading_on_random_texts() -> None:
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(2, 7)
        texts = ["".join(rng.choice("ab") for _ in range(rng.randint(0, 6))) for _ in range(n)]
        finished = [rng.random() < 0.5 for _ in range(n)]
        assert parting_points(texts, finished) == brute_force(texts, finished), (texts, finished)
        # character by character is the point here: the reference for common_prefix
        assert all(common_prefix(a, b) == len(os.path.commonprefix([a, b])) for a in texts for b in texts)  # noqa: RUF071
