"""transformers' Llama made to multiply as a compute path's weight format does (int8 rows and weights,
bf16; the matrices made by the engine's own formats.matrix), for what tests and benchmarks compare
against float32: `bench.rounding`'s
divergence, `tests/test_compute_paths.py`'s reference for int8-exact's greedy tokens."""

from __future__ import annotations

from collections.abc import Callable

import torch

from backend.engines.embedded.formats import Form, matrix

FORMS = {"int8": Form("int8"), "bf16": Form("library", torch.bfloat16)}
"""The forms compared, by name: `int8-exact`'s and `bf16-torch`'s."""


def _product(form: str, weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """x[rows, K] -> float32 [rows, N] as the form multiplies by `weight` [N, K]."""
    return matrix(weight, FORMS[form]).product


def with_products(model: torch.nn.Module, form: str) -> torch.nn.Module:
    """`model` (transformers' Llama) with each decoder layer's linear layers, and for int8 its output
    layer, multiplying as `form` does."""

    def replace(linear: torch.nn.Linear) -> None:
        product = _product(form, linear.weight.detach().float())
        out_features = linear.weight.shape[0]

        def forward(x: torch.Tensor) -> torch.Tensor:
            flat = product(x.reshape(-1, x.shape[-1]).float())
            return flat.reshape(*x.shape[:-1], out_features).to(x.dtype)

        linear.forward = forward  # type: ignore[method-assign]

    for layer in model.model.layers:
        for module in (layer.self_attn, layer.mlp):
            for linear in module.modules():
                if isinstance(linear, torch.nn.Linear):
                    replace(linear)
    if form == "int8":
        replace(model.lm_head)
    return model
