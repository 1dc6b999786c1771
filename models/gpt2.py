"""`from_gpt2_backbone`: a keras-hub GPT-2 backbone's weights in a `transformer_lm`."""

import keras
import numpy as np

from .layers import gelu_approximate
from .transformer_lm import transformer_lm


def from_gpt2_backbone(backbone, sequence_length: int | None = None, **kwargs) -> keras.Model:
    """A `transformer_lm` with the weights of a `keras_hub.models.GPT2Backbone`.

    The model runs GPT-2 on this library's layers and kernels (chunked
    attention for long contexts, the KV cache with valid positions,
    `keras_attn.models.generate`) with GPT-2's logits (equal to 1e-5 to
    `keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)`'s; tested on
    a small random backbone).

    **Token ids are shifted by one**: in this zoo token 0 is padding, while
    GPT-2's token 0 is `"!"`. GPT-2's token `t` is the model's token `t + 1`:
    feed `ids + 1`, read `logits[..., 1:]` (GPT-2's `vocabulary_size`
    logits; column 0, padding, is never generated), and subtract 1 from
    generated tokens.

    The weights, keras-hub's (`GPT2Backbone`) -> this model's layers:

    - `token_embedding.embeddings` `(V, d)` -> `token_embedding.embeddings`
      rows `1..V` (row 0, padding, zeros); the output projection is tied to it
      in both;
    - `position_embedding.position_embeddings` `(L, d)` ->
      `position_embedding` (learned, `L` rows);
    - `transformer_layer_{i}` -> `decoder_block_{i}`: the same sublayers,
      names and weight order (query, key, value, output kernels and biases,
      `self_attention_layer_norm`, `feedforward_intermediate_dense`,
      `feedforward_output_dense`, `feedforward_layer_norm`):
      `TransformerDecoder` is a drop-in for keras-hub's
      `TransformerDecoder`, so `set_weights(get_weights())` copies a block;
    - `layer_norm` -> `final_norm`;

    and the configuration: `vocabulary_size + 1 -> vocab_size`, `hidden_dim
    -> d_model`, `max_sequence_length -> sequence_length`, `num_layers`,
    `num_heads`, `intermediate_dim`, `dropout`; GPT-2's pre-norm blocks,
    tanh-approximated GELU and `layer_norm_epsilon=1e-5`.

    Args:
        backbone: a `keras_hub.models.GPT2Backbone` (any size; e.g.
            `GPT2Backbone.from_preset(...)`).
        sequence_length: rows of the learned position table; by default
            the backbone's `max_sequence_length` (GPT-2 has no more).
        **kwargs: other `transformer_lm` arguments (e.g.
            `implementation="chunked"`, `name`).

    Returns:
        A `keras.Model` from `transformer_lm`, weights copied.

    Example:

    >>> import keras_hub
    >>> backbone = keras_hub.models.GPT2Backbone(
    ...     vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=8,
    ...     intermediate_dim=16, max_sequence_length=16)
    >>> model = from_gpt2_backbone(backbone)
    >>> ids = np.array([[0, 7, 3]], "int32")  # GPT-2's ids
    >>> print(model(ids + 1)[..., 1:].shape)
    (1, 3, 50)
    """
    if type(backbone).__name__ != "GPT2Backbone":
        raise TypeError(
            "`backbone` must be a keras_hub.models.GPT2Backbone. "
            f"Received: backbone of type {type(backbone).__name__}"
        )
    options = dict(
        num_layers=backbone.num_layers,
        num_heads=backbone.num_heads,
        d_model=backbone.hidden_dim,
        intermediate_dim=backbone.intermediate_dim,
        position="learned",
        sequence_length=sequence_length or backbone.max_sequence_length,
        dropout=backbone.dropout,
        activation=gelu_approximate,
        layer_norm_epsilon=1e-5,
        normalize_first=True,
        tie_weights=True,
        name="gpt2_lm",
    )
    options.update(kwargs)
    model = transformer_lm(backbone.vocabulary_size + 1, **options)
    table = keras.ops.convert_to_numpy(backbone.token_embedding.embeddings)  # (V, d)
    model.get_layer("token_embedding").set_weights(
        [np.concatenate([np.zeros_like(table[:1]), table])]
    )
    positions = keras.ops.convert_to_numpy(backbone.position_embedding.position_embeddings)
    ours = model.get_layer("position_embedding")
    rows = ours.sequence_length
    if rows > len(positions):
        raise ValueError(
            f"`sequence_length` must be at most the backbone's max_sequence_length "
            f"({len(positions)}): GPT-2 has no more positions. Received: sequence_length={rows}"
        )
    ours.set_weights([positions[:rows]])
    for i, layer in enumerate(backbone.transformer_layers):
        model.get_layer(f"decoder_block_{i}").set_weights(layer.get_weights())
    model.get_layer("final_norm").set_weights(backbone.layer_norm.get_weights())
    return model
