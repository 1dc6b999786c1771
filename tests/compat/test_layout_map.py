"""`layout_map` and `check_layout` on every zoo builder and on hand-built models.

Keras' `DeviceMesh` and `LayoutMap` are plain Python until a backend lays a variable out,
so these run on any backend (device names only); the JAX training under the map is
tests/compat/test_model_parallel_jax.py.
"""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import models as zoo

# On every backend in CI (.ci/jax and .ci/torch select `backends`): the map is what the
# JAX engine reads, and the zoo's builders are the same everywhere.
pytestmark = pytest.mark.backends

MESHES = ((1, 8), (2, 4), (4, 2))  # (batch, model)
WIDE = dict(num_layers=2, num_heads=8, d_model=16, intermediate_dim=32)
BUILDERS = {
    "transformer_lm": lambda: zoo.transformer_lm(64, sequence_length=16, **WIDE),
    "transformer_lm_rotary_untied": lambda: zoo.transformer_lm(
        50, position="rotary", tie_weights=False, normalize_first=False, **WIDE
    ),
    "transformer_lm_alibi_gqa": lambda: zoo.transformer_lm(
        64, position="alibi", num_key_value_heads=8, **WIDE
    ),
    "transformer_lm_llama": lambda: zoo.transformer_lm(
        64,
        position="rotary",
        normalization="rms_norm",
        feedforward="gated",
        use_bias=False,
        qkv_bias=True,
        tie_weights=False,
        **WIDE,
    ),
    "transformer_seq2seq": lambda: zoo.transformer_seq2seq(20, 30, normalize_first=True, **WIDE),
    "transformer_classifier": lambda: zoo.transformer_classifier(
        50, 12, 3, position="learned", pooling="attention", normalize_first=True, **WIDE
    ),
    "rnn_seq2seq": lambda: zoo.rnn_seq2seq(20, 30, 8, 16),
    "rnn_seq2seq_gru_bilinear": lambda: zoo.rnn_seq2seq(
        20, 30, 8, 16, score="bilinear", cell="gru"
    ),
    "pointer_network": lambda: zoo.pointer_network(2, 16),
    "pointer_network_transformer": lambda: zoo.pointer_network(2, 16, encoder="transformer"),
    "hierarchical_attention_network": lambda: zoo.hierarchical_attention_network(
        50, 8, 8, 8, 3, 4, 6
    ),
}


def mesh(batch, model, names=("batch", "model")):
    devices = [f"cpu:{i}" for i in range(batch * model)]  # names only: nothing is placed
    return keras.distribution.DeviceMesh((batch, model), names, devices)


def axes_of(layouts, model):
    """`{path: axes}` as Keras reads the map for each variable."""
    return {v.path: tuple(layouts[v.path].axes) for v in model.variables}


def sharded_dims(axes):
    return [i for i, a in enumerate(axes) if a == "model"]


@pytest.mark.parametrize("name", list(BUILDERS))
def test_every_zoo_builder_is_covered_by_one_rule_per_variable(name):
    model = BUILDERS[name]()
    # The pointer network's Transformer encoder has 4 heads (8 devices raise: tested below).
    for shape in MESHES[1:] if name == "pointer_network_transformer" else MESHES:
        layouts = zoo.layout_map(model, mesh(*shape))
        found = zoo.check_layout(model, layouts)
        assert found.ok, (shape, found)
        by_path = {v.path: v for v in model.variables}
        for path, axes in axes_of(layouts, model).items():
            assert len(axes) == len(by_path[path].shape), path
            for dim in sharded_dims(axes):  # never a dimension the axis does not divide
                assert by_path[path].shape[dim] % shape[1] == 0, (path, shape)
            if path.endswith(("gamma", "beta", "scale", "seed_generator_state")):
                assert axes == (None,) * len(axes), path  # norms and seeds replicated


def test_transformer_lm_follows_megatron_split():
    model = BUILDERS["transformer_lm"]()
    axes = axes_of(zoo.layout_map(model, mesh(2, 4)), model)
    block = "decoder_block_1/"
    m = "model"
    assert axes[block + "self_attention/query/kernel"] == (None, m, None)  # (d, h, k)
    assert axes[block + "self_attention/key/bias"] == (m, None)  # (h, k)
    assert axes[block + "self_attention/value/kernel"] == (None, m, None)
    assert axes[block + "self_attention/attention_output/kernel"] == (m, None, None)  # (h, k, d)
    assert axes[block + "self_attention/attention_output/bias"] == (None,)
    assert axes[block + "feedforward_intermediate_dense/kernel"] == (None, m)  # (d, f)
    assert axes[block + "feedforward_intermediate_dense/bias"] == (m,)
    assert axes[block + "feedforward_output_dense/kernel"] == (m, None)  # (f, d)
    assert axes[block + "feedforward_output_dense/bias"] == (None,)
    assert axes["token_embedding/embeddings"] == (m, None)  # 64 rows: over the vocabulary
    assert axes["position_embedding/embeddings"] == (m, None)
    # One key per kind of weight, whatever the number of blocks: 2 tables, 16 weights of a
    # block, the final norm's 2, and the dropout seeds outside and inside the blocks.
    assert len(zoo.layout_map(model, mesh(2, 4))) == 2 + 16 + 2 + 2


def test_a_gated_feedforward_splits_its_gate_as_its_up_kernel():
    model = BUILDERS["transformer_lm_llama"]()
    axes = axes_of(zoo.layout_map(model, mesh(2, 4)), model)
    block, m = "decoder_block_0/", "model"
    assert axes[block + "feedforward_gate_dense/kernel"] == (None, m)  # (d, f): column-parallel
    assert axes[block + "feedforward_intermediate_dense/kernel"] == (None, m)
    assert axes[block + "feedforward_output_dense/kernel"] == (m, None)  # (f, d): row-parallel
    assert axes[block + "self_attention/query/bias"] == (m, None)  # q/k/v biases only
    assert block + "self_attention/attention_output/bias" not in axes
    assert axes[block + "self_attention_layer_norm/scale"] == (None,)


def test_tables_and_logits_fall_back_to_their_other_dimension():
    model = BUILDERS["transformer_seq2seq"]()
    on_8, on_2 = (axes_of(zoo.layout_map(model, mesh(*s)), model) for s in ((1, 8), (4, 2)))
    # 20 source tokens: over the width on 8 devices, over the vocabulary on 2.
    assert on_8["encoder_embedding/token_embedding/embeddings"] == (None, "model")
    assert on_2["encoder_embedding/token_embedding/embeddings"] == ("model", None)
    # The logits, 30 units: over the input on 8 devices (row-parallel), the units on 2.
    assert on_8["logits/kernel"] == ("model", None) and on_8["logits/bias"] == (None,)
    assert on_2["logits/kernel"] == (None, "model") and on_2["logits/bias"] == ("model",)
    untied = BUILDERS["transformer_lm_rotary_untied"]()
    axes = axes_of(zoo.layout_map(untied, mesh(1, 8)), untied)  # 50 rows: over the width
    assert axes["token_embedding/embeddings"] == (None, "model")
    assert axes["token_embedding/reverse_embeddings"] == ("model", None)  # (d, V)


def test_indivisible_key_value_heads_raise_unless_replicated():
    model = zoo.transformer_lm(50, num_layers=2, num_heads=4, d_model=16, num_key_value_heads=2)
    with pytest.raises(ValueError) as error:
        zoo.layout_map(model, mesh(2, 4))
    message = str(error.value)
    for part in ("decoder_block_0/self_attention/key/kernel", "(16, 2, 4)", "size 4",
                 "kv_heads='replicate'"):  # fmt: skip
        assert part in message
    axes = axes_of(zoo.layout_map(model, mesh(2, 4), kv_heads="replicate"), model)
    assert axes["decoder_block_0/self_attention/key/kernel"] == (None, None, None)
    assert axes["decoder_block_0/self_attention/value/bias"] == (None, None)
    assert axes["decoder_block_0/self_attention/query/kernel"] == (None, "model", None)
    # Heads that divide stay sharded with kv_heads="replicate".
    axes = axes_of(zoo.layout_map(model, mesh(4, 2), kv_heads="replicate"), model)
    assert axes["decoder_block_0/self_attention/key/kernel"] == (None, "model", None)


@pytest.mark.parametrize(
    "build, match",
    [
        (  # 4 query heads on 8 devices: no fallback for query heads
            lambda: zoo.transformer_lm(64, num_layers=1, num_heads=4, d_model=16),
            r"`decoder_block_0/self_attention/query/kernel` of shape \(16, 4, 4\) .* 'model' "
            r"of size 8: its number of heads \(4\)",
        ),
        (
            lambda: zoo.transformer_lm(64, num_layers=1, num_heads=8, intermediate_dim=36),
            r"`decoder_block_0/feedforward_intermediate_dense/kernel` of shape \(64, 36\) .* "
            r"size 8: its intermediate dimension \(36\)",
        ),
        (
            lambda: keras.Sequential([keras.Input((3,)), keras.layers.Embedding(50, 12, name="e")]),
            r"/e/embeddings` of shape \(50, 12\) .* size 8: neither its 50 rows .* "
            r"nor its width 12",
        ),
        (
            lambda: zoo.rnn_seq2seq(20, 30, 8, 12),
            r"`logits/kernel` of shape \(12, 30\) \(the output layer 'logits'\) .* size 8",
        ),
    ],
)
def test_an_indivisible_dimension_raises_naming_the_weight(build, match):
    with pytest.raises(ValueError, match=match):
        zoo.layout_map(build(), mesh(1, 8))


def test_bad_arguments_raise():
    model = zoo.transformer_lm(64, num_layers=1, num_heads=2, d_model=8, intermediate_dim=8)
    with pytest.raises(ValueError, match=r"`model_axis` must name an axis .* model_axis='heads'"):
        zoo.layout_map(model, mesh(1, 2), model_axis="heads")
    with pytest.raises(ValueError, match="`batch_axis` must name an axis"):
        zoo.layout_map(model, mesh(1, 2), batch_axis="data")
    with pytest.raises(ValueError, match="must be different mesh axes"):
        zoo.layout_map(model, mesh(1, 2), batch_axis="model")
    assert zoo.check_layout(
        model, zoo.layout_map(model, mesh(2, 1, ("x", "model")), batch_axis=None)
    ).ok
    with pytest.raises(ValueError, match="`kv_heads` must be one of"):
        zoo.layout_map(model, mesh(1, 2), kv_heads="shard")
    with pytest.raises(TypeError, match="`device_mesh` must be a keras.distribution.DeviceMesh"):
        zoo.layout_map(model, (1, 2))
    with pytest.raises(TypeError, match="`model` must be a Keras model"):
        zoo.layout_map("model", mesh(1, 2))
    with pytest.raises(ValueError, match="must be built"):
        zoo.layout_map(keras.layers.Dense(4), mesh(1, 2))
    with pytest.raises(TypeError, match="`layout_map` must be a keras.distribution.LayoutMap"):
        zoo.check_layout(model, {})


def test_check_layout_finds_unmatched_ambiguous_and_unused():
    model = zoo.transformer_lm(64, num_layers=2, num_heads=2, d_model=8, intermediate_dim=8)
    layouts = zoo.layout_map(model, mesh(1, 2))
    assert zoo.check_layout(model, layouts).ok
    query = r"decoder_block(_\d+)*/self_attention(_\d+)*/query(_\d+)*/kernel"
    assert query in layouts
    del layouts[query]
    layouts[".*/query/kernel_typo"] = (None, None, None)
    layouts[r"final_norm/.*"] = (None,)  # overlaps the map's own keys of final_norm
    found = zoo.check_layout(model, layouts)
    assert found.unmatched == tuple(
        f"decoder_block_{i}/self_attention/query/kernel" for i in (0, 1)
    )
    assert found.ambiguous == ("final_norm/gamma", "final_norm/beta")
    assert found.unused == (".*/query/kernel_typo",)
    assert not found.ok


def hand_built(vocabulary=32):
    """A model of our layers, Keras' attention and auto-named layers."""
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(vocabulary, 16)(tokens)
    x = x + keras.layers.MultiHeadAttention(4, 4)(x, x)  # Keras' own: the same kernels
    x = x + keras_attn.MultiHeadAttention(4, 4, num_key_value_heads=2)(x, x)
    x = keras.layers.LayerNormalization()(x + keras_attn.FeedForward(32)(x))
    bias = keras_attn.RelativePositionBias(num_heads=4)
    x = x + keras_attn.MultiHeadAttention(4, 4, position_bias=bias)(x, x)
    x = keras.layers.Dense(8, activation="relu")(x)  # inside the model: replicated
    # Named: auto-named, it would share the hidden Dense's key (`dense(_\d+)*/kernel`) with
    # another split, and the map would key both by their exact paths instead.
    return keras.Model(tokens, keras.layers.Dense(vocabulary, name="logits")(x))


def test_hand_built_models_and_rebuilds_with_other_names():
    first = hand_built()
    layouts = zoo.layout_map(first, mesh(2, 2))
    assert zoo.check_layout(first, layouts).ok
    second = hand_built()  # auto-named again: dense_1, multi_head_attention_3, ...
    assert len({v.path for v in second.variables} & {v.path for v in first.variables}) == 2
    assert zoo.check_layout(second, layouts).ok
    axes = axes_of(layouts, second)
    kernels = {p: a for p, a in axes.items() if p.endswith("kernel")}
    by_end = lambda end: [a for p, a in kernels.items() if p.endswith(end)]  # noqa: E731
    assert by_end("query/kernel") == [(None, "model", None)] * 3  # Keras' MHA and ours
    assert by_end("/intermediate/kernel") == [(None, "model")]
    assert by_end("/output/kernel") == [("model", None)]
    assert [a for p, a in axes.items() if p.endswith("relative_attention_bias")] == [
        (None, "model")
    ]
    assert by_end("logits/kernel") == [(None, "model")]  # 32 units
    assert [a for p, a in kernels.items() if p.startswith("dense")] == [(None, None)]


def test_layers_numbered_alike_with_different_splits_get_keys_of_their_own():
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(32, 16)(tokens)
    x = keras_attn.MultiHeadAttention(4, 4, num_key_value_heads=4, name="attention_1")(x, x)
    x = keras_attn.MultiHeadAttention(4, 4, num_key_value_heads=1, name="attention_2")(x, x)
    model = keras.Model(tokens, x)
    layouts = zoo.layout_map(model, mesh(1, 2), kv_heads="replicate")
    assert zoo.check_layout(model, layouts).ok
    axes = axes_of(layouts, model)
    assert axes["attention_1/key/kernel"] == (None, "model", None)
    assert axes["attention_2/key/kernel"] == (None, None, None)
    assert "attention_1/key/kernel" in layouts  # the exact path, escaped


def test_a_model_built_for_its_shapes_only_gives_the_same_map():
    with keras.StatelessScope(initialize_variables=False):
        shapes_only = BUILDERS["transformer_lm"]()
        from_shapes = zoo.layout_map(shapes_only, mesh(2, 4))
    keras.backend.clear_session(free_memory=False)
    model = BUILDERS["transformer_lm"]()
    layouts = zoo.layout_map(model, mesh(2, 4))
    assert {k: layouts[k].axes for k in layouts} == {k: from_shapes[k].axes for k in from_shapes}
    assert zoo.check_layout(model, from_shapes).ok
    assert np.all(np.isfinite(model.get_weights()[0]))
