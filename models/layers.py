"""Small glue layers of the model zoo: reshapes, masks and gathers.

The zoo models must reload with `keras.saving.load_model(path, safe_mode=True)`,
so they hold no `Lambda` layers: each piece of glue is a layer here,
registered with `package="keras_attn.models"`, with a `get_config`.
"""

import keras
import numpy as np
from keras import ops as kops

from keras_attn import ops as attn_ops

_REGISTER = keras.saving.register_keras_serializable(package="keras_attn.models")


# ---------------------------------------------------------------------------
# Reshapes (hierarchical models: sentences of words)
# ---------------------------------------------------------------------------


@_REGISTER
class FoldIntoBatch(keras.layers.Layer):
    """Merges the first two axes: `(B, S, ...) -> (B * S, ...)`.

    Lets a sequence layer run over every sentence of every document at once.
    A mask `(B, S, W)` is folded the same way. The axes after the second must
    be known.

    Example:

    >>> print(FoldIntoBatch()(np.zeros((2, 3, 4))).shape)
    (6, 4)
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, inputs):
        return kops.reshape(inputs, (-1,) + tuple(inputs.shape[2:]))  # (B * S, ...)

    def compute_mask(self, inputs, mask=None):
        if mask is None or len(mask.shape) < 3:
            return None
        return kops.reshape(mask, (-1,) + tuple(mask.shape[2:]))

    def compute_output_shape(self, inputs_shape):
        batch, size = inputs_shape[0], inputs_shape[1]
        folded = None if batch is None or size is None else batch * size
        return (folded,) + tuple(inputs_shape[2:])


@_REGISTER
class UnfoldFromBatch(keras.layers.Layer):
    """Splits the first axis: `(B * S, ...) -> (B, S, ...)`, the inverse of `FoldIntoBatch`.

    Args:
        size: `S`, the length of the new second axis.

    Example:

    >>> print(UnfoldFromBatch(3)(np.zeros((6, 4))).shape)
    (2, 3, 4)
    """

    def __init__(self, size, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise ValueError(f"`size` must be a positive integer. Received: size={size!r}")
        self.size = size
        self.supports_masking = True

    def call(self, inputs):
        return kops.reshape(inputs, (-1, self.size) + tuple(inputs.shape[1:]))  # (B, S, ...)

    def compute_mask(self, inputs, mask=None):
        if mask is None:
            return None
        return kops.reshape(mask, (-1, self.size) + tuple(mask.shape[1:]))

    def compute_output_shape(self, inputs_shape):
        batch = None if inputs_shape[0] is None else inputs_shape[0] // self.size
        return (batch, self.size) + tuple(inputs_shape[1:])

    def get_config(self):
        config = super().get_config()
        config.update({"size": self.size})
        return config


# ---------------------------------------------------------------------------
# Masks
# ---------------------------------------------------------------------------


@_REGISTER
class MeanPooling(keras.layers.Layer):
    """The mean over the real (unmasked) steps: the baseline of attention pooling.

        v = sum_t m_t h_t / max(1, sum_t m_t)

    Same calls as `keras_attn.AttentionPooling`, so a model swaps one for the
    other: the weights it returns are the uniform `m_t / sum_t m_t`. A sequence
    with no real step pools to zeros (never NaN, unlike an average that divides
    by the mask's sum).

    Call arguments:
        inputs: `(B, T, D)`.
        mask: optional boolean `(B, T)`; Keras passes the implicit mask.
        return_attention_scores: also return the weights `(B, T)`.

    Example:

    >>> h = np.array([[[1.0], [3.0], [9.0]], [[5.0], [7.0], [0.0]]], "float32")
    >>> mask = np.array([[True, True, False], [False, False, False]])
    >>> v, w = MeanPooling()(h, mask=mask, return_attention_scores=True)
    >>> print(keras.ops.convert_to_numpy(v)[:, 0], keras.ops.convert_to_numpy(w)[0])
    [2. 0.] [0.5 0.5 0. ]
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, inputs, mask=None, return_attention_scores=False):
        if mask is None:
            mask = kops.ones(kops.shape(inputs)[:-1], dtype="bool")
        weights = kops.cast(mask, inputs.dtype)
        weights = weights / kops.maximum(kops.sum(weights, axis=-1, keepdims=True), 1.0)
        pooled = kops.einsum("bt,btd->bd", weights, inputs)
        return (pooled, weights) if return_attention_scores else pooled

    def compute_mask(self, inputs, mask=None):
        return None

    def compute_output_shape(self, inputs_shape):
        return (inputs_shape[0], inputs_shape[-1])

    def compute_output_spec(self, inputs, mask=None, return_attention_scores=False):
        pooled = keras.KerasTensor(self.compute_output_shape(inputs.shape), inputs.dtype)
        if not return_attention_scores:
            return pooled
        return pooled, keras.KerasTensor(tuple(inputs.shape[:-1]), inputs.dtype)


@_REGISTER
class PaddingMask(keras.layers.Layer):
    """`any(tokens != 0, axis=-1)`: which groups hold at least one real token.

    For documents `(B, S, W)` this is the sentence mask `(B, S)`: a sentence
    made only of padding (token 0) is `False`.

    Example:

    >>> tokens = np.array([[[4, 2, 0], [0, 0, 0]]])
    >>> print(keras.ops.convert_to_numpy(PaddingMask()(tokens)))
    [[ True False]]
    """

    def call(self, tokens):
        return kops.any(kops.not_equal(tokens, 0), axis=-1)

    def compute_output_shape(self, tokens_shape):
        return tuple(tokens_shape[:-1])

    def compute_output_spec(self, tokens):
        return keras.KerasTensor(self.compute_output_shape(tokens.shape), dtype="bool")


@_REGISTER
class ChosenPositionsMask(keras.layers.Layer):
    """Pointer decoding mask: step `i` may not point at `pointers[:, :i]`.

    A layer around `keras_attn.ops.chosen_positions_mask`. Negative pointers
    (padding) exclude nothing.

    Call arguments:
        pointers: `(B, T)` integer positions chosen at each step.
        inputs: `(B, N, ...)` the sequence pointed into (only `N` is used).

    Returns:
        Boolean `(B, T, N)`, `False` where position `j` was chosen before step `i`.

    Example:

    >>> mask = ChosenPositionsMask()(np.array([[2, 0]]), np.zeros((1, 3, 1)))
    >>> print(keras.ops.convert_to_numpy(mask)[0, 1])
    [ True  True False]
    """

    def call(self, pointers, inputs):
        return attn_ops.chosen_positions_mask(kops.cast(pointers, "int32"), kops.shape(inputs)[1])

    def compute_output_shape(self, pointers_shape, inputs_shape):
        return tuple(pointers_shape) + (inputs_shape[1],)

    def compute_output_spec(self, pointers, inputs):
        shape = self.compute_output_shape(pointers.shape, inputs.shape)
        return keras.KerasTensor(shape, dtype="bool")


# ---------------------------------------------------------------------------
# Gathers
# ---------------------------------------------------------------------------


@_REGISTER
class PointerDecoderInputs(keras.layers.Layer):
    """Pointer-network decoder inputs: the input chosen at the previous step.

        d_0 = go,   d_i = x[pointers[i - 1]]   (i >= 1)

    with `go (d,)` a learned vector. This is teacher forcing with the target
    pointers shifted right by one step. A negative pointer (padding) gives a
    zero input at the next step.

    Args:
        go_initializer: initializer of the "go" vector.

    Call arguments:
        inputs: `(B, N, d)` the input points.
        pointers: `(B, T)` integer positions (targets in training, the
            decoded positions so far in decoding).

    Returns:
        `(B, T, d)`.

    Example:

    >>> points = np.arange(6, dtype="float32").reshape(1, 3, 2)
    >>> layer = PointerDecoderInputs(go_initializer="ones")
    >>> print(keras.ops.convert_to_numpy(layer(points, np.array([[2, 0, 1]])))[0])
    [[1. 1.]
     [4. 5.]
     [0. 1.]]
    """

    def __init__(self, go_initializer="random_normal", **kwargs):
        super().__init__(**kwargs)
        self.go_initializer = keras.initializers.get(go_initializer)

    def build(self, inputs_shape, pointers_shape):
        if len(inputs_shape) != 3 or inputs_shape[-1] is None:
            raise ValueError(
                "`inputs` must have rank 3 with a known last axis. "
                f"Received: inputs.shape={tuple(inputs_shape)}"
            )
        self.go = self.add_weight(
            name="go", shape=(inputs_shape[-1],), initializer=self.go_initializer
        )

    def call(self, inputs, pointers):
        previous = kops.cast(pointers[:, :-1], "int32")  # (B, T - 1)
        valid = kops.expand_dims(kops.greater_equal(previous, 0), -1)  # (B, T - 1, 1)
        index = kops.expand_dims(kops.maximum(previous, 0), -1)  # (B, T - 1, 1)
        chosen = kops.take_along_axis(inputs, index, axis=1)  # (B, T - 1, d)
        chosen = kops.where(valid, chosen, kops.zeros_like(chosen))
        go = kops.broadcast_to(
            kops.cast(self.go, inputs.dtype), (kops.shape(inputs)[0], 1, inputs.shape[-1])
        )
        return kops.concatenate([go, chosen], axis=1)  # (B, T, d)

    def compute_output_shape(self, inputs_shape, pointers_shape):
        return (inputs_shape[0], pointers_shape[1], inputs_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update({"go_initializer": keras.initializers.serialize(self.go_initializer)})
        return config


# ---------------------------------------------------------------------------
# Language models
# ---------------------------------------------------------------------------


@_REGISTER
class TokenPositions(keras.layers.Layer):
    """Each token's position among the real tokens of its row: `max(cumsum(real) - 1, 0)`.

    `real` is `tokens != padding_id`. The positions a language model embeds, so
    that padding on either side moves no real token: a left-padded row gets the
    positions of the same row unpadded (a right-padded one `0, 1, ...` anyway).
    Padded steps get the position of the real token before them (0 before the
    first). A row without padding gets `0, 1, ..., T - 1`.

    Args:
        padding_id: the id that marks padding (the zoo's 0; -1 for a model whose
            every id is a token, such as a Hugging Face checkpoint's).

    Example:

    >>> print(keras.ops.convert_to_numpy(TokenPositions()(np.array([[0, 0, 7, 8, 9]]))))
    [[0 0 0 1 2]]
    """

    def __init__(self, padding_id=0, **kwargs):
        super().__init__(**kwargs)
        self.padding_id = check_padding_id(padding_id)

    def call(self, tokens):
        real = kops.cast(kops.not_equal(tokens, self.padding_id), "int32")
        return kops.maximum(kops.cumsum(real, axis=-1) - 1, 0)  # (B, T)

    def compute_output_spec(self, tokens):
        return keras.KerasTensor(tokens.shape, dtype="int32")

    def get_config(self):
        config = super().get_config()
        config.update({"padding_id": self.padding_id})
        return config


@_REGISTER
class TokenPadding(keras.layers.Layer):
    """A language model's token ids and padding mask, for a padding id other than 0.

        real = tokens != padding_id,   ids = where(real, tokens, 0)

    The zoo's token embeddings take their mask from id 0 (`mask_zero=True`); a
    model whose id 0 is a real token (a Hugging Face checkpoint's) marks
    padding with another id, usually -1 (outside the vocabulary): this layer
    gives the embedding ids it can look up (padding read as row 0, masked) and
    the mask the blocks take (`decoder_padding_mask`).

    Args:
        padding_id: a negative int (no id of the vocabulary is padding).

    Returns:
        `(ids, real)`: int32 `(B, T)` and bool `(B, T)`.

    Example:

    >>> ids, real = TokenPadding(-1)(np.array([[0, 7, -1]]))
    >>> print(keras.ops.convert_to_numpy(ids), keras.ops.convert_to_numpy(real))
    [[0 7 0]] [[ True  True False]]
    """

    def __init__(self, padding_id=-1, **kwargs):
        super().__init__(**kwargs)
        self.padding_id = check_padding_id(padding_id)

    def call(self, tokens):
        tokens = kops.cast(tokens, "int32")
        real = kops.not_equal(tokens, self.padding_id)
        return kops.where(real, tokens, 0), real  # (B, T), (B, T)

    def compute_output_spec(self, tokens):
        return (
            keras.KerasTensor(tokens.shape, dtype="int32"),
            keras.KerasTensor(tokens.shape, dtype="bool"),
        )

    def get_config(self):
        config = super().get_config()
        config.update({"padding_id": self.padding_id})
        return config


@_REGISTER
class DropMask(keras.layers.Layer):
    """`inputs` as they are, without their Keras mask.

    Before a layer that takes no mask (a language model's reverse embedding, whose
    `mask_zero` is off when id 0 is a real token): the mask ends here, where Keras would
    otherwise warn that it is dropped.

    Example:

    >>> print(keras.ops.convert_to_numpy(DropMask()(np.ones((1, 2)))))
    [[1. 1.]]
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, inputs):
        return kops.copy(inputs)  # a new tensor: the mask is an attribute of the input's

    def compute_mask(self, inputs, mask=None):
        return None


def check_padding_id(padding_id):
    """`padding_id` as a Python int: 0 (the zoo's padding) or negative (outside the vocabulary)."""
    if isinstance(padding_id, bool) or not isinstance(padding_id, int | np.integer):
        raise TypeError(f"`padding_id` must be an int. Received: padding_id={padding_id!r}")
    if padding_id > 0:
        raise ValueError(
            "`padding_id` must be 0 (the zoo's padding) or negative (an id outside the "
            "vocabulary: every id in [0, vocab_size) is a token). "
            f"Received: padding_id={padding_id}"
        )
    return int(padding_id)


@keras.saving.register_keras_serializable(package="keras_attn.models")
def gelu_approximate(x):
    """GELU with the tanh approximation (GPT-2's activation; keras-hub's `gelu_approximate`)."""
    return keras.activations.gelu(x, approximate=True)
