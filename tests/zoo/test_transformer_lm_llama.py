"""`transformer_lm` as the Llama family: tiny random Hugging Face models (`LlamaForCausalLM`
with Llama 3's rope scaling, `Qwen2ForCausalLM`, `MistralForCausalLM` with a sliding window),
their weights copied by hand, give the same logits; compiled generation reads the gated
feed-forward's kernels before its loop; the arguments are checked.

The weight copy below is the test's (a preview of a converter): Hugging Face's `Linear`
weights are `(out, in)`, ours `(in, out)`, with the heads split out of the attention's
`(d, h * k)` as `(d, h, k)` (head-major, as transformers' `view(..., h, k)`).
"""

import contextlib

import keras
import numpy as np
import pytest
from hf_models import tiny_causal_lm

from keras_attn.models import generate, transformer_lm

pytestmark = pytest.mark.backends  # the copy and the logits on every backend

VOCAB, D, HEADS, KV_HEADS, FF, LAYERS = 50, 32, 4, 2, 64, 2
RMS_EPS = 1e-5


def np_(x):
    return keras.ops.convert_to_numpy(x)


def _hf_model(family, **config):
    return tiny_causal_lm(
        family, VOCAB, D, HEADS, KV_HEADS, FF, LAYERS, rms_norm_eps=RMS_EPS,
        attn_implementation="eager", **config,
    )  # fmt: skip


def _copy_weights(hf, model):
    """A Hugging Face Llama-family causal LM's weights into a `transformer_lm`."""
    state = {name: w.detach().numpy() for name, w in hf.state_dict().items()}
    heads, head_dim = HEADS, D // HEADS
    embedding = model.get_layer("token_embedding")
    embedding.embeddings.assign(state["model.embed_tokens.weight"])  # (V, d)
    if not embedding.tie_weights:
        embedding.reverse_embeddings.assign(state["lm_head.weight"].T)  # (d, V)
    for i in range(LAYERS):
        prefix, block = f"model.layers.{i}.", model.get_layer(f"decoder_block_{i}")
        attention = block._self_attention_layer
        for ours, theirs in (
            ("_query_dense", "q_proj"),
            ("_key_dense", "k_proj"),
            ("_value_dense", "v_proj"),
        ):
            dense = getattr(attention, ours)
            kernel = state[f"{prefix}self_attn.{theirs}.weight"].T  # (d, n * k)
            dense.kernel.assign(kernel.reshape(D, -1, head_dim))
            if dense.bias is not None:
                dense.bias.assign(state[f"{prefix}self_attn.{theirs}.bias"].reshape(-1, head_dim))
        output = state[f"{prefix}self_attn.o_proj.weight"].T  # (h * k, d)
        attention._output_dense.kernel.assign(output.reshape(heads, head_dim, D))
        for ours, theirs in (
            ("gate", "gate_proj"),
            ("intermediate", "up_proj"),
            ("output", "down_proj"),
        ):
            dense = getattr(block, f"_feedforward_{ours}_dense")
            dense.kernel.assign(state[f"{prefix}mlp.{theirs}.weight"].T)
        block._self_attention_layer_norm.scale.assign(state[f"{prefix}input_layernorm.weight"])
        block._feedforward_layer_norm.scale.assign(
            state[f"{prefix}post_attention_layernorm.weight"]
        )
    model.get_layer("final_norm").scale.assign(state["model.norm.weight"])


def _ours(**options):
    return transformer_lm(
        VOCAB,
        num_layers=LAYERS,
        num_heads=HEADS,
        d_model=D,
        intermediate_dim=FF,
        num_key_value_heads=KV_HEADS,
        position="rotary",
        dropout=0.0,
        activation="silu",
        layer_norm_epsilon=RMS_EPS,
        normalize_first=True,
        normalization="rms_norm",
        feedforward="gated",
        use_bias=False,
        **options,
    )


# Token 0 is the zoo's padding: real tokens 1..V-1; the second row right-padded (masked in
# transformers, where 0 is a token like any other).
TOKENS = np.array([[5, 17, 3, 44, 9, 1, 28, 30, 12, 7], [8, 2, 49, 11, 6, 6, 0, 0, 0, 0]], "int32")


def _compare(hf, model):
    import torch

    real = TOKENS != 0
    with torch.no_grad():
        theirs = hf(
            torch.tensor(TOKENS, dtype=torch.long), attention_mask=torch.tensor(real.astype(int))
        ).logits.numpy()
    ours = np_(model(TOKENS))
    np.testing.assert_allclose(ours[real], theirs[real], atol=1e-4, rtol=1e-4)


def test_llama3_logits_equal_transformers():
    """Llama 3.1: RMS norm, SwiGLU, no biases, GQA, llama3 rope scaling, an untied head."""
    rope = dict(
        factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64
    )
    hf = _hf_model(
        "llama",
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 5000.0, **rope},
    )
    # With head_dim 8 the wavelengths are 2 pi (1, 8.4, 71, 595): one kept (< 64 / 4), one
    # interpolated, two divided by the factor (> 64 / 1).
    rope["scaling_factor"] = rope.pop("factor")
    model = _ours(
        tie_weights=False, max_wavelength=5000.0, rope_scaling={"rope_type": "llama3", **rope}
    )
    _copy_weights(hf, model)
    _compare(hf, model)
    unscaled = _ours(tie_weights=False, max_wavelength=5000.0)  # the scaling shows
    _copy_weights(hf, unscaled)
    with pytest.raises(AssertionError):
        _compare(hf, unscaled)


def test_llama_linear_rope_scaling_equals_transformers():
    hf = _hf_model(
        "llama",
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    )
    model = _ours(tie_weights=False, rope_scaling={"scaling_factor": 2.0})
    _copy_weights(hf, model)
    _compare(hf, model)


def test_qwen2_logits_equal_transformers():
    """Qwen2: biased q, k, v, no other bias; tied embeddings."""
    hf = _hf_model("qwen2", tie_word_embeddings=True)
    model = _ours(tie_weights=True, qkv_bias=True, max_wavelength=10000.0)
    _copy_weights(hf, model)
    _compare(hf, model)


def test_mistral_sliding_window_logits_equal_transformers():
    """Mistral's `sliding_window=3` is ours: each token sees itself and the two before it."""
    hf = _hf_model("mistral", sliding_window=3, tie_word_embeddings=False)
    assert hf.config.sliding_window == 3
    model = _ours(tie_weights=False, sliding_window=3)
    _copy_weights(hf, model)
    _compare(hf, model)
    wide = _ours(tie_weights=False, sliding_window=4)  # one more key: other logits
    _copy_weights(hf, wide)
    with pytest.raises(AssertionError):
        _compare(hf, wide)


def _llama_lm(**options):
    keras.utils.set_random_seed(0)
    rope = {"rope_type": "llama3", "scaling_factor": 4.0, "original_max_position_embeddings": 16}
    kwargs = dict(
        num_layers=2,
        num_heads=4,
        d_model=16,
        intermediate_dim=32,
        num_key_value_heads=2,
        position="rotary",
        dropout=0.0,
        activation="silu",
        tie_weights=False,
        normalization="rms_norm",
        feedforward="gated",
        use_bias=False,
        rope_scaling=rope,
    )
    kwargs.update(options)
    return transformer_lm(23, **kwargs)


@pytest.mark.xla
def test_compiled_generation_reads_the_gated_kernels_once(monkeypatch):
    """TensorFlow's XLA loop hoists all seven kernels of a block (q, k, v, o, up, gate, down);
    the tokens are the uncached full pass's (greedy)."""
    from keras_attn.models.generation import lm as lm_generation

    read, original = [], lm_generation.loop_kernels

    @contextlib.contextmanager
    def recording(layers):
        with original(layers) as kernels:
            read.append(len(kernels))
            yield kernels

    monkeypatch.setattr(lm_generation, "loop_kernels", recording)
    model = _llama_lm()
    prompts = np.array([[5, 6, 7, 8], [10, 3, 0, 0]], "int32")
    rows = [[int(t) for t in p if t] for p in prompts]
    for _ in range(4):  # the reference: the full pass on each row's tokens so far
        batch = np.array([row + [0] * (8 - len(row)) for row in rows], "int32")
        logits = np_(model(batch))[np.arange(2), [len(row) - 1 for row in rows]]
        logits[:, 0] = -np.inf
        rows = [row + [int(t)] for row, t in zip(rows, logits.argmax(-1), strict=True)]
    np.testing.assert_array_equal(generate(model, prompts, 4), [row[-4:] for row in rows])
    tensorflow = keras.backend.backend() == "tensorflow"
    assert [n for n in read if n] == [7 * 2] * tensorflow


def test_bad_llama_options():
    with pytest.raises(ValueError, match="position='rotary'"):
        transformer_lm(23, position="learned", rope_scaling={"scaling_factor": 2.0})
    with pytest.raises(ValueError, match="unknown keys \\['factor'\\]"):
        transformer_lm(23, position="rotary", rope_scaling={"factor": 2.0})
    with pytest.raises(TypeError, match="rope_scaling"):
        transformer_lm(23, position="rotary", rope_scaling=2.0)
    with pytest.raises(ValueError, match="normalization"):
        transformer_lm(23, normalization="rms")
