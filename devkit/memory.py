"""Peak resident memory (RSS) of a process, or of it and its descendants, sampled on a thread while
a benchmark runs: the one memory sampler of bench/embedded.py, bench/embedded_vs_vllm.py,
bench/llama_cpp.py and bench/scaling.py."""

from __future__ import annotations

import contextlib
import threading

import psutil


class PeakRss:
    """Highest RSS in bytes of process `pid` (this one where None), summed with its descendants'
    where `tree`, read every `interval_s` seconds on a thread between entry and exit and once more at
    exit: `peak` is above the level at entry where `above_entry`, else the RSS itself. A process that
    is gone (or never started) reads 0."""

    def __init__(
        self, pid: int | None = None, tree: bool = False, interval_s: float = 0.01, above_entry: bool = True
    ) -> None:
        self.root: psutil.Process | None = None
        with contextlib.suppress(psutil.Error):
            self.root = psutil.Process(pid)
        self.tree = tree
        self.interval_s = interval_s
        self.above_entry = above_entry
        self.base = 0
        self.peak = 0

    def rss(self) -> int:
        """The RSS now, in bytes (the tree's sum where `tree`)."""
        if self.root is None:
            return 0
        processes = [self.root]
        if self.tree:
            with contextlib.suppress(psutil.Error):
                processes += self.root.children(recursive=True)
        total = 0
        for process in processes:
            with contextlib.suppress(psutil.Error):
                total += process.memory_info().rss
        return total

    def _sample(self) -> None:
        self.peak = max(self.peak, self.rss() - self.base)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> PeakRss:
        self.base = self.rss() if self.above_entry else 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
