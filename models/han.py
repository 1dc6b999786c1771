"""Hierarchical Attention Network (Yang et al., 2016): words -> sentences -> document."""

import keras

import keras_attn

from .layers import FoldIntoBatch, MeanPooling, PaddingMask, UnfoldFromBatch

_POOLINGS = ("attention", "mean")


def hierarchical_attention_network(
    vocab_size: int,
    embedding_dim: int,
    word_units: int,
    sentence_units: int,
    num_classes: int,
    max_sentences: int,
    max_words: int,
    attention_units: int | None = None,
    dropout: float = 0.0,
    pooling: str = "attention",
    return_attention: bool = False,
    name: str = "hierarchical_attention_network",
) -> keras.Model:
    """Document classifier with attention pooling over words, then over sentences.

        h_it = BiGRU_words(embed(w_it))           word t of sentence i
        s_i  = sum_t a_it h_it,  a_i = softmax_t(tanh(W_w h_it + b_w) . u_w)
        h_i  = BiGRU_sentences(s_i)
        v    = sum_i a_i h_i,    a   = softmax_i(tanh(W_s h_i + b_s) . u_s)
        logits = W_c v

    Both poolings are `keras_attn.AttentionPooling`. The word level runs on
    every sentence at once (documents folded into the batch, `(B * S, W)`).

    Padding is token id 0. Padded words get zero word weight; a sentence made
    only of padding pools to zeros, is masked in the sentence encoder and gets
    zero sentence weight; no NaN anywhere (an all-padding document gives a
    zero document vector).

    Args:
        vocab_size: vocabulary size (including 0).
        embedding_dim: width of the word embedding.
        word_units, sentence_units: width of each direction of the word and
            sentence GRUs (vectors are twice as wide).
        num_classes: number of classes.
        max_sentences, max_words: `S` and `W`, the document shape.
        attention_units: hidden width of both poolings; `None` means twice
            the GRU width at each level (as in the paper).
        dropout: dropout on the document vector, in training.
        pooling: `"attention"` (the paper) or `"mean"`: the ablation, the same
            network with both poolings replaced by the mean over real words and
            sentences (`keras_attn.models.layers.MeanPooling`; uniform returned weights).
        return_attention: output a dict `{"logits", "word_attention" (B, S, W),
            "sentence_attention" (B, S)}`. The layers are the same, so a
            trained model's weights load into it with `set_weights`.
        name: model name.

    Returns:
        A `keras.Model` from int32 tokens `(B, S, W)` to logits
        `(B, num_classes)` (train with `from_logits=True`).

    Example:

    >>> model = hierarchical_attention_network(
    ...     vocab_size=50, embedding_dim=8, word_units=4, sentence_units=4,
    ...     num_classes=3, max_sentences=2, max_words=5, return_attention=True)
    >>> docs = np.array([[[4, 9, 2, 0, 0], [0, 0, 0, 0, 0]]], "int32")
    >>> out = model(docs)
    >>> print(out["logits"].shape, out["word_attention"].shape, out["sentence_attention"].shape)
    (1, 3) (1, 2, 5) (1, 2)

    Reference:
        Yang et al., 2016, "Hierarchical Attention Networks for Document
        Classification", https://aclanthology.org/N16-1174
    """
    if pooling not in _POOLINGS:
        raise ValueError(f"`pooling` must be one of {_POOLINGS}. Received: pooling={pooling!r}")

    def pool(units, name):
        if pooling == "mean":
            return MeanPooling(name=name)
        return keras_attn.AttentionPooling(units, name=name)

    # -- inputs ------------------------------------------------------------
    tokens = keras.Input((max_sentences, max_words), dtype="int32", name="tokens")  # (B, S, W)

    # -- word level: every sentence at once --------------------------------
    words = FoldIntoBatch(name="fold_sentences")(tokens)  # (B * S, W)
    x = keras.layers.Embedding(vocab_size, embedding_dim, mask_zero=True, name="embedding")(words)
    x = keras.layers.Bidirectional(
        keras.layers.GRU(word_units, return_sequences=True), name="word_encoder"
    )(x)  # (B * S, W, 2 * word_units), masked
    sentences, word_weights = pool(attention_units or 2 * word_units, "word_attention")(
        x, return_attention_scores=True
    )  # (B * S, 2 * word_units), (B * S, W)
    sentences = UnfoldFromBatch(max_sentences, name="unfold_sentences")(sentences)
    word_weights = UnfoldFromBatch(max_sentences, name="unfold_word_attention")(word_weights)

    # -- sentence level: sentences made only of padding are masked -----------
    sentence_mask = PaddingMask(name="sentence_mask")(tokens)  # (B, S)
    h = keras.layers.Bidirectional(
        keras.layers.GRU(sentence_units, return_sequences=True), name="sentence_encoder"
    )(sentences, mask=sentence_mask)  # (B, S, 2 * sentence_units)
    document, sentence_weights = pool(attention_units or 2 * sentence_units, "sentence_attention")(
        h, mask=sentence_mask, return_attention_scores=True
    )  # (B, 2 * sentence_units), (B, S)

    # -- classifier ----------------------------------------------------------
    document = keras.layers.Dropout(dropout, name="dropout")(document)
    logits = keras.layers.Dense(num_classes, name="logits")(document)
    if return_attention:
        outputs = {
            "logits": logits,
            "word_attention": word_weights,
            "sentence_attention": sentence_weights,
        }
    else:
        outputs = logits
    return keras.Model(tokens, outputs, name=name)
