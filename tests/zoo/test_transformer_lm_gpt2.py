"""`from_gpt2_backbone`: keras-hub's GPT-2 weights in a `transformer_lm` give keras-hub's logits.

A small randomly initialized `keras_hub.models.GPT2Backbone` (no download), every
weight redrawn (keras-hub starts biases at zero and norms at one, which would hide
a bias or a norm copied to the wrong place); the reference is keras-hub's own
`GPT2CausalLM(backbone, preprocessor=None)`.
"""

import keras
import numpy as np
import pytest

keras_hub = pytest.importorskip("keras_hub")

VOCAB = 40


def _np(x):
    return keras.ops.convert_to_numpy(x)


@pytest.fixture(scope="module")
def gpt2():
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=VOCAB, num_layers=2, num_heads=4, hidden_dim=32, intermediate_dim=64,
        max_sequence_length=20,
    )  # fmt: skip
    rng = np.random.default_rng(0)
    for weight in backbone.weights:
        weight.assign(rng.normal(0, 0.2, weight.shape).astype("float32"))
    return backbone, keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)


def test_logits_equal_keras_hub(gpt2):
    from keras_attn.models.gpt2 import from_gpt2_backbone

    backbone, causal_lm = gpt2
    model = from_gpt2_backbone(backbone)
    ids = np.random.default_rng(1).integers(0, VOCAB, (3, 11)).astype("int32")
    ids[0, :3] = 0  # GPT-2's token 0 ("!") is a real token: our 1
    expected = _np(causal_lm({"token_ids": ids, "padding_mask": np.ones_like(ids)}))
    logits = _np(model(ids + 1))
    assert logits.shape == (3, 11, VOCAB + 1)
    np.testing.assert_allclose(logits[..., 1:], expected, atol=1e-5)
    # The long-context kernel (it has no attention dropout).
    chunked = from_gpt2_backbone(backbone, implementation="chunked", dropout=0.0)
    np.testing.assert_allclose(_np(chunked(ids + 1))[..., 1:], expected, atol=1e-5)


@pytest.mark.slow  # keras-hub compiles its generate (about 10 s)
def test_greedy_generation_equals_keras_hub(gpt2):
    from keras_attn.models import generate
    from keras_attn.models.gpt2 import from_gpt2_backbone

    backbone, causal_lm = gpt2
    model = from_gpt2_backbone(backbone)
    prompts = np.random.default_rng(2).integers(1, VOCAB, (2, 4)).astype("int32")
    ours = generate(model, prompts + 1, 5, jit_compile=False) - 1
    padded = np.concatenate([prompts, np.zeros((2, 5), "int32")], 1)
    mask = np.concatenate([np.ones((2, 4), bool), np.zeros((2, 5), bool)], 1)
    causal_lm.compile(sampler="greedy")
    hub = causal_lm.generate({"token_ids": padded, "padding_mask": mask}, stop_token_ids=None)
    np.testing.assert_array_equal(ours, np.asarray(hub["token_ids"])[:, 4:])


def test_bad_input(gpt2):
    from keras_attn.models.gpt2 import from_gpt2_backbone

    with pytest.raises(TypeError, match="GPT2Backbone. Received: backbone of type Sequential"):
        from_gpt2_backbone(keras.Sequential())
    with pytest.raises(ValueError, match="max_sequence_length \\(20\\).*sequence_length=30"):
        from_gpt2_backbone(gpt2[0], sequence_length=30)


@pytest.mark.slow
def test_generation_benchmark_smoke(capsys):
    """`python -m benchmarks.generation --smoke`: both libraries, the same tokens, speeds > 0."""
    from benchmarks import generation

    rows = generation.main(["--smoke", "--no-memory"])
    assert [(r["batch"], r["window"], r["setting"]) for r in rows] == [
        (1, None, "greedy"),
        (8, None, "greedy"),
        (8, None, "top-k 10"),
        (8, None, "repetition penalty 1.3"),
    ]
    for row in rows:  # the greedy rows compute the same function: the same tokens
        assert row["same_tokens"] is (True if row["setting"] == "greedy" else None)
        assert row["ours_tokens_per_s"] > 0 and row["hub_tokens_per_s"] > 0
    out = capsys.readouterr().out
    assert "| greedy | 8 | 8 + 4 |" in out
    assert "| scores: `generate`, greedy | 8 | 4 |" in out
