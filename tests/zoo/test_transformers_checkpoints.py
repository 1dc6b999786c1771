"""Hugging Face checkpoint folders in and out (`from_transformers`, `to_transformers`), checked
by the real client: tiny random models that `transformers` builds and saves here (nothing is
downloaded) give the same logits (1e-4, float32) and the same greedy tokens as transformers'
own forward pass and `generate`; exported folders load in `AutoModelForCausalLM` to the same
logits; unsupported configurations raise naming the field.
"""

import json
import os
import re
import shutil

import keras
import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")
torch = pytest.importorskip("torch")

from hf_models import tiny_causal_lm  # noqa: E402

from keras_attn.models import (  # noqa: E402
    from_transformers,
    generate,
    to_transformers,
    transformer_lm,
)

os.environ["HF_HUB_OFFLINE"] = "1"

VOCAB, D, HEADS, KV_HEADS, FF, LAYERS = 64, 32, 4, 2, 64, 2
LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 5000.0,
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8,
}
FAMILIES = {  # name -> (model_type, config)
    "llama": ("llama", {"tie_word_embeddings": False}),
    "llama3": ("llama", {"tie_word_embeddings": False, "rope_parameters": LLAMA3}),
    "llama_linear": (
        "llama",
        {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
    ),
    "gpt2": ("gpt2", {}),
    "qwen2": ("qwen2", {"tie_word_embeddings": True}),
    "mistral": ("mistral", {"sliding_window": 3}),
}
# Real ids, 0 among them (a token in every Hugging Face vocabulary).
TOKENS = np.array([[0, 5, 17, 3, 44, 9, 1, 28, 30, 12], [8, 2, 0, 11, 6, 6, 60, 63, 0, 7]])


def np_(x):
    return keras.ops.convert_to_numpy(x)


def _hf_model(model_type, **config):
    return tiny_causal_lm(model_type, VOCAB, D, HEADS, KV_HEADS, FF, LAYERS, **config)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """family -> (the transformers model, the folder it saved)."""
    root, made = tmp_path_factory.mktemp("hf"), {}
    for family, (model_type, config) in FAMILIES.items():
        hf = _hf_model(model_type, **config)
        hf.save_pretrained(root / family)
        made[family] = hf, root / family
    return made


def _hf_logits(hf, tokens, mask=None):
    mask = np.ones_like(tokens) if mask is None else mask
    with torch.no_grad():
        return hf(torch.tensor(tokens), attention_mask=torch.tensor(mask)).logits.float().numpy()


@pytest.mark.backends  # checked on TensorFlow, JAX and torch
@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_and_greedy_tokens_equal_transformers(folders, family, tmp_path):
    """The logits of every position (a right-padded row: -1 for us, the attention mask for
    transformers), the greedy tokens of `generate`, and the export's logits."""
    hf, folder = folders[family]
    model = from_transformers(folder)
    theirs = _hf_logits(hf, TOKENS)
    np.testing.assert_allclose(np_(model(TOKENS)), theirs, atol=1e-4, rtol=1e-4)
    padded = np.where(np.arange(10) < 7, TOKENS, -1)  # 7 real tokens, then padding
    real = padded >= 0
    theirs_padded = _hf_logits(hf, np.maximum(padded, 0), real.astype(int))
    np.testing.assert_allclose(np_(model(padded))[real], theirs_padded[real], atol=1e-4)
    with torch.no_grad():
        expected = hf.generate(
            torch.tensor(TOKENS), attention_mask=torch.ones(TOKENS.shape, dtype=torch.long),
            max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None,
        ).numpy()[:, TOKENS.shape[1]:]  # fmt: skip
    # eager: the compiled loop of a -1 model runs in the tests below
    np.testing.assert_array_equal(generate(model, TOKENS, 6, jit_compile=False), expected)
    to_transformers(model, tmp_path)  # the round trip: ours -> theirs
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(again) is type(hf)
    np.testing.assert_allclose(_hf_logits(again, TOKENS), theirs, atol=1e-5)


@pytest.mark.backends  # checked on TensorFlow, JAX and torch
def test_left_padded_prompts_generate_as_unpadded(folders):
    """-1 is the padding of an imported model's prompts: a left-padded row is continued as
    if alone (its positions count real tokens), as transformers does with a mask."""
    hf, folder = folders["gpt2"]  # learned positions: the padding's effect would show
    model = from_transformers(folder)
    prompts = np.array([[0, 5, 17, 3], [-1, -1, 9, 0]])
    tokens = generate(model, prompts, 5)
    np.testing.assert_array_equal(tokens[1], generate(model, prompts[1:, 2:], 5)[0])
    with torch.no_grad():
        expected = hf.generate(
            torch.tensor(np.maximum(prompts, 0)), attention_mask=torch.tensor(prompts >= 0).long(),
            max_new_tokens=5, do_sample=False, pad_token_id=0, eos_token_id=None,
        ).numpy()[:, 4:]  # fmt: skip
    np.testing.assert_array_equal(tokens, expected)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_and_sharded_checkpoints(folders, dtype, tmp_path):
    """float16 / bfloat16 weights (bfloat16 read from its bits: NumPy has no such dtype),
    sharded by `max_shard_size`, cast to float32: transformers' logits of the same weights."""
    hf, folder = folders["llama"]
    half = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype))
    half.save_pretrained(tmp_path, max_shard_size="20KB")
    assert os.path.exists(tmp_path / "model.safetensors.index.json")
    model = from_transformers(tmp_path)
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    np.testing.assert_allclose(
        np_(model(TOKENS)), _hf_logits(reference.eval(), TOKENS), atol=1e-4, rtol=1e-4
    )


def test_generation_settings_quantize_and_lora_after_import(folders, tmp_path):
    """Sampling with penalties, beam search, `quantize("int8")`, LoRA fine-tuning through
    `fit`, and the export of the merged LoRA weights."""
    _, folder = folders["qwen2"]
    model = from_transformers(folder)
    prompts = np.array([[0, 5, 17], [-1, 9, 0]])
    eager = dict(jit_compile=False)  # the compiled loops: test_left_padded_prompts_...
    sampled = generate(model, prompts, 5, sampler="sample", top_k=5, seed=1,
                       repetition_penalty=1.3, no_repeat_ngram_size=2, **eager)  # fmt: skip
    assert sampled.shape == (2, 5) and np.all((sampled >= 0) & (sampled < VOCAB))
    beam = generate(model, prompts, 5, sampler="beam", end_id=2, beam_width=3, **eager)
    assert beam.shape == (2, 5)
    for layer in model._flatten_layers():  # LoRA on every projection (keras' Dense kinds)
        if isinstance(layer, keras.layers.Dense | keras.layers.EinsumDense):
            layer.enable_lora(2)
    inputs, targets = TOKENS[:, :-1], TOKENS[:, 1:]
    model.compile(
        keras.optimizers.Adam(1e-2),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=-1),
        run_eagerly=True,  # two steps: tracing the train step would cost more
    )
    model.fit(inputs, targets, epochs=2, verbose=0)
    to_transformers(model, tmp_path)  # the LoRA terms merged into the kernels
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    np.testing.assert_allclose(_hf_logits(exported, TOKENS), np_(model(TOKENS)), atol=1e-4)
    original = _hf_logits(folders["qwen2"][0], TOKENS)
    assert np.abs(_hf_logits(exported, TOKENS) - original).max() > 1e-3  # it was fine-tuned
    model = from_transformers(folder)
    float_logits = np_(model(TOKENS))
    model.quantize("int8")
    np.testing.assert_allclose(np_(model(TOKENS)), float_logits, atol=0.5)
    assert generate(model, prompts, 3, **eager).shape == (2, 3)
    with pytest.raises(ValueError, match="quantization"):
        to_transformers(model, tmp_path)


@pytest.mark.backends  # checked on TensorFlow, JAX and torch
def test_padding_id_model_reloads(folders, tmp_path):
    model = from_transformers(folders["mistral"][1])
    model.save(tmp_path / "m.keras")
    again = keras.saving.load_model(tmp_path / "m.keras", safe_mode=True)
    padded = np.where(TOKENS > 40, -1, TOKENS)
    np.testing.assert_allclose(np_(again(padded)), np_(model(padded)), atol=1e-6)


def _zoo(**options):
    keras.utils.set_random_seed(0)
    model = transformer_lm(VOCAB, num_layers=LAYERS, num_heads=HEADS, d_model=D,
                           intermediate_dim=FF, dropout=0.0, sequence_length=32,
                           **options)  # fmt: skip
    for weight in model.weights:  # random norms and biases too: every tensor shows
        weight.assign(np.random.default_rng(0).normal(0.0, 0.2, weight.shape))
    return model


# The Llama family's block: rotary positions, RMS norm, gated SiLU, no biases.
LLAMA_BLOCK = dict(
    position="rotary", activation="silu", normalization="rms_norm", feedforward="gated",
    use_bias=False,
)  # fmt: skip
ZOO = {
    "gpt2": {},  # learned positions, exact GELU, LayerNorm, tied
    "gpt2_tanh_untied": {"activation": "gelu_approximate", "tie_weights": False},
    "llama": dict(
        **LLAMA_BLOCK,
        tie_weights=False,
        num_key_value_heads=KV_HEADS,
    ),  # fmt: skip
    "qwen2": dict(
        **LLAMA_BLOCK,
        qkv_bias=True,
    ),  # fmt: skip
    "mistral": dict(
        **LLAMA_BLOCK,
        sliding_window=3,
        rope_scaling={
            "rope_type": "llama3",
            "scaling_factor": 4.0,
            "original_max_position_embeddings": 8,
        },
    ),  # fmt: skip
}


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_models_export(name, tmp_path):
    """The zoo's own models (id 0 padding, unused here: positions 0, 1, ... as theirs)."""
    options = dict(ZOO[name])
    if options.get("activation") == "gelu_approximate":
        from keras_attn.models.layers import gelu_approximate

        options["activation"] = gelu_approximate
    model = _zoo(**options)
    to_transformers(model, tmp_path, end_id=2)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == name.split("_")[0] and config["pad_token_id"] == 0
    if name.startswith("gpt2"):  # our "gelu" is the exact GELU, GPT-2's "gelu_new" the tanh one
        assert config["activation_function"] == ("gelu" if name == "gpt2" else "gelu_new")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    tokens = np.where(TOKENS == 0, 1, TOKENS)  # no padding
    # 1e-5: the other GELU would differ by 9e-5 (measured); these agree to 2e-7
    np.testing.assert_allclose(_hf_logits(hf, tokens), np_(model(tokens)), atol=1e-5, rtol=1e-6)


def test_unsupported_exports_raise_naming_what():
    with pytest.raises(ValueError, match="alibi"):
        to_transformers(_zoo(position="alibi"), "unused")
    with pytest.raises(ValueError, match="sinusoidal"):
        to_transformers(_zoo(position="sinusoidal"), "unused")
    with pytest.raises(ValueError, match="normalize_first"):
        to_transformers(_zoo(normalize_first=False), "unused")
    with pytest.raises(ValueError, match="normalization with learned"):
        to_transformers(_zoo(normalization="rms_norm"), "unused")
    with pytest.raises(ValueError, match="feedforward with rotary"):
        to_transformers(_zoo(position="rotary", normalization="rms_norm", use_bias=False), "x")


def _edited(folder, tmp_path, **changes):
    """A copy of `folder` with `changes` in its config.json (None: the field removed)."""
    copy = tmp_path / "edited"
    shutil.copytree(folder, copy)
    config = json.loads((copy / "config.json").read_text())
    for key, value in changes.items():
        config[key] = value
    (copy / "config.json").write_text(json.dumps(config))
    return copy


@pytest.mark.parametrize(
    "family, changes, match",
    [
        ("llama", {"model_type": "gemma"}, "model_type"),
        ("llama", {"rope_parameters": {"rope_type": "yarn", "factor": 2.0}}, "rope_type"),
        ("llama", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type"),
        ("llama", {"attention_bias": True}, "attention_bias"),
        ("llama", {"mlp_bias": True}, "mlp_bias"),
        ("llama", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        ("llama", {"head_dim": 16}, "head_dim"),
        ("llama", {"hidden_act": "gelu_fast"}, "hidden_act"),
        ("llama", {"tie_word_embeddings": True}, "tie_word_embeddings"),
        ("qwen2", {"tie_word_embeddings": False}, "missing \\['lm_head.weight'\\]"),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 4,
                   "layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
        ("gpt2", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
    ],
)  # fmt: skip
def test_unsupported_configurations_raise_naming_the_field(
    folders, tmp_path, family, changes, match
):
    with pytest.raises(ValueError, match=match):
        from_transformers(_edited(folders[family][1], tmp_path, **changes))


def test_options_and_files_are_checked(folders, tmp_path):
    with pytest.raises(ValueError, match="num_layers"):
        from_transformers(folders["llama"][1], num_layers=1)
    with pytest.raises(ValueError, match="padding_id"):
        from_transformers(folders["llama"][1], padding_id=3)
    (tmp_path / "config.json").write_text((folders["llama"][1] / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        from_transformers(tmp_path)


def test_the_docs_round_trip_runs(tmp_path, monkeypatch):
    """docs/coming-from-hugging-face.md's round-trip block, as a user pastes it
    (`test_doc_blocks` leaves it to this test: it needs transformers)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "docs", "coming-from-hugging-face.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)
    (block,) = [b for b in blocks if "tiny-llama-tuned" in b]  # the round trip's (the others:
    # generation settings, run by test_doc_blocks)
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(block, "docs/coming-from-hugging-face.md", "exec"), namespace)
    tokens = np.array([[1, 15, 27, 3, 0, 9]])
    np.testing.assert_allclose(
        _hf_logits(namespace["again"].eval(), tokens),
        np_(namespace["model"](tokens)),
        atol=1e-4,
    )
    assert os.path.exists(tmp_path / "tiny-llama-tuned_savedmodel" / "saved_model.pb")


def test_text_language_model_continues_like_the_pipeline(tmp_path):
    """`keras-attn export transformer-lm --format transformers DIR`: the run's
    `TextLanguageModel` with a tokenizer; transformers' text-generation pipeline continues
    prompts with its words (greedy), punctuation split off and case folded as ours."""
    from keras_attn.models import text

    words = ["", "[UNK]", ".", "<s>", "</s>", "the", "movie", "is", "a", "good", "bad", "film"]
    words += ["it's", "!"]
    keras.utils.set_random_seed(2)
    model = transformer_lm(len(words), num_layers=1, num_heads=2, d_model=16, intermediate_dim=32,
                           sequence_length=32, dropout=0.0)  # fmt: skip
    for weight in model.weights:
        weight.assign(np.random.default_rng(2).normal(0.0, 0.5, weight.shape))
    text_model = text.TextLanguageModel(model, text.string_lookup(words), 8, 6)
    runs, folder = tmp_path / "runs", tmp_path / "hf"
    runs.mkdir()
    text_model.save(runs / "transformer-lm.keras")  # what `keras-attn train` saves
    from keras_attn.models import cli

    command = ["export", "transformer-lm", "--format", "transformers", str(folder)]
    assert cli.main([*command, "--runs-dir", str(runs)]) == 0
    pipe = transformers.pipeline("text-generation", model=str(folder))
    prompts = ["The movie is", "It's a GOOD film!"]
    theirs = [pipe(p, return_full_text=False)[0]["generated_text"] for p in prompts]
    assert theirs == text_model.predict_text(prompts)
    assert len(set(theirs[1].split())) > 1  # not one word repeated: the test can tell
    ids = pipe.tokenizer(prompts[1]).input_ids
    np.testing.assert_array_equal(ids, np_(text_model.prompt_ids(prompts[1:]))[0])


@pytest.mark.backends  # checked on TensorFlow, JAX and torch
@pytest.mark.parametrize(
    "setting",
    [{"repetition_penalty": 1e4}, {"no_repeat_ngram_size": 1}, {"no_repeat_ngram_size": 2}],
)
def test_repetition_controls_count_token_zero_of_padding_id_models(folders, setting):
    """Token 0 is a real token of an imported model (`padding_id=-1`): in its prompt it is
    seen, penalized and banned as transformers' `RepetitionPenaltyLogitsProcessor` and
    `NoRepeatNGramLogitsProcessor` do (these prompts' greedy next token is 0); the -1
    padding before them counts as nothing."""
    hf, folder = folders["qwen2"]
    model = from_transformers(folder)
    prompts = np.array([[23, 58, 0, 59], [20, 0, 13, 2]])
    padded = np.concatenate([np.full((2, 1), -1), prompts], axis=1)
    assert np.all(generate(model, padded, 1)[:, 0] == 0)  # else the test would check nothing
    with torch.no_grad():
        expected = hf.generate(
            torch.tensor(prompts), attention_mask=torch.ones(prompts.shape, dtype=torch.long),
            max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None, **setting,
        ).numpy()[:, 4:]  # fmt: skip
    np.testing.assert_array_equal(generate(model, padded, 6, **setting), expected)


# Left-padded (-1) prompts with token 0 among the real ones.
PADDED = np.array([[-1, -1, 0, 5, 17], [8, 2, 0, 11, 6]])


def _hf_generate(hf, prompts, n, **settings):
    """transformers' `generate` of -1-padded prompts (0 under the mask), greedy."""
    with torch.no_grad():
        return hf.generate(
            torch.tensor(np.maximum(prompts, 0)), attention_mask=torch.tensor(prompts >= 0).long(),
            max_new_tokens=n, do_sample=False, pad_token_id=0, **settings,
        ).numpy()[:, prompts.shape[1]:]  # fmt: skip


def _streamed(model, prompts, n, **settings):
    return np.stack(list(generate(model, prompts, n, stream=True, **settings)), axis=1)


def _cut_after(tokens, stop):
    """Each row up to and with the first `stop` its tokens complete, 0 after."""
    cut = np.array(tokens)
    for row in cut:
        ends = [
            i
            for i in range(len(stop) - 1, len(row))
            if list(row[i - len(stop) + 1 : i + 1]) == stop
        ]
        if ends:
            row[ends[0] + 1 :] = 0
    return cut


def _contrastive_reference(hf, prompts, n, k, alpha):
    """Contrastive search by transformers' own forward passes in float64, each row alone
    and unpadded (transformers 5 moved its contrastive search to a Hub recipe, not
    offline): among the `k` most likely tokens, the argmax of `(1 - alpha) p(v) - alpha
    max_j cos(h_v, h_j)`, `h` the final (normed) hidden states of the row's tokens."""
    hf64 = type(hf)(hf.config).double().eval()
    hf64.load_state_dict(hf.state_dict())
    rows = []
    for prompt in prompts:
        sequence = [int(t) for t in prompt if t >= 0]
        for _ in range(n):
            with torch.no_grad():
                out = hf64(torch.tensor([sequence]), output_hidden_states=True)
            probs = torch.softmax(out.logits[0, -1], -1).numpy()
            earlier = out.hidden_states[-1][0].numpy()  # (L, d), after the final norm
            candidates = np.argsort(-probs, kind="stable")[:k]
            with torch.no_grad():
                h = hf64(torch.tensor([[*sequence, int(v)] for v in candidates]),
                         output_hidden_states=True).hidden_states[-1][:, -1].numpy()  # fmt: skip
            cos = (
                h @ earlier.T / np.outer(np.linalg.norm(h, axis=1), np.linalg.norm(earlier, axis=1))
            )
            scores = (1 - alpha) * probs[candidates] - alpha * cos.max(axis=1)
            sequence.append(int(candidates[int(np.argmax(scores))]))
        rows.append(sequence[-n:])
    return np.array(rows, "int32")


@pytest.mark.backends  # checked on TensorFlow, JAX and torch
def test_streaming_and_generation_settings_after_import(folders):
    """An imported Llama with left-padded (-1) prompts holding token 0: streamed tokens are
    the one-shot call's for greedy, seeded sampling and today's settings; each setting
    against transformers' `generate` where it has it (greedy, `min_new_tokens`), against
    transformers' forward passes (contrastive search) or a hand-cut greedy row
    (`stop_sequences`); int8 caches and `num_return_sequences` against our one-shot path."""
    hf, folder = folders["llama"]
    model = from_transformers(folder)
    greedy = generate(model, PADDED, 6)
    np.testing.assert_array_equal(greedy, _hf_generate(hf, PADDED, 6, eos_token_id=None))
    stop = [int(t) for t in greedy[0, 1:3]]
    end = int(greedy[1, 1])
    settings = {
        "greedy": ({}, greedy),
        "sample": ({"sampler": "sample", "top_k": 5, "seed": 3}, None),
        "stop_sequences": ({"stop_sequences": [stop]}, _cut_after(greedy, stop)),
        "min_new_tokens": (
            {"end_id": end, "min_new_tokens": 3},
            _hf_generate(hf, PADDED, 6, eos_token_id=end, min_new_tokens=3),
        ),
        "num_return_sequences": (
            {"sampler": "sample", "top_k": 5, "seed": 3, "num_return_sequences": 2},
            None,
        ),
        "contrastive": (
            {"sampler": "contrastive", "penalty_alpha": 0.6, "top_k": 4},
            _contrastive_reference(hf, PADDED, 6, 4, 0.6),
        ),
        "int8_cache": ({"kv_cache_dtype": "int8"}, None),
    }
    for name, (setting, expected) in settings.items():
        # compiled: greedy here, each setting in tests/decoding (tracing each costs seconds)
        setting = setting if name == "greedy" else {**setting, "jit_compile": False}
        one_shot = generate(model, PADDED, 6, **setting)
        if expected is not None:
            np.testing.assert_array_equal(one_shot, expected, err_msg=name)
        np.testing.assert_array_equal(
            _streamed(model, PADDED, 6, **setting), one_shot, err_msg=name
        )
    assert _cut_after(greedy, stop)[0, 3:].max() == 0  # the stop sequence did end row 0


@pytest.mark.slow  # a SavedModel of five signatures: tracing and writing take tens of seconds
def test_token_signatures_of_an_imported_model_generate_as_python(folders, tmp_path):
    """The token-level SavedModel signatures (`greedy_decode`, `prefill` + `decode_step`,
    `serve`) of an imported Llama: there is no token-level export of a bare `transformer_lm`,
    so it goes through `TextLanguageModel.export_text` with placeholder words. Their greedy
    tokens are Python's `generate`'s for -1-padded prompts, the first of them 0 (a real
    token: `prefill`'s logits do not rule it out), and `serve`'s logits transformers'."""
    tf = pytest.importorskip("tensorflow")
    if keras.backend.backend() != "tensorflow":
        pytest.skip("export_text writes a TensorFlow SavedModel")
    from keras_attn.models.text import TextLanguageModel
    from keras_attn.models.text.base import string_lookup

    hf, folder = folders["llama"]
    model = from_transformers(folder)
    words = ["", "[UNK]", "<s>", "</s>"] + [f"w{i}" for i in range(4, VOCAB)]
    TextLanguageModel(model, string_lookup(words), 6, 8, suppress_tokens=()).export_text(
        str(tmp_path / "lm")
    )
    loaded = tf.saved_model.load(str(tmp_path / "lm"))
    prompts = np.array([[-1, 55, 35, 0, 49], [8, 2, 0, 11, 6]])
    expected = generate(model, prompts, 6)
    assert expected[0, 0] == 0  # else the test would not see token 0 ruled out
    signature = loaded.signatures
    greedy = signature["greedy_decode"](prompts=tf.constant(prompts, tf.int64))
    np.testing.assert_array_equal(list(greedy.values())[0], expected)
    state, tokens = signature["prefill"](tokens=tf.constant(prompts, tf.int64)), []
    for _ in range(6):
        tokens.append(np.argmax(state["logits"], axis=-1))
        cache = {k: state[k] for k in ("keys", "values", "valid", "positions", "index")}
        if len(tokens) < 6:
            state = signature["decode_step"](token=tf.constant(tokens[-1], tf.int64), **cache)
    np.testing.assert_array_equal(np.stack(tokens, axis=1), expected)
    logits = list(signature["serve"](tokens=tf.constant(TOKENS, tf.int64)).values())[0]
    np.testing.assert_allclose(logits, _hf_logits(hf, TOKENS), atol=1e-4, rtol=1e-4)
