"""The start-up probe's timings and checks on the model's own matrices (for compute.probe).

Before the model is built, each option `compute.decide` gives is timed on a sample of a decode
step: the products of the first PROBE_LAYERS layers' matrices (scaled to every layer) and of a
share of the output layer's rows (scaled to all of them), made in the option's format by
formats.py exactly as the model would hold them, at each row count the option would call. A
library option's block sizes are checked on the first layer's matrices and the whole output layer
(fixed_rows.check). Each path's matrices are made once and kept until `Source.release`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from backend.engines.embedded import int8
from backend.engines.embedded.compute import Choice
from backend.engines.embedded.fixed_rows import check
from backend.engines.embedded.formats import MATRICES, Form, fused, head_name, layer_blocks, matrix
from backend.engines.embedded.linear import LibraryWeight, Weight
from backend.engines.embedded.quantized import PANEL_ROWS, BlockMatrix
from backend.engines.embedded.weights import LlamaConfig

PROBE_LAYERS = 4
"""Layers whose products the probe runs (with a share of the output layer, about a sixth of a
step's weights: enough to tell the paths apart)."""

PROBE_OUTPUT_SHARE = 4
"""The probe multiplies the output layer's first 1/PROBE_OUTPUT_SHARE of its rows (in whole groups
of PROBE_OUTPUT_ROWS) and counts the rest at that time per row: the bundled model's output layer
(49,152 x 576) outweighs the four layers, and making it whole in each path's format was most of the
probe's weights (0.3 s on a 2-core AMD EPYC Zen 1)."""

PROBE_OUTPUT_ROWS = 96
"""The output layer's rows are shared out in whole groups of this many: of the rows kernel's packed
blocks (24 rows) and int8's (4)."""


@dataclass
class Source:
    """The model as read: its config, float32 tensors and GGUF blocks (by tensor name)."""

    config: LlamaConfig
    tensors: dict[str, torch.Tensor]
    blocks: dict[str, BlockMatrix] = field(default_factory=dict)
    _made: dict[tuple[str, torch.dtype], list[dict[str, Weight]]] = field(default_factory=dict)

    def output_rows(self) -> int:
        """How many of the output layer's rows the probe multiplies (all where too few to share)."""
        n, group = self._head().shape[0], PROBE_OUTPUT_ROWS
        return max(n // PROBE_OUTPUT_SHARE // group * group, min(n, group))

    def _head(self) -> torch.Tensor:
        return self.tensors[head_name(self.config.tie_embeddings)]

    def sample(self, form: Form) -> list[dict[str, Weight]]:
        """The first PROBE_LAYERS layers' matrices and the output layer's first `output_rows()`
        ("output") in `form` (its row counts as given), made once per format and dtype."""
        key = (form.name, form.dtype)
        if key not in self._made:
            blocks = self.blocks if form.name == "blocks" else {}
            layers = min(PROBE_LAYERS, self.config.layers)
            made: list[dict[str, Weight]] = []
            for i in range(layers):
                packed = layer_blocks(blocks, i)
                made.append(
                    {name: matrix(fused(self.tensors, i, name), form, packed.get(name)) for name in MATRICES}
                )
            rows = self.output_rows()
            head_blocks = blocks.get(head_name(self.config.tie_embeddings))
            packed_head = (
                head_blocks.packed().first_rows(rows)
                if head_blocks is not None and not rows % PANEL_ROWS
                else None
            )
            made.append({"output": matrix(self._head()[:rows].float(), form, packed_head)})
            self._made[key] = made
            if form.name == "int8":  # where _int_mm takes over, timed now rather than in a timed product
                int8.c_max_rows()
        return [
            {name: _at_sizes(weight, form) for name, weight in layer.items()} for layer in self._made[key]
        ]

    def release(self) -> None:
        """Free the probe's matrices."""
        self._made.clear()

    @torch.inference_mode()
    def step(self, option: Choice, rows: int) -> float:
        """Seconds a decode step's linear layers take for `rows` rows in `option`'s form, estimated
        from the sample's products (compute.probe's `step`)."""
        c = self.config
        hidden = torch.ones(rows, c.hidden_size)
        inner = torch.ones(rows, c.intermediate_size)
        attended = torch.ones(rows, c.heads * c.head_dim)
        *layers, output = self.sample(Form.of(option))
        started = time.perf_counter()
        for weights in layers:
            weights["qkv"].product(hidden, step=True)
            weights["out"].product(attended, step=True)
            weights["gate_up"].product(hidden, step=True)
            weights["down"].product(inner, step=True)
        sampled = time.perf_counter()
        output["output"].product(hidden, step=True)
        done = time.perf_counter()
        whole = self._head().shape[0] / output["output"].shape[0]
        return (sampled - started) * c.layers / len(layers) + (done - sampled) * whole

    def check(self, option: Choice) -> list[str]:
        """What differs at `option`'s row counts (fixed_rows.check) on the first layer's matrices and
        the whole output layer, in its form (compute.probe's `check`)."""
        form = Form.of(option)
        first = self.sample(form)[0]
        weights = [_tensor(weight) for weight in first.values()]
        weights.append(self._head().to(form.dtype).contiguous())
        return check(option.sizes, weights)


def _at_sizes(weight: Weight, form: Form) -> Weight:
    """`weight` multiplying at `form`'s row counts (a library matrix shares its tensor)."""
    return matrix(weight.weight, form) if isinstance(weight, LibraryWeight) else weight


def _tensor(weight: Weight) -> torch.Tensor:
    assert isinstance(weight, LibraryWeight), "only a library format's row counts are checked"
    return weight.weight
