"""Tiny random Hugging Face causal language models that `transformers` itself builds (nothing
downloaded): the reference the Llama-family options and the checkpoint converter are tested
against. A test calling it skips where `transformers` or torch is missing."""

import pytest

FAMILIES = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral"}  # model_type -> prefix


def tiny_causal_lm(model_type, vocab, hidden, heads, kv_heads, intermediate, layers, **config):
    """A `transformers` causal LM of `model_type` (`"gpt2"`, `"llama"`, `"qwen2"`,
    `"mistral"`), random weights everywhere (norm scales near 1, biases too: a zero bias
    would hide a missing one), in eval mode; `config`: more of its config's fields."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    if model_type == "gpt2":
        model = transformers.GPT2LMHeadModel(
            transformers.GPT2Config(
                vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads, n_positions=32,
                **config,
            )
        )  # fmt: skip
    else:
        prefix = FAMILIES[model_type]
        model = getattr(transformers, f"{prefix}ForCausalLM")(
            getattr(transformers, f"{prefix}Config")(
                vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv_heads, **config,
            )
        )  # fmt: skip
    with torch.no_grad():
        for name, weight in model.named_parameters():
            weight.normal_(1.0 if ("norm" in name or "ln_" in name) else 0.0, 0.2)
    return model.eval()
