"""The decode step's ops between its linear layers, one C call each for all rows (decode_ops.c).

A decode layer in PyTorch is about 40 small ops (norms, rotary embedding, cache writes, a masked
attention over the rows, SiLU); at a few rows each costs its dispatch more than
its arithmetic. Here RMSNorm, rotary embedding with the cache write, attention over each row's own
positions, and the MLP's SiLU-gated product are one C call each, every row computed on its own, so
a row's values do not depend on the rows beside it (as with the rows kernel, linear.py). The
sampler's draw of each row's next token from its logits is one more (`draw`, sampler.py).
`Llama.decode` takes this path on every compute path where `usable()` (this C part built, on a CPU
with AVX2 and FMA); elsewhere it runs the same ops in PyTorch, one row at a time. The values agree
with PyTorch's to float32 rounding (decode_ops.c says where and why they differ);
`tests/test_decode_ops.py` compares them. `python -m bench.decode_ops` times a decode step both ways.

Each function checks the shapes, types and layout the C part relies on, then passes addresses.
"""

from __future__ import annotations

import torch

try:
    from backend.engines.embedded import _decode_ops
except ImportError:  # not built (no C compiler): PyTorch alone
    _decode_ops = None


CACHE_DTYPES = (torch.float32, torch.float16)
"""The row cache's dtypes the ops read and write (the scheduler's cache is float16)."""


def built() -> bool:
    """Whether the C part is built and this CPU has what it needs (AVX2, FMA, F16C)."""
    return _decode_ops is not None and _decode_ops.available()


_on = built()


def configure(allow: bool = True) -> None:
    """Let decode steps use these ops where they can (the default), or keep them to the PyTorch step
    (`allow=False`, for comparisons), as `linear.configure` does for the rows kernel."""
    global _on
    _on = allow and built()


def usable() -> bool:
    """Whether decode steps run on these ops (their activations are float32 on every path)."""
    return _on


def _check_cache(keys: torch.Tensor, values: torch.Tensor) -> bool:
    """Check one layer's keys and values of the row cache (one of CACHE_DTYPES, both the same,
    contiguous); returns whether they are float16."""
    if keys.dtype not in CACHE_DTYPES:
        raise ValueError(f"decode_ops: a cache of {keys.dtype}, not one of {CACHE_DTYPES}")
    _check("keys", keys, tuple(keys.shape), keys.dtype)
    _check("values", values, tuple(keys.shape), keys.dtype)
    return keys.dtype == torch.float16


def _check(
    name: str, tensor: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype = torch.float32
) -> None:
    if tensor.dtype != dtype or not tensor.is_contiguous() or tuple(tensor.shape) != shape:
        raise ValueError(
            f"decode_ops: {name} must be a contiguous {dtype} tensor of shape {shape}, "
            f"not {tensor.dtype} {tuple(tensor.shape)}{'' if tensor.is_contiguous() else ' (strided)'}"
        )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * x / sqrt(mean(x^2) + eps) for each row of x[rows, D], as `model.rms_norm`."""
    rows, width = x.shape
    _check("x", x, (rows, width))
    _check("weight", weight, (width,))
    out = torch.empty_like(x)
    _decode_ops.rms_norm(out.data_ptr(), x.data_ptr(), weight.data_ptr(), rows, width, eps)
    return out


def rope_store(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    heads: int,
) -> torch.Tensor:
    """Rotate the q and k heads of qkv[rows, (heads + 2 kv_heads) x D] to each row's position
    (positions[rows], int64; cos/sin tables [positions, D]), write k and v into keys/values[r, kv,
    positions[r]] (one layer's cache, [max_rows, kv_heads, capacity, D], float32 or float16: rounded
    to it); returns q [rows, heads x D]."""
    rows = qkv.shape[0]
    _, kv_heads, capacity, dim = keys.shape
    if keys.shape[0] < rows:
        raise ValueError(f"decode_ops: a cache of {keys.shape[0]} rows for {rows} rows")
    _check("qkv", qkv, (rows, (heads + 2 * kv_heads) * dim))
    _check("cos", cos, (cos.shape[0], dim))
    _check("sin", sin, tuple(cos.shape))
    _check("positions", positions, (rows,), torch.long)
    half = _check_cache(keys, values)
    q = torch.empty(rows, heads * dim, dtype=torch.float32)
    _decode_ops.rope_store(
        q.data_ptr(), qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), cos.shape[0], positions.data_ptr(),
        keys.data_ptr(), values.data_ptr(), rows, heads, kv_heads, dim, capacity, half,
    )  # fmt: skip
    return q


def attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
    sources: torch.Tensor | None = None,
    shared: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each row's attention over its own first lengths[r] positions: q [rows, heads x D], keys and
    values one layer's cache [max_rows, kv_heads, capacity, D] (float32 or float16), query head h
    reading kv head h // (heads / kv_heads); returns [rows, heads x D]. Where given, row r reads its first
    shared[r] positions from row sources[r] (a row holding the same keys and values there: the
    rows of one request share its prompt, which is then read from one place for all of them)."""
    rows = q.shape[0]
    _, kv_heads, capacity, dim = keys.shape
    heads = q.shape[1] // dim if dim else 0
    if heads % kv_heads or keys.shape[0] < rows:
        raise ValueError(f"decode_ops: {heads} query heads, {kv_heads} kv heads, {keys.shape[0]} cache rows")
    _check("q", q, (rows, heads * dim))
    half = _check_cache(keys, values)
    _check("lengths", lengths, (rows,), torch.long)
    if sources is None or shared is None:
        sources, shared = torch.arange(rows), torch.zeros(rows, dtype=torch.long)
    _check("sources", sources, (rows,), torch.long)
    _check("shared", shared, (rows,), torch.long)
    out = torch.empty_like(q)
    _decode_ops.attention(
        out.data_ptr(), q.data_ptr(), keys.data_ptr(), values.data_ptr(), lengths.data_ptr(),
        sources.data_ptr(), shared.data_ptr(), rows, kv_heads, heads // kv_heads, dim, capacity, scale, half,
    )  # fmt: skip
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for each row of gate_up[rows, 2 I] = [gate, up]; returns [rows, I]."""
    rows, width = gate_up.shape
    _check("gate_up", gate_up, (rows, width))
    if width % 2:
        raise ValueError("decode_ops: gate_up must have an even width")
    out = torch.empty(rows, width // 2, dtype=torch.float32)
    _decode_ops.silu_mul(out.data_ptr(), gate_up.data_ptr(), rows, width // 2)
    return out


def draw(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_p: torch.Tensor,
    top_k: torch.Tensor,
    uniforms: torch.Tensor,
) -> torch.Tensor:
    """The next token of each row of logits[rows, V] (int64 [rows]), each row on its own: its first
    largest logit where its temperature <= 0, else drawn at its uniform in [0, 1) from the softmax of
    logits / temperature, restricted to its top_k tokens (0 or >= V: all), then to the smallest
    prefix of those, heaviest first, whose mass reaches top_p of theirs (>= 1: all). temperatures,
    top_p and uniforms are float32 [rows], top_k int64 [rows]. One pass for the largest logit, one
    for the weights; a truncated row sorts only its heaviest tokens (decode_ops.c: `draw`)."""
    rows, vocab = logits.shape
    _check("logits", logits, (rows, vocab))
    for name, values in (("temperatures", temperatures), ("top_p", top_p), ("uniforms", uniforms)):
        _check(name, values, (rows,))
    _check("top_k", top_k, (rows,), torch.long)
    tokens = torch.empty(rows, dtype=torch.long)
    _decode_ops.draw(
        tokens.data_ptr(), logits.data_ptr(), temperatures.data_ptr(), top_p.data_ptr(), top_k.data_ptr(),
        uniforms.data_ptr(), rows, vocab,
    )  # fmt: skip
    return tokens


class StepOps:
    """The ops of one decode step of rows 0..R-1 on its residual x [R, H]: the tensors checked and the
    outputs' buffers made once a step rather than once a call (each function above checks and
    allocates for about 8 us a call: 3 ms of a 30-layer step at one row on a 2-core AMD EPYC Zen 1,
    AVX2 only). The same values as the functions; each op returns its buffer, which holds until the
    op's next call. `qkv` and `gate_up` are the buffers the step's products write into for `attend`
    and `silu_mul` (linear.linear's `out`)."""

    def __init__(
        self,
        x: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        positions: torch.Tensor,
        *,
        sources: torch.Tensor,
        shared: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        heads: int,
        scale: float,
        intermediate: int,
    ) -> None:
        """x [R, H] float32; keys and values the row cache's [layers, max_rows, kv_heads, capacity, D];
        positions, sources and shared its rows' (int64 [R], as `attention` takes them); rotary the
        (cos, sin) tables [positions, D]; `intermediate` the MLP's width."""
        rows, width = x.shape
        layers, max_rows, kv_heads, capacity, dim = keys.shape
        _check("x", x, (rows, width))
        if heads % kv_heads or max_rows < rows or not layers:
            raise ValueError(f"decode_ops: {heads} query heads, {kv_heads} kv heads, {max_rows} cache rows")
        self._half = _check_cache(keys, values)
        cos, sin = rotary
        _check("cos", cos, (cos.shape[0], dim))
        _check("sin", sin, tuple(cos.shape))
        for name, tensor in (("positions", positions), ("sources", sources), ("shared", shared)):
            _check(name, tensor, (rows,), torch.long)
        self.lengths = positions + 1
        self.normed = torch.empty(rows, width)
        self.qkv = torch.empty(rows, (heads + 2 * kv_heads) * dim)
        self.q = torch.empty(rows, heads * dim)
        self.attended = torch.empty(rows, heads * dim)
        self.gate_up = torch.empty(rows, 2 * intermediate)
        self.act = torch.empty(rows, intermediate)
        # The tensors whose addresses the calls take, kept alive with them.
        self._held = (x, keys, values, positions, sources, shared, cos, sin)
        self._rows, self._width, self._heads, self._kv_heads, self._dim = rows, width, heads, kv_heads, dim
        self._capacity, self._positions, self._scale = capacity, cos.shape[0], scale
        self._intermediate = intermediate
        self._layer_bytes = keys.stride(0) * keys.element_size()
        self._x, self._keys, self._values = x.data_ptr(), keys.data_ptr(), values.data_ptr()
        self._cos, self._sin, self._at = cos.data_ptr(), sin.data_ptr(), positions.data_ptr()
        self._lengths = self.lengths.data_ptr()
        self._sources, self._shared = sources.data_ptr(), shared.data_ptr()

    def rms_norm(self, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """`rms_norm` of the step's x with `weight` [H], into `normed`."""
        _check("weight", weight, (self._width,))
        _decode_ops.rms_norm(self.normed.data_ptr(), self._x, weight.data_ptr(), self._rows, self._width, eps)
        return self.normed

    def attend(self, index: int, qkv: torch.Tensor) -> torch.Tensor:
        """Layer `index`'s `rope_store` of `qkv` (the step's `qkv` buffer) into the cache, then each
        row's `attention` over its own positions, into `attended`."""
        if qkv.data_ptr() != self.qkv.data_ptr():
            raise ValueError("decode_ops: attend takes the step's own qkv buffer")
        keys, values = self._keys + index * self._layer_bytes, self._values + index * self._layer_bytes
        rows, heads, kv_heads, dim = self._rows, self._heads, self._kv_heads, self._dim
        q = self.q.data_ptr()
        _decode_ops.rope_store(
            q, self.qkv.data_ptr(), self._cos, self._sin, self._positions, self._at, keys, values,
            rows, heads, kv_heads, dim, self._capacity, self._half,
        )  # fmt: skip
        _decode_ops.attention(
            self.attended.data_ptr(), q, keys, values, self._lengths, self._sources, self._shared,
            rows, kv_heads, heads // kv_heads, dim, self._capacity, self._scale, self._half,
        )  # fmt: skip
        return self.attended

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """`silu_mul` of `gate_up` (the step's `gate_up` buffer), into `act`."""
        if gate_up.data_ptr() != self.gate_up.data_ptr():
            raise ValueError("decode_ops: silu_mul takes the step's own gate_up buffer")
        _decode_ops.silu_mul(self.act.data_ptr(), self.gate_up.data_ptr(), self._rows, self._intermediate)
        return self.act
