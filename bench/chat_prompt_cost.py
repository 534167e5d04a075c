"""What rendering a chat prompt on an SGLang server costs the `sglang` engine before its stream starts.

Against a running SGLang server: the latency of `POST /tokenize` with one chat turn (the call the
engine makes per chat request), beside the time to first token of a streamed `/generate` of n = 4
samples from its token ids, each the median of `--rounds` alternating rounds. The ratio says what
share of a chat request's TTFT the extra call is.

Usage: python -m bench.chat_prompt_cost --url http://127.0.0.1:30000 [--rounds 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.request

PROMPT = "Name three colours and say something about each."


def post(url: str, body: dict[str, object]) -> urllib.request.Request:
    return urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )


def tokenize(url: str) -> tuple[float, list[int]]:
    """Seconds for one `/tokenize` of the chat turn, and the ids it answered."""
    started = time.perf_counter()
    with urllib.request.urlopen(
        post(url + "/tokenize", {"messages": [{"role": "user", "content": PROMPT}]})
    ) as r:
        ids = json.loads(r.read())["tokens"]
    return time.perf_counter() - started, ids


def first_token(url: str, ids: list[int]) -> float:
    """Seconds to the first event of a streamed `/generate` of 4 samples from `ids`."""
    body = {
        "input_ids": ids,
        "sampling_params": {"n": 4, "max_new_tokens": 8, "temperature": 0.8},
        "stream": True,
    }
    started = time.perf_counter()
    with urllib.request.urlopen(post(url + "/generate", body)) as response:
        for line in response:
            if line.startswith(b"data:"):
                elapsed = time.perf_counter() - started
                break
        response.read()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    url = args.url.rstrip("/")
    tokenize(url)  # warm-up
    calls, ttfts = [], []
    for _ in range(args.rounds):
        seconds, ids = tokenize(url)
        calls.append(seconds)
        ttfts.append(first_token(url, ids))
    call, ttft = statistics.median(calls) * 1000, statistics.median(ttfts) * 1000
    print(
        f"{args.rounds} rounds, medians: /tokenize {call:.1f} ms, /generate TTFT (n=4) {ttft:.1f} ms, "
        f"ratio {call / ttft:.2f}"
    )


if __name__ == "__main__":
    main()
