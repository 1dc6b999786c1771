"""One table of every public layer of keras-attn: how to build it, its inputs, masks and paths.

`TABLE` maps the name of every layer class in `keras_attn.__all__` to an `Entry`:

- `make(dtype, **overrides)`: a new layer under a dtype policy;
- `cases`: fixed inputs (one example per padding pattern: left, right, inside,
  nothing real), with `Tv` in {0, 1, many} where the layer takes a value
  sequence, which inputs the masks cover (`Case.padding`), and which output
  rows must be exactly zero;
- `variants`: constructor overrides that pick another path through the same
  function (the kernels of `MultiHeadAttention`), and the `reference` one;
- `decoding`: the cached-decoding runs, for the layers with a KV cache;
- `kit`: the property kit's setups, drawn by hypothesis (or a seed) in
  tests/kit/test_testing_kit.py; `LAYERS` is their flat view.

tests/layers/test_differential.py runs `keras_attn.testing.assert_paths_agree` and
`assert_cached_decoding_agrees` over it.
"""

import dataclasses
from collections.abc import Callable

import keras
import numpy as np
from layer_kit import (  # the property kit's setups
    WIDTH,
    _backend,
    _chunked,
    _layer,
    _score_attention,
    attention_setup,
    decoder_setup,
    encoder_setup,
    feed_forward,
    learned,
    pooling_setup,
    position_bias_setup,
    position_setup,
    rotary,
    sinusoidal,
    token_and_position_setup,
)

import keras_attn as ka

# ---------------------------------------------------------------------------
# The differential cases: fixed inputs, one example per padding pattern
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    """Inputs of one call, and what the differential check needs to know about them."""

    inputs: dict
    padding: dict | None = None  # float input -> the name of its mask: what the masks cover
    call_kwargs: dict = dataclasses.field(default_factory=dict)
    output_mask: str | None = None  # outputs compared on these rows only (a residual block)
    zero_rows: np.ndarray | None = None  # output rows that must be exactly zero


@dataclasses.dataclass(frozen=True)
class Decoding:
    """A cached-decoding run: `make(**overrides)`, with the encoder sequence or without."""

    overrides: dict = dataclasses.field(default_factory=dict)
    encoder: bool = False


@dataclasses.dataclass(frozen=True)
class Entry:
    """One public layer: how to build it, its cases, its paths, its cache, its kit setups."""

    make: Callable[..., keras.layers.Layer]  # make(dtype="float32", **overrides)
    cases: dict  # name -> Case
    kit: dict  # label -> setup(pick), see above
    variants: tuple = ({},)  # constructor overrides: the paths through the same function
    reference: dict = dataclasses.field(default_factory=dict)  # of the float64 reference
    decoding: dict = dataclasses.field(default_factory=dict)  # name -> Decoding; {}: no cache


# Left, right, inside padding, and (keys) nothing real: one example each.
QUERY_MASK = np.array([[0, 1, 1, 1], [1, 1, 1, 0], [1, 0, 1, 1], [1, 1, 1, 1]], bool)
VALUE_MASKS = {
    0: np.zeros((4, 0), bool),
    1: np.array([[1], [0], [1], [0]], bool),
    5: np.array([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 1, 1], [0, 0, 0, 0, 0]], bool),
}
# Cached decoding: a prompt of 3 with padding left, right (decoded) and inside; a source.
DECODING_MASK = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [1, 1, 0, 1, 0, 1]], bool)
DECODING_SEQUENCE = np.random.default_rng(5).normal(size=(3, 6, WIDTH)).astype("float32")
ENCODER_MASK = np.array([[1, 1, 0, 0], [0, 1, 1, 1], [1, 0, 1, 0]], bool)
ENCODER_SEQUENCE = np.random.default_rng(6).normal(size=(3, 4, WIDTH)).astype("float32")


def _normal(seed, *shape):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def zero_rows(query_mask, value_mask, causal=False):
    """Rows that see no key (every row when `Tv = 0`) or are padded: their outputs are zero."""
    tq, tv = query_mask.shape[1], value_mask.shape[1]
    allowed = np.tril(np.ones((tq, tv), bool), tv - tq) if causal else np.ones((tq, tv), bool)
    return ~query_mask | ~(value_mask[:, None, :] & allowed).any(-1)


def attention_cases(causal=False):
    """`Tv` = 0, 1, 5 (and a causal self-attention): query and value padded."""
    padding = {"query": "query_mask", "value": "value_mask"}
    cases = {}
    for tv, value_mask in VALUE_MASKS.items():
        inputs = {"query": _normal(tv, 4, 4, WIDTH), "value": _normal(10 + tv, 4, tv, WIDTH),
                  "query_mask": QUERY_MASK, "value_mask": value_mask}  # fmt: skip
        cases[f"Tv={tv}"] = Case(inputs, padding, zero_rows=zero_rows(QUERY_MASK, value_mask))
    if causal:
        x, mask = _normal(20, 4, 5, WIDTH), VALUE_MASKS[5]
        inputs = {"query": x, "value": x, "query_mask": mask, "value_mask": mask}
        cases["causal"] = Case(inputs, padding, {"use_causal_mask": True},
                               zero_rows=zero_rows(mask, mask, causal=True))  # fmt: skip
    return cases


def pooling_cases():
    return {f"T={t}": Case({"inputs": _normal(30 + t, 4, t, WIDTH), "mask": mask},
                           {"inputs": "mask"}, zero_rows=~mask.any(-1))
            for t, mask in VALUE_MASKS.items()}  # fmt: skip


def sequence_cases(*shape, **call_kwargs):
    """A position-wise layer: nothing masked, one case."""
    return {"unmasked": Case({"inputs": _normal(40, *shape)}, call_kwargs=call_kwargs)}


def encoder_cases():
    inputs = {"inputs": _normal(50, 4, 5, WIDTH), "padding_mask": VALUE_MASKS[5]}
    return {"T=5": Case(inputs, {"inputs": "padding_mask"}, output_mask="padding_mask")}


def decoder_cases():
    """A source of `S` = 0, 1, 5 steps (the decoder-only block: its cached decoding runs)."""
    target = {"decoder_sequence": _normal(60, 4, 4, WIDTH), "decoder_padding_mask": QUERY_MASK}
    padding = {
        "decoder_sequence": "decoder_padding_mask",
        "encoder_sequence": "encoder_padding_mask",
    }
    cases = {}
    for s, mask in VALUE_MASKS.items():
        source = {"encoder_sequence": _normal(61 + s, 4, s, WIDTH), "encoder_padding_mask": mask}
        cases[f"S={s}"] = Case({**target, **source}, padding, output_mask="decoder_padding_mask")
    return cases


def maker(cls, *args, **fixed):
    """`make(dtype, **overrides)`: `cls(*args, **fixed, **overrides)` under that dtype policy."""

    def make(dtype="float32", **overrides):
        return cls(*args, **{**fixed, **overrides}, dtype=dtype)

    return make


def with_numpy_weights(layer, seed=0):
    """`layer` (built) with weights drawn by NumPy: the same on every backend, biases not 0."""
    rng = np.random.default_rng(seed)
    for w in layer.trainable_weights:
        scale = w.shape[0] ** -0.5 if len(w.shape) > 1 else 0.5
        w.assign(rng.uniform(-1.0, 1.0, size=w.shape).astype("float32") * scale)
    return layer


def grouped_rotary(cls, *args, heads, **fixed):
    """`maker` for a layer with grouped-query heads (one key/value head), rotary positions and
    a learned T5 position bias over its `heads` (its table drawn at random: not zero)."""

    def make(dtype="float32", **overrides):
        rotary = ka.RotaryEmbedding(dtype=dtype)
        bias = ka.RelativePositionBias(
            heads, num_buckets=8, max_distance=16, embeddings_initializer="random_normal",
            dtype=dtype,
        )  # fmt: skip
        options = {"num_key_value_heads": 1, "rotary_embedding": rotary, "position_bias": bias,
                   **fixed, **overrides}  # fmt: skip
        return cls(*args, **options, dtype=dtype)

    return make


def with_alibi(cls, *args, **fixed):
    """`maker` for a layer with an ALiBi position bias."""

    def make(dtype="float32", **overrides):
        options = {"position_bias": ka.AlibiBias(dtype=dtype), **fixed, **overrides}
        return cls(*args, **options, dtype=dtype)

    return make


# A smooth activation: a bfloat16 rounding would flip a ReLU unit near 0, and its gradient.
SMOOTH = "gelu"
IMPLEMENTATIONS = tuple(
    {"implementation": name} for name in ("dense", "fused", "chunked", "backend")
)

ATTENTION = {
    "DotAttention": (maker(ka.DotAttention), _layer(ka.DotAttention)),
    "ScaledDotAttention": (
        maker(ka.ScaledDotAttention, scale=0.5),
        _layer(ka.ScaledDotAttention, scale=0.5),
    ),
    "AdditiveAttention": (
        maker(ka.AdditiveAttention, units=4, use_bias=True),
        _layer(ka.AdditiveAttention, units=4),
    ),
    "BilinearAttention": (maker(ka.BilinearAttention), _layer(ka.BilinearAttention)),
    "KeyValueAttention": (
        maker(ka.KeyValueAttention, key_dim=4, value_dim=3, output_dim=5),
        _layer(ka.KeyValueAttention, key_dim=4, value_dim=3, output_dim=5),
    ),
    "ScoreAttention": (
        maker(ka.ScoreAttention, score=ka.scores.AdditiveScore(units=3, use_bias=True)),
        _score_attention,
    ),
    "HardAttention": (
        maker(ka.HardAttention, temperature=0.5),
        _layer(ka.HardAttention, temperature=0.5),
    ),
    "PointerAttention": (
        maker(ka.PointerAttention, units=4, use_bias=True),
        _layer(ka.PointerAttention, units=4),
    ),
}

TABLE = {
    **{
        name: Entry(make, attention_cases(), kit={name: attention_setup(kit_make)})
        for name, (make, kit_make) in ATTENTION.items()
    },
    "MultiHeadAttention": Entry(
        grouped_rotary(ka.MultiHeadAttention, 2, 4, heads=2),
        attention_cases(causal=True),
        kit={
            "MultiHeadAttention": attention_setup(
                _layer(
                    ka.MultiHeadAttention,
                    num_heads=2,
                    key_dim=4,
                    num_key_value_heads=1,
                    rotary_embedding=ka.RotaryEmbedding(),
                    position_bias=ka.RelativePositionBias(
                        2, num_buckets=8, embeddings_initializer="random_normal"
                    ),
                ),
                weights_axis=2,
            ),
            "MultiHeadAttention(chunked)": attention_setup(_chunked, dropout=False, scores=False),
            "MultiHeadAttention(backend)": attention_setup(_backend, dropout=False, scores=False),
        },
        variants=IMPLEMENTATIONS,
        reference={"implementation": "dense"},
        decoding={
            "plain": Decoding(
                {"num_key_value_heads": None, "rotary_embedding": None, "position_bias": None}
            ),
            "grouped-query": Decoding({"rotary_embedding": None}),
            "rotary": Decoding({"num_key_value_heads": None}),
        },
    ),
    # Keras' names for grouped-query heads; with the gate and a sliding window on every path.
    "GroupedQueryAttention": Entry(
        with_alibi(ka.GroupedQueryAttention, 4, 2, 1, use_gate=True, sliding_window=2),
        attention_cases(causal=True),
        kit={
            "GroupedQueryAttention": attention_setup(
                _layer(
                    ka.GroupedQueryAttention,
                    head_dim=4,
                    num_query_heads=2,
                    num_key_value_heads=1,
                    use_gate=True,
                    sliding_window=2,
                    position_bias=ka.AlibiBias(),
                ),  # fmt: skip
                weights_axis=2,
            ),
        },
        variants=IMPLEMENTATIONS,
        reference={"implementation": "dense"},
        decoding={"windowed": Decoding()},
    ),
    "AlibiBias": Entry(
        maker(ka.AlibiBias),
        {"scores": Case({"attention_scores": _normal(70, 4, 2, 3, 5)})},
        kit={"AlibiBias": position_bias_setup(lambda dtype: ka.AlibiBias(dtype=dtype))},
    ),
    "RelativePositionBias": Entry(
        maker(
            ka.RelativePositionBias,
            2,
            num_buckets=8,
            max_distance=16,
            embeddings_initializer="random_normal",
        ),  # fmt: skip
        {"scores": Case({"attention_scores": _normal(71, 4, 2, 3, 5)})},
        kit={
            "RelativePositionBias": position_bias_setup(
                lambda dtype: ka.RelativePositionBias(
                    2, num_buckets=8, embeddings_initializer="random_normal", dtype=dtype
                )
            )
        },
    ),
    "AttentionPooling": Entry(
        maker(ka.AttentionPooling, units=4),
        pooling_cases(),
        kit={"AttentionPooling": pooling_setup},
    ),
    "SinePositionEncoding": Entry(
        maker(ka.SinePositionEncoding, max_wavelength=100),
        sequence_cases(4, 5, WIDTH, start_index=2),
        kit={"SinePositionEncoding": position_setup(sinusoidal)},
    ),
    "PositionEmbedding": Entry(
        maker(ka.PositionEmbedding, sequence_length=8),
        sequence_cases(4, 5, WIDTH, start_index=1),
        kit={"PositionEmbedding": position_setup(learned)},
    ),
    "RotaryEmbedding": Entry(
        maker(ka.RotaryEmbedding),
        {
            **sequence_cases(4, 5, WIDTH, start_index=3),
            "heads": sequence_cases(4, 5, 2, WIDTH, start_index=3)["unmasked"],
        },
        kit={
            "RotaryEmbedding": position_setup(rotary, even=True),
            "RotaryEmbedding(heads)": position_setup(rotary, rank=4, even=True),
        },
    ),
    "TokenAndPositionEmbedding": Entry(
        maker(ka.TokenAndPositionEmbedding, 20, 8, WIDTH, mask_zero=True),
        # Token id 0 is padding (an implicit mask): no float input to write content into.
        {"ids": Case({"inputs": np.where(VALUE_MASKS[5], 7, 0).astype("int32")})},
        kit={"TokenAndPositionEmbedding": token_and_position_setup},
    ),
    "FeedForward": Entry(
        maker(ka.FeedForward, intermediate_dim=16, activation=SMOOTH),
        sequence_cases(4, 5, WIDTH),
        kit={"FeedForward": position_setup(feed_forward)},
    ),
    "TransformerEncoder": Entry(
        grouped_rotary(
            ka.TransformerEncoder, 16, 2, heads=2, normalize_first=True, activation=SMOOTH
        ),
        encoder_cases(),
        kit={"TransformerEncoder": encoder_setup},
    ),
    "TransformerDecoder": Entry(
        grouped_rotary(ka.TransformerDecoder, 16, 2, heads=2, activation=SMOOTH),
        decoder_cases(),
        kit={"TransformerDecoder": decoder_setup},
        decoding={"cross-attention": Decoding(encoder=True), "decoder-only": Decoding()},
    ),
}

# The property kit's setups by label (tests/kit/test_testing_kit.py).
LAYERS = {label: setup for entry in TABLE.values() for label, setup in entry.kit.items()}
