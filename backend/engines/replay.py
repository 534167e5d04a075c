"""The replay engine: a saved run (`backend.saved_run`) streamed again, with the timing it was
recorded with, or `speed` times faster.

Each sample is a task that puts each recorded chunk on the queue at its recorded time into the
request (divided by `speed`), with its tokens' log probabilities where the run has them; the last
chunk carries the sample's finish reason and the engine's own figures, as the recording engine
sent them. A request replays the run whatever prompt and settings it asked: the engine says it
`plays` the run, and the server runs the run's own request (`backend.protocol.replayed_command`),
so the page shows the recorded prompt's settings, seed and format. Samples are chosen by seed
(sample i of the run has the run's seed + i), so fan-out `requests`, which asks for n requests of
one sample each with seeds seed + i, replays them too.

`--engine replay --run FILE` serves one saved run to every request; a `replay` frame
(`backend.protocol`) replays the run it carries through an engine of its own, whatever engine the
server runs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backend.config.declared import Setting
from backend.engines.base import Engine, FormatChoice, Generation, RequestRejected, SampleTasksGeneration
from backend.saved_run import SavedRun, SavedRunError, SavedSample
from backend.saved_run_reader import load_saved_run
from backend.vocabulary import Chunk, Prompt, SamplingParams

if TYPE_CHECKING:
    from backend.engines import EngineOptions

RUN = Setting(
    "run",
    "--run",
    ("DASHBOARD_RUN",),
    'engine `replay`: the saved run to stream ([docs/protocol.md](docs/protocol.md), "Saved runs")',
    default="",
)
SPEED = Setting(
    "replay_speed",
    "--replay-speed",
    ("REPLAY_SPEED",),
    "engine `replay`: how many times faster than recorded",
    default=1.0,
    kind=float,
)
"""A replay keeps the recorded timing unless told to go faster (`--replay-speed`, a frame's `speed`)."""

SETTINGS = (RUN, SPEED)


class ReplayEngine(Engine):
    """Streams `run` to every request, `speed` times as fast as it was recorded."""

    name = "replay"
    runs_on_any_loop = True

    def __init__(self, run: SavedRun, speed: float = SPEED.default, label: str = "") -> None:
        if not speed > 0:
            raise ValueError(f"--replay-speed must be > 0, got {speed}")
        self.run = run
        self.speed = speed
        self.label = label
        """Where the run came from, for the model line (a file name)."""
        self._generations: set[ReplayGeneration] = set()

    @property
    def plays(self) -> SavedRun:  # type: ignore[override]
        """The saved run, whatever a request asks."""
        return self.run

    @classmethod
    def from_options(cls, options: EngineOptions) -> ReplayEngine:
        """Build from `--run FILE` and `--replay-speed`; ValueError says what is wrong with them."""
        if not options.run:
            raise ValueError("--engine replay needs --run FILE: a saved run (docs/protocol.md, 'Saved runs')")
        try:
            run = load_saved_run(options.run)
        except SavedRunError as exc:
            raise ValueError(f"--run {options.run}: {exc}") from None
        return cls(run, options.replay_speed, Path(options.run).name)

    @property
    def model(self) -> str:
        run = self.run
        speed = "" if self.speed == 1 else f", {self.speed:g}x"
        where = f" from {self.label}" if self.label else ""
        return f"{run.model} on {run.engine}, replayed{where}{speed}"

    def choose_format(self, text: str, requested: str | None, system: str = "") -> FormatChoice:
        """The recorded prompt, whatever the request's: a replay shows what was run."""
        run = self.run
        recorded = f": {run.format_reason}" if run.format_reason else ""
        return FormatChoice(Prompt(run.prompt, run.prompt_format, run.system), f"as recorded{recorded}")

    def validate(self, prompt: Prompt, n: int, params: SamplingParams) -> None:
        self._samples(n, params)

    def _samples(self, n: int, params: SamplingParams) -> list[SavedSample]:
        """The recorded samples a request of `n` samples with `params` gets: by seed."""
        run = self.run
        recorded = run.params.sample_seed(0)
        first = (recorded if params.seed is None else params.seed) - recorded
        if not 0 <= first or first + n > run.n:
            raise RequestRejected(
                "not_recorded",
                f"the saved run has samples with seeds {run.params.seed} to "
                f"{run.params.sample_seed(run.n - 1)}; this request asks for {n} from seed {params.seed}",
            )
        return list(run.samples[first : first + n])

    def generate(self, prompt: Prompt, n: int, params: SamplingParams) -> Generation:
        generation = ReplayGeneration(self, self._samples(n, params))
        return generation

    def health(self) -> dict[str, Any]:
        running = sum(g.running_samples for g in self._generations)
        return {**super().health(), "running_requests": len(self._generations), "running_samples": running}


class ReplayGeneration(SampleTasksGeneration):
    """A task per recorded sample, each putting its chunks on one queue at their recorded times."""

    def __init__(self, engine: ReplayEngine, samples: list[SavedSample]) -> None:
        super().__init__(len(samples), engine._generations)
        self._engine = engine
        self._ended: set[int] = set()
        """Samples whose finish chunk is on the queue."""
        started = asyncio.get_running_loop().time()
        for index, sample in enumerate(samples):
            task = asyncio.create_task(
                self._replay(index, sample, started, engine.speed), name=f"replay-sample-{index}"
            )
            task.add_done_callback(lambda _, index=index: self._end(index, "abort"))
            self._tasks.append(task)

    def _end(self, index: int, reason: str, chunk: Chunk | None = None) -> None:
        """Put sample `index`'s finish on the queue, once: `chunk` (its last), or an empty chunk
        with `reason` (a sample task cancelled, even before it ran, finishes "abort")."""
        if index not in self._ended:
            self._ended.add(index)
            self._queue.put_nowait(chunk or Chunk(index, "", 0, reason))

    async def _replay(self, index: int, sample: SavedSample, started: float, speed: float) -> None:
        loop = asyncio.get_running_loop()
        put = self._queue.put_nowait
        last = len(sample.chunks) - 1
        if last < 0:  # nothing was streamed (a stop string at the start, an early abort)
            self._end(index, "", Chunk(index, "", 0, sample.finish_reason, meta=dict(sample.engine)))
            return
        for position, chunk in enumerate(sample.chunks):
            wait = started + chunk.at / speed - loop.time()
            # A chunk already due still waits one loop iteration, as a live engine's would.
            await asyncio.sleep(wait if wait > 0 else 0)
            if position < last:
                put(
                    Chunk(
                        index,
                        chunk.text,
                        chunk.tokens,
                        logprobs=chunk.logprobs,
                        alternatives=chunk.alternatives,
                    )
                )
            else:
                finish = sample.finish_reason
                self._end(
                    index,
                    "",
                    Chunk(
                        index,
                        chunk.text,
                        chunk.tokens,
                        finish,
                        meta=dict(sample.engine),
                        logprobs=chunk.logprobs,
                        alternatives=chunk.alternatives,
                    ),
                )
