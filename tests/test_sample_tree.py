"""The samples' prefix tree against a brute-force prefix tree of their final units, on recorded
SGLang and vLLM streams, random streams and edge cases; where samples part; the panel's value."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from backend.engines.http.streams import OpenAIStream, SGLangStream, SSEDecoder
from backend.frames import accepted_frame, chunk_frame, done_frame, finish_frame
from backend.serving.outbox import Outbox
from backend.vocabulary import Chunk, SamplingParams
from ui.sample_tree import TOKENS, WORD_UNITS, WORDS, Node, SampleTree, sample_indices
from ui.sample_tree_view import LABEL_CHARS, tree_value, value_rows
from ui.view import RunView, samples_value

FIXTURES = Path(__file__).resolve().parent / "fixtures"
"""Real streams recorded from SGLang and vLLM servers (tests/fixtures/README.md says how)."""

# (file, n, parser) for every recorded generation stream; the logprob ones parsed with logprobs.
RECORDED = [
    ("sglang-generate-n4-cumulative.sse", 4, lambda n: SGLangStream(n)),
    ("sglang-generate-n3-abort-request.sse", 3, lambda n: SGLangStream(n)),
    (
        "sglang-generate-n2-logprobs-incremental.sse",
        2,
        lambda n: SGLangStream(n, incremental=True, logprobs=True),
    ),
    ("sglang-v1-completions-n4.sse", 4, lambda n: OpenAIStream(n)),
    ("sglang-v1-completions-n1-usage.sse", 1, lambda n: OpenAIStream(n)),
    ("sglang-v1-chat-completions-n4.sse", 4, lambda n: OpenAIStream(n, chat=True)),
    ("vllm-v1-completions-n4.sse", 4, lambda n: OpenAIStream(n)),
    ("vllm-v1-chat-completions-n4.sse", 4, lambda n: OpenAIStream(n, chat=True)),
    ("vllm-v1-completions-n2-logprobs.sse", 2, lambda n: OpenAIStream(n, logprobs=True)),
    ("vllm-v1-chat-completions-n2-logprobs.sse", 2, lambda n: OpenAIStream(n, chat=True, logprobs=True)),
]


# The reference: a plain prefix tree of whole unit sequences, one node per unit, then compressed.


def brute_force(units: list[list[str]], finished: list[bool]) -> tuple[Any, ...]:
    """The tree of `units` as (edge units, samples, ended samples, children), built from scratch:
    every prefix of every sample is a node; a node nobody ends at whose one child has the same
    samples is merged into it."""
    n = len(units)

    def build(path: tuple[str, ...], members: list[int]) -> list[Any]:
        depth = len(path)
        samples = sum(1 << s for s in members)
        ends = sum(1 << s for s in members if len(units[s]) == depth)
        branches: dict[str, list[int]] = {}
        for s in members:
            if len(units[s]) > depth:
                branches.setdefault(units[s][depth], []).append(s)
        children = [build((*path, unit), group) for unit, group in branches.items()]
        return [path[-1:] if path else (), samples, ends, children]

    def compress(node: list[Any], is_root: bool) -> tuple[Any, ...]:
        edge, samples, ends, children = node
        while not is_root and not ends and len(children) == 1 and children[0][1] == samples:
            child = children[0]
            edge, ends, children = edge + child[0], child[2], child[3]
        return (edge, samples, ends, tuple(sorted(compress(c, False) for c in children)))

    del finished  # a sample's end is a node whether or not it finished
    return compress(build((), list(range(n))), True)


def shape(tree: SampleTree) -> tuple[Any, ...]:
    """The incremental tree in the reference's form."""

    def visit(node: Node) -> tuple[Any, ...]:
        edge = tuple(tree.units[node.owner][node.start : node.end]) if node is not tree.root else ()
        children = tuple(sorted(visit(child) for child in node.children.values()))
        return (edge, node.samples, node.ends, children)

    return visit(tree.root)


def brute_parting(units: list[list[str]], finished: list[bool], pending: list[str]) -> list[int | None]:
    """Each sample's first unit no other sample shares, as a character offset, read pair by pair;
    `pending`: what each running sample wrote of its next unit."""
    n = len(units)
    points: list[int | None] = []
    for i in range(n):
        shared = [
            next(
                (k for k, (x, y) in enumerate(zip(units[i], units[j], strict=False)) if x != y),
                min(len(units[i]), len(units[j])),
            )
            for j in range(n)
            if j != i
        ]
        longest = max(shared, default=len(units[i]))
        undecided = any(
            j != i
            and not finished[j]
            and units[i][: len(units[j])] == units[j]
            and (len(units[i]) == len(units[j]) or units[i][len(units[j])].startswith(pending[j]))
            for j in range(n)
        )
        if not shared or longest >= len(units[i]) or undecided:
            points.append(None)
        else:
            points.append(len("".join(units[i][:longest])))
    return points


def check(
    tree: SampleTree, units: list[list[str]], finished: list[bool], texts: list[str] | None = None
) -> None:
    """The tree holds `units` (of `texts`, in word mode) and has the reference's shape and parting points."""
    pending = [
        "" if texts is None or done else "".join(WORD_UNITS.findall(text)[-1:])
        for text, done in zip(texts or [""] * len(units), finished, strict=True)
    ]
    assert tree.units == units
    assert shape(tree) == brute_force(units, finished)
    assert tree.parting_points() == brute_parting(units, finished, pending)
    assert tree.node_count == sum(1 for _ in tree.walk())


def word_units(text: str, finished: bool) -> list[str]:
    """A text's word units as the tree holds them: all, or all but the last while it may grow."""
    found = WORD_UNITS.findall(text)
    return found if finished else found[:-1]


# Recorded streams, through the frames the page gets.


def recorded_frames(name: str, n: int, parser: Any, merge_every: int) -> list[dict[str, Any]]:
    """The stream's chunks as the server frames them, merged by the real outbox as for a client
    that reads every `merge_every` frames (1: no merging)."""
    decoder = SSEDecoder()
    stream = parser(n)
    data = (FIXTURES / name).read_bytes()
    chunks: list[Chunk] = [
        c for payload in decoder.feed(data) + decoder.close() for c in stream.feed(payload)
    ]
    if isinstance(stream, OpenAIStream):
        chunks += stream.close()
    outbox = Outbox()
    frames: list[dict[str, Any]] = [
        accepted_frame(
            "r", n, "recorded", "smollm2", SamplingParams(max_tokens=32, temperature=0.8, top_p=0.95, seed=0)
        )
    ]
    for count, chunk in enumerate(chunks, 1):
        if chunk.text or chunk.tokens:
            outbox.push(chunk_frame("r", chunk.index, chunk.text, chunk.tokens, None, chunk.logprobs))
        if chunk.finish_reason is not None:
            outbox.push(finish_frame("r", chunk.index, chunk.finish_reason, {}))
        if count % merge_every == 0:
            frames += outbox.drain()
    frames += outbox.drain()
    return [*frames, done_frame("r", {})]


@pytest.mark.parametrize("merge_every", [1, 7])
@pytest.mark.parametrize(("name", "n", "parser"), RECORDED, ids=[r[0] for r in RECORDED])
def test_recorded_streams_make_the_tree_of_their_final_units(
    name: str, n: int, parser: Any, merge_every: int
) -> None:
    frames = recorded_frames(name, n, parser, merge_every)
    with_logprobs = "logprobs" in name
    view = RunView("r", started_at=0.0)
    # Tokens: each engine chunk with text is a unit; a chunk without text joins the next.
    tokens: list[list[str]] = [[] for _ in range(n)]
    token_logprobs: list[list[float]] = [[] for _ in range(n)]
    pending: list[list[float]] = [[] for _ in range(n)]
    for frame in frames:
        view.apply(frame, 0.0)
        if frame["type"] != "chunk":
            continue
        # the tree so far is the tree of the texts so far, frame by frame
        finished = [s.finished for s in view.samples]
        if with_logprobs:
            index = frame["index"]
            for text, logprobs in frame["logprobs"]:
                pending[index] += logprobs
                if text:
                    tokens[index].append(text)
                    token_logprobs[index].append(math.fsum(pending[index]))
                    pending[index] = []
            check(view.tree, tokens, finished)
        else:
            texts = [s.text for s in view.samples]
            check(
                view.tree, [word_units(t, f) for t, f in zip(texts, finished, strict=True)], finished, texts
            )
    tree = view.tree
    texts = [s.text for s in view.samples]
    assert all(s.finished for s in view.samples)
    assert ["".join(units) for units in tree.units] == texts  # nothing lost, nothing added
    assert tree.unit == (TOKENS if with_logprobs else WORDS)
    if with_logprobs:
        assert tree.logprobs == token_logprobs
        check(tree, tokens, [True] * n)
    else:
        check(tree, [WORD_UNITS.findall(t) for t in texts], [True] * n)
    # the page's columns mark where each sample parts from the others, read off this tree
    columns = samples_value(view, 0.0)["samples"]
    assert [c["parts_at"] for c in columns] == tree.parting_points()
    rows = value_rows(tree_value(tree, "r"))
    assert sum(row["count"] for row in rows if row["level"] == 1) == n - sum(1 for t in texts if not t)


def test_two_samples_that_share_a_beginning_part_where_they_differ() -> None:
    tree = SampleTree(3)
    tree.add(0, "The sky is ")
    tree.add(1, "The sky is ")
    tree.add(2, "The sea")
    tree.add(0, "blue today.")
    tree.add(1, "grey today.")
    for i in range(3):
        tree.finish(i)
    assert tree.unit == WORDS
    rows = [(level, node.count, tree.edge_text(node)) for node, level in tree.walk()]
    assert rows == [
        (0, 3, ""),
        (1, 3, "The "),
        (2, 2, "sky is "),
        (3, 1, "blue today."),
        (3, 1, "grey today."),
        (2, 1, "sea"),
    ]
    assert tree.parting_points() == [11, 11, 4]  # "blue", "grey", "sea": the first word not shared


def test_no_parting_yet_while_a_running_sample_could_still_go_the_same_way() -> None:
    tree = SampleTree(3)
    for index, text in enumerate(["The sky", "The sky is blue", "The sea"]):
        tree.add(index, text)
    tree.finish(2)
    # sample 0 ("The sky", still written) may yet write what 1 did: undecided
    assert tree.parting_points() == [None, None, 4]
    # once sample 0 ended, sample 1 went on past it: parted where 0 ended
    tree.finish(0)
    assert tree.parting_points() == [None, 7, 4]


def test_tokens_carry_their_probability_and_an_empty_token_joins_the_next() -> None:
    tree = SampleTree(2)
    lp = math.log
    tree.add(0, " Paris", [[" Paris", [lp(0.8)]]])
    tree.add(1, " Paris", [[" Paris", [lp(0.6)]]])
    tree.add(0, "", [["", [lp(0.5)]]])  # a token that completed no character yet
    tree.add(0, "é.", [["é", [lp(0.5)]], [".", [lp(0.9)]]])
    tree.add(1, " is", [[" is", [lp(0.3)]]])
    assert tree.unit == TOKENS
    assert tree.units == [[" Paris", "é", "."], [" Paris", " is"]]
    paris, after = tree.root.children[" Paris"], tree.at(0)
    assert paris.count == 2 and tree.probability(paris) == pytest.approx(math.sqrt(0.8 * 0.6))
    assert tree.edge_text(after) == "é." and tree.probability(after) == pytest.approx(0.25)
    assert [
        (row["count"], row["text"], row["p"], row["size"]) for row in value_rows(tree_value(tree, "r"))
    ] == [
        (2, "", None, 0),
        (2, " Paris", pytest.approx(math.sqrt(0.48), abs=1e-4), 1),
        (1, "é.", pytest.approx(0.25, abs=1e-4), 2),
        (1, " is", pytest.approx(0.3, abs=1e-4), 1),
    ]


def test_edge_cases_empty_one_identical_early_stop_unicode() -> None:
    # No chunk at all: the root alone, every sample ended there.
    empty = SampleTree(3)
    for i in range(3):
        empty.finish(i)
    assert empty.unit is None and empty.node_count == 1 and empty.parting_points() == [None] * 3
    assert value_rows(tree_value(empty, "r"))[0]["ends"] == 3
    # One sample: one edge that grows in place, never parted.
    one = SampleTree(1)
    for word in "a long road home".split(" "):
        one.add(0, word + " ")
    one.finish(0)
    assert one.node_count == 2 and one.edge_text(one.at(0)) == "a long road home "
    assert one.parting_points() == [None]
    # Identical samples in lockstep: one edge of all of them, however long.
    same = SampleTree(4)
    for _ in range(50):
        for i in range(4):
            same.add(i, "and again ")
    assert (
        same.node_count == 2 and same.at(0).count == 4 and same.at(0).length == 199
    )  # the last space may yet grow
    # One stops early: its end splits the edge; the others part from it where it ended.
    same.finish(2)
    for i in (0, 1, 3):
        same.add(i, "more")
        same.finish(i)
    assert same.node_count == 3
    assert same.parting_points() == [None, None, None, None]  # 0, 1, 3 still share everything
    points_text = "".join(same.units[0][: same.at(0).start])
    assert len(points_text) == len("and again " * 50)
    # Unicode: CJK with no spaces is cut into units of 16 characters; an emoji sequence and a
    # combining accent go in units of their own code points, so every character is kept in order.
    text = "北京是中国的首都也是一座历史悠久的城市\uff0c" * 2 + " 👩‍💻 cafe\u0301"
    uni = SampleTree(2)
    for start in range(0, len(text), 3):
        uni.add(0, text[start : start + 3])
    uni.add(1, text)
    uni.finish(0)
    uni.finish(1)
    assert uni.units[0] == uni.units[1] == WORD_UNITS.findall(text)
    assert uni.units[0][:3] == ["北京是中国的首都也是一座历史悠久", "的城市", "\uff0c"]
    assert "".join(uni.units[0]) == text and uni.node_count == 2


def test_bad_input_gets_a_clear_error_and_changes_nothing() -> None:
    tree = SampleTree(2)
    with pytest.raises(IndexError, match=r"sample index 2 is not in 0\.\.1"):
        tree.add(2, "x")
    with pytest.raises(ValueError, match="n must be 0 or more"):
        SampleTree(-1)
    assert tree.node_count == 1 and tree.unit is None
    # pieces that do not spell the chunk's text: the text is kept, as one unit without probability
    tree.add(0, "abc", [["ab", [-0.1]]])
    assert tree.units[0] == ["abc"] and tree.logprobs[0] == [None]


@pytest.mark.parametrize("seed", range(40))
def test_random_streams_match_the_brute_force_tree_after_every_chunk(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 6)
    alphabet = ["a", "b", " ", "ab", "é", "\n"]
    mode = rng.choice([TOKENS, WORDS])
    # Samples with shared beginnings: each copies another's start, then goes its own way.
    finals: list[list[str]] = []
    for i in range(n):
        base = finals[rng.randrange(i)][: rng.randint(0, 8)] if i and rng.random() < 0.7 else []
        finals.append(base + [rng.choice(alphabet) for _ in range(rng.randint(0, 8))])
    tree = SampleTree(n)
    sent = [0] * n
    finished = [False] * n
    texts = [""] * n
    while not all(finished):
        i = rng.choice([s for s in range(n) if not finished[s]])
        if sent[i] == len(finals[i]) or rng.random() < 0.08:
            tree.finish(i)
            finished[i] = True
        else:
            take = finals[i][sent[i] : sent[i] + rng.randint(1, 3)]
            sent[i] += len(take)
            chunk = "".join(take)
            texts[i] += chunk
            if mode == TOKENS:
                tree.add(i, chunk, [[t, [-0.5]] for t in take])
            else:
                tree.add(i, chunk)
        if tree.unit == TOKENS:
            expected = [finals[s][: sent[s]] for s in range(n)]
        elif tree.unit == WORDS:
            expected = [word_units(texts[s], finished[s]) for s in range(n)]
        else:
            expected = [[] for _ in range(n)]
        check(tree, expected, finished, texts if tree.unit == WORDS else None)


def test_the_value_elides_long_straight_runs_and_sums_to_n_at_the_root() -> None:
    n, length = 32, 512
    tree = SampleTree(n)
    rng = random.Random(3)
    for step in range(length):
        for i in range(n):
            word = " shared" if step < 40 else f" w{rng.randrange(3 if step < 60 else 1000)}"
            tree.add(i, word, [[word, [-0.2]]])
    rows = value_rows(tree_value(tree, "r"))
    assert rows[0]["level"] == 0 and rows[0]["count"] == n
    assert sum(row["count"] for row in rows if row["level"] == 1) == n
    assert tree.node_count == len(rows) <= 3 * n
    assert all(len(row["text"]) <= LABEL_CHARS + 3 for row in rows)
    longest = max(rows, key=lambda row: row["size"])
    assert " … " in longest["text"] and longest["size"] > 400
    for node, _level in tree.walk():
        if node.children:
            assert sum(c.count for c in node.children.values()) + (node.ends).bit_count() == node.count
            assert all(
                set(sample_indices(c.samples)) <= set(sample_indices(node.samples))
                for c in node.children.values()
            )


def test_the_value_survives_gradios_update_diffs_while_the_tree_reshapes() -> None:
    # Samples running ahead of each other keep splitting and merging the tree: the page gets each
    # value as Gradio's diff from the last one, which must rebuild it exactly.
    from gradio.utils import diff
    from gradio_client.utils import apply_diff

    rng = random.Random(5)
    tree = SampleTree(4)
    shown = tree_value(tree, "r")
    for step in range(300):
        index = rng.randrange(4)
        word = f" w{step // 40 if index < 3 else rng.randrange(3)}"
        tree.add(index, word, [[word, [-0.3]]])
        if step == 250:
            tree.finish(1)
        value = tree_value(tree, "r")
        shown = apply_diff(json.loads(json.dumps(shown)), diff(shown, value))
        assert shown == value


def test_a_node_keeps_its_id_when_samples_that_ran_ahead_are_caught_up() -> None:
    tree = SampleTree(3)
    for index in range(3):
        tree.add(index, "a b ")
    shared = tree.at(0)
    tree.add(0, "c ")  # sample 0 runs ahead: a node of its own under the shared one
    assert tree.node_count == 3 and tree.at(0).parent is shared
    tree.add(1, "c ")
    tree.add(2, "c ")  # caught up: one node again, the one a page may have picked
    assert tree.node_count == 2 and all(tree.at(i) is shared for i in range(3))
    assert tree.edge_text(shared) == "a b c"


def test_a_nodes_text_runs_from_the_root_to_its_end_and_a_node_is_found_by_its_id() -> None:
    tree = SampleTree(3)
    for index, text in enumerate(["The cat sat.", "The cat ran.", "A dog."]):
        tree.add(index, text)
        tree.finish(index)
    texts = {tree.text_to(node): node for node, _ in tree.walk()}
    assert set(texts) == {"", "The cat ", "The cat sat.", "The cat ran.", "A dog."}
    assert texts[""] is tree.root
    for node, _ in tree.walk():
        assert tree.find(node.id) is node
    assert tree.find(10_000) is None
