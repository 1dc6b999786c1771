"""Pointer network (Vinyals et al., 2015): an encoder-decoder whose output points at its inputs."""

import keras

import keras_attn

from .layers import ChosenPositionsMask, PointerDecoderInputs

# ---------------------------------------------------------------------------
# Encoders: (points (B, N, d), units) -> (states (B, N, units), decoder initial state)
# ---------------------------------------------------------------------------


def _lstm_encoder(points, units):
    states, h, c = keras.layers.LSTM(
        units, return_sequences=True, return_state=True, name="encoder"
    )(points)
    return states, [h, c]


def _transformer_encoder(points, units, num_layers=2, num_heads=4):
    """Transformer blocks without positions: a set encoder (permutation-equivariant).

    The decoder's initial state comes from the mean of the encoded points (over
    the real points only: the implicit padding mask reaches the pooling).
    """
    x = keras.layers.Dense(units, name="encoder_projection")(points)  # (B, N, units)
    for i in range(num_layers):
        x = keras_attn.TransformerEncoder(
            2 * units, num_heads, name=f"encoder_block_{i}"
        )(x)  # fmt: skip
    pooled = keras.layers.GlobalAveragePooling1D(name="encoder_pooling")(x)  # (B, units)
    h = keras.layers.Dense(units, activation="tanh", name="initial_h")(pooled)
    c = keras.layers.Dense(units, name="initial_c")(pooled)
    return x, [h, c]


# An encoder: (points (B, N, d) with their padding mask, units) -> (states, [h, c]).
ENCODERS = {"lstm": _lstm_encoder, "transformer": _transformer_encoder}


# ---------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------


def pointer_network(
    input_dim: int,
    units: int,
    encoder: str = "lstm",
    attention_units: int | None = None,
    mask_chosen: bool = True,
    num_points: int | None = None,
    pad_value: float | None = None,
    name: str = "pointer_network",
) -> keras.Model:
    """Pointer network: at each output step, a distribution over the input positions.

        e_1..e_N = Encoder(x_1..x_N)
        d_i      = LSTM(x[C_(i-1)], d_(i-1)),  d_0 from the encoder state, x[C_(-1)] = go
        u_ij     = v^T tanh(W e_j + U d_i)
        p(C_i = j | C_<i, x) = softmax_j(u_ij)       (j not in C_<i with `mask_chosen`)

    The decoder is teacher-forced: its input at step `i` is the input point the
    target chose at step `i - 1` (a learned "go" vector at step 0), so the whole
    target sequence is scored in one pass. The output is the
    `keras_attn.PointerAttention` distribution itself.

    Inputs, a dict:
        "points": float `(B, N, input_dim)`, the set to point into.
        "pointers": int32 `(B, T)`, the target positions (teacher forcing).
            Padding convention: `-1` after the end of a shorter target. A
            padded step gets a zero decoder input and excludes nothing; its
            output is meaningless and must be left out of the loss
            (`SparseCategoricalCrossentropy(ignore_class=-1)`, or
            `sample_weight=(pointers >= 0)`). Output row `i` depends on
            `pointers[:, :i]` only, which is what step-by-step decoding uses
            (`keras_attn.models.decoding.pointer_decode`).

    Args:
        input_dim: width `d` of each input point (1 for sorting numbers, 2
            for planar convex hull).
        units: width of the encoder and decoder LSTMs.
        encoder: `"lstm"` (as in the paper: reads the points in order) or
            `"transformer"` (two `TransformerEncoder`s without positional
            encoding: the set's order does not matter, so permuting the
            input points permutes the output distribution the same way;
            `units` must be divisible by 4, the number of heads).
        attention_units: hidden width of the pointer score; `None` means `units`.
        mask_chosen: step `i` may not point at the positions the targets
            chose before it (`keras_attn.ops.chosen_positions_mask`): on for
            permutation tasks such as sorting, off for tasks that revisit a
            position (a closed convex hull ends where it starts).
        num_points: `N`, when fixed; `None` accepts any number of points.
        pad_value: for sets of different sizes padded to one `N`: a point
            whose features all equal `pad_value` is padding
            (`keras.layers.Masking`), skipped by the encoder and given
            probability 0 (`keras_attn.models.datasets` pads convex-hull points with
            `-1.0`). `None`: no padding.
        name: model name.

    Returns:
        A `keras.Model` with output probabilities `(B, T, N)` (not logits:
        train with `from_logits=False`). Rows sum to 1.

    Example:

    >>> model = pointer_network(input_dim=1, units=16)
    >>> points = np.random.uniform(size=(2, 5, 1)).astype("float32")
    >>> pointers = np.argsort(points[..., 0], axis=-1).astype("int32")  # sort
    >>> probs = model({"points": points, "pointers": pointers})
    >>> print(probs.shape)
    (2, 5, 5)
    >>> model.compile("adam", keras.losses.SparseCategoricalCrossentropy(ignore_class=-1))

    Reference:
        Vinyals et al., 2015, "Pointer Networks", https://arxiv.org/abs/1506.03134
    """
    if encoder not in ENCODERS:
        raise ValueError(
            f"`encoder` must be one of {sorted(ENCODERS)}. Received: encoder={encoder!r}"
        )
    if encoder == "transformer" and units % 4:
        raise ValueError(
            f"`units` must be divisible by 4 (the heads) with encoder='transformer'. "
            f"Received: units={units}"
        )

    # -- inputs ------------------------------------------------------------
    points = keras.Input((num_points, input_dim), name="points")  # (B, N, d)
    pointers = keras.Input((None,), dtype="int32", name="pointers")  # (B, T)

    # -- encoder (its outputs carry the padding mask to the pointer) --------
    masked = points if pad_value is None else keras.layers.Masking(pad_value)(points)
    encoder_states, state = ENCODERS[encoder](masked, units)  # (B, N, units)

    # -- decoder (teacher forcing: the previously chosen point) -------------
    decoder_inputs = PointerDecoderInputs(name="decoder_inputs")(points, pointers)  # (B, T, d)
    decoder_states = keras.layers.LSTM(units, return_sequences=True, name="decoder")(
        decoder_inputs, initial_state=state
    )  # (B, T, units)

    # -- pointer -----------------------------------------------------------
    chosen = ChosenPositionsMask(name="chosen")(pointers, points) if mask_chosen else None
    pointer = keras_attn.PointerAttention(attention_units or units, name="pointer")
    probs = pointer(decoder_states, encoder_states, attention_mask=chosen)  # (B, T, N)
    return keras.Model({"points": points, "pointers": pointers}, probs, name=name)
