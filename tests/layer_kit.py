"""The property kit's setups, one per layer (and per code path that needs its own arguments).

Drawn by tests/kit/test_testing_kit.py (through `layer_table.LAYERS`): each `setup(pick)` builds
a layer, its inputs and call options, and says which checks apply.
"""

import dataclasses

import keras
import numpy as np

import keras_attn as ka

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
WIDTH = 8


def normal(pick, *shape):
    return np.random.default_rng(pick.int(0, 9999)).normal(size=shape).astype("float32")


@dataclasses.dataclass
class Setup:
    """A layer, its inputs and call options, and which checks apply (with their arguments)."""

    layer: keras.layers.Layer
    inputs: dict
    call_kwargs: dict
    padding: dict | None = None  # assert_padding_invariance(padding=..., **padding_kwargs)
    padding_kwargs: dict = dataclasses.field(default_factory=dict)
    causal: dict | None = None  # assert_causal_invariance(**causal)
    empty: int | None = None  # assert_fully_masked_rows_safe(empty=...)
    zero_outputs: bool = True


def attention_setup(make, weights_axis=1, dropout=True, scores=True, nonfinite=True):
    """The query/value attention layers: one signature, one setup."""

    def setup(pick):
        policy = pick.choice(POLICIES)
        training = dropout and pick.bool()
        return_scores = scores and pick.bool()
        causal = pick.bool()
        single_query = not causal and pick.bool()
        batch = pick.int(2, 3)
        tq, tv = (pick.int(2, 6),) * 2 if causal else (pick.int(1, 5), pick.int(1, 6))
        value_mask = pick.mask(batch, tv)
        value_mask[0] = False  # example 0 sees nothing
        inputs = {"value": normal(pick, batch, tv, WIDTH), "value_mask": value_mask}
        padding = {"value": "value_mask"}
        if single_query:
            inputs["query"] = normal(pick, batch, WIDTH)
            inputs["query_mask"] = pick.mask(batch, 1)[:, 0]
        else:
            inputs["query"] = normal(pick, batch, tq, WIDTH)
            inputs["query_mask"] = pick.mask(batch, tq)
            padding["query"] = "query_mask"
        kwargs = {"use_causal_mask": causal, "return_attention_scores": return_scores}
        if training:
            kwargs["training"] = True
        time_axes = (1, weights_axis) if return_scores else 1
        return Setup(
            make(dtype=policy, dropout=0.3 if training else 0.0),
            inputs,
            kwargs,
            padding=padding,
            padding_kwargs={"nonfinite": nonfinite and pick.bool()},
            causal={"sequences": ["query", "value"], "time_axes": time_axes} if causal else None,
            empty=0,
        )

    return setup


def pooling_setup(pick):
    batch, length = pick.int(2, 3), pick.int(1, 6)
    mask = pick.mask(batch, length)
    mask[0] = False
    training = pick.bool()
    kwargs = {"return_attention_scores": pick.bool(), **({"training": True} if training else {})}
    layer = ka.AttentionPooling(
        units=4, dropout=0.3 if training else 0.0, seed=1, dtype=pick.choice(POLICIES)
    )
    inputs = {"inputs": normal(pick, batch, length, WIDTH), "mask": mask}
    return Setup(
        layer,
        inputs,
        kwargs,
        padding={"inputs": "mask"},
        padding_kwargs={"nonfinite": pick.bool()},
        empty=0,
    )


def position_setup(make, rank=3, even=False):
    """Position-wise layers: the output at step t depends on step t (and the position) only."""

    def setup(pick):
        batch, length = pick.int(2, 3), pick.int(2, 6)
        width = 2 * pick.int(1, 4) if even else pick.int(1, 8)
        shape = (batch, length) + ((pick.int(1, 3),) if rank == 4 else ()) + (width,)
        layer, kwargs = make(pick, length)
        return Setup(layer, {"inputs": normal(pick, *shape)}, kwargs, causal={})

    return setup


def sinusoidal(pick, length):
    layer = ka.SinePositionEncoding(max_wavelength=100, dtype=pick.choice(POLICIES))
    return layer, {"start_index": pick.int(0, 5)}


def learned(pick, length):
    layer = ka.PositionEmbedding(sequence_length=8, dtype=pick.choice(POLICIES))
    return layer, {"start_index": pick.int(0, 8 - length)}


def rotary(pick, length):
    layout = pick.choice(("half", "interleaved"))
    layer = ka.RotaryEmbedding(layout=layout, dtype=pick.choice(POLICIES))
    return layer, {"start_index": pick.int(0, 5)}


def feed_forward(pick, length):
    training = pick.bool()
    layer = ka.FeedForward(
        intermediate_dim=16, dropout=0.3 if training else 0.0, seed=1, dtype=pick.choice(POLICIES)
    )
    return layer, {"training": True} if training else {}


def position_bias_setup(make):
    """The position biases called on scores `(B, h, Tq, Tv)`: no mask, position-wise per score."""

    def setup(pick):
        batch, heads, tq, tv = pick.int(2, 3), 2, pick.int(1, 5), pick.int(1, 6)
        layer = make(pick.choice(POLICIES))
        return Setup(layer, {"attention_scores": normal(pick, batch, heads, tq, tv)}, {})

    return setup


def token_and_position_setup(pick):
    batch, length = pick.int(2, 3), pick.int(2, 7)
    ids = np.random.default_rng(pick.int(0, 9999)).integers(1, 20, size=(batch, length))
    ids = np.where(pick.mask(batch, length), ids, 0).astype("int32")
    position = pick.choice(("sinusoidal", "learned"))
    layer = ka.TokenAndPositionEmbedding(
        20, 10, 6, mask_zero=True, position=position, dtype=pick.choice(POLICIES)
    )
    return Setup(
        layer,
        {"inputs": ids},
        {},
        padding={"inputs": ids != 0},
        padding_kwargs={"pad_value": 0},
        causal={},
    )


def block_options(pick):
    training = pick.bool()
    options = {
        "normalize_first": pick.bool(),
        "dropout": 0.2 if training else 0.0,
        "attention_dropout": 0.2 if training else 0.0,
        "seed": 3,
        "dtype": pick.choice(POLICIES),
    }
    if pick.bool():  # grouped-query heads with rotary positions
        options.update(num_key_value_heads=1, rotary_embedding=ka.RotaryEmbedding())
    return options, training


def encoder_setup(pick):
    options, training = block_options(pick)
    batch, length = pick.int(2, 3), pick.int(2, 6)
    mask = pick.mask(batch, length)
    mask[0] = False
    causal, return_scores = pick.bool(), pick.bool()
    kwargs = {"use_causal_mask": causal, "return_attention_scores": return_scores}
    if training:
        kwargs["training"] = True
    return Setup(
        ka.TransformerEncoder(intermediate_dim=16, num_heads=2, **options),
        {"inputs": normal(pick, batch, length, WIDTH), "padding_mask": mask},
        kwargs,
        padding={"inputs": "padding_mask"},
        padding_kwargs={"output_mask": "padding_mask"},  # padded rows keep their residual
        causal={"sequences": ["inputs"], "time_axes": (1, 2) if return_scores else 1}
        if causal
        else None,
        empty=0,
        zero_outputs=False,
    )


def decoder_setup(pick):
    options, training = block_options(pick)
    batch, length = pick.int(2, 3), pick.int(2, 6)
    decoder_mask = pick.mask(batch, length)
    inputs = {"decoder_sequence": normal(pick, batch, length, WIDTH)}
    inputs["decoder_padding_mask"] = decoder_mask
    padding = {"decoder_sequence": "decoder_padding_mask"}
    cross = pick.bool()
    if cross:
        source_length = pick.int(1, 5)
        source_mask = pick.mask(batch, source_length)
        source_mask[0] = False
        inputs["encoder_sequence"] = normal(pick, batch, source_length, WIDTH)
        inputs["encoder_padding_mask"] = source_mask
        padding["encoder_sequence"] = "encoder_padding_mask"
    else:
        decoder_mask[0] = False
    return_scores = pick.bool()
    kwargs = {"return_attention_scores": return_scores}
    if training:
        kwargs["training"] = True
    return Setup(
        ka.TransformerDecoder(intermediate_dim=16, num_heads=2, **options),
        inputs,
        kwargs,
        padding=padding,
        padding_kwargs={"output_mask": "decoder_padding_mask"},
        causal={
            "sequences": ["decoder_sequence"],
            "time_axes": (1, 2, 2)[: 1 + return_scores * (1 + cross)],
        },
        empty=0,
        zero_outputs=False,
    )


def _layer(cls, **fixed):
    def make(dtype, dropout):
        return cls(**fixed, dropout=dropout, seed=1, dtype=dtype)

    return make


def _score_attention(dtype, dropout):
    score = ka.scores.AdditiveScore(units=3, use_bias=True, dtype=dtype)
    return ka.ScoreAttention(score=score, dropout=dropout, seed=1, dtype=dtype)


def _chunked(dtype, dropout):
    return ka.MultiHeadAttention(2, 4, implementation="chunked", dtype=dtype)


def _backend(dtype, dropout):
    return ka.MultiHeadAttention(2, 4, implementation="backend", dtype=dtype)
