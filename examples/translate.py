"""Seq2seq translation with attention: ted_hrlr_translate/pt_to_en, Transformer or RNN.

    python examples/translate.py --download                # fetches TED pt->en (the first time)
    python examples/translate.py --model rnn --plot alignment.png
    python examples/translate.py                           # offline: see "Dataset" below

Dataset: `--dataset NAME` trains on NAME (any tfds `Translation` dataset, or the
generated `keras_attn_seq2seq/...` tasks). Without it, the script uses
`ted_hrlr_translate/pt_to_en` when it is prepared in `--data-dir` (or `--download` is
given); otherwise it says so and trains on the generated task
`keras_attn_seq2seq/reverse-5-20`, which needs no network.

Both sides are tokenized with `keras.layers.TextVectorization` (lowercased, punctuation
stripped, 0 = padding, 1 = out of vocabulary); the target side gets two more ids, start
and end. After training, the script exports a SavedModel whose `greedy_decode` endpoint
runs the whole cached decoding loop (`keras_attn.models.export_seq2seq`), reloads it, and
translates test sentences with it. `--plot FILE` draws the attention alignment of the
first one (RNN: its attention; Transformer: the last decoder block's cross-attention,
averaged over heads).
"""

import os

import common  # the examples' shared flags and dataset loading
import keras
import numpy as np
import tensorflow as tf

from keras_attn import models

TED = "ted_hrlr_translate/pt_to_en"
GENERATED, GENERATED_SMOKE = "keras_attn_seq2seq/reverse-5-20", "keras_attn_seq2seq/tiny-reverse"


def parse_args(argv=None):
    p = common.parser(
        __doc__.splitlines()[0], f"a tfds translation dataset (default: {TED} if prepared)", 5
    )
    p.add_argument("--model", choices=("transformer", "rnn"), default="transformer", help="model")
    p.add_argument(
        "--score",
        choices=("additive", "dot", "scaled_dot", "bilinear", "none"),
        default="additive",
        help="the RNN's attention score (none: no attention)",
    )
    p.add_argument("--vocab-size", type=int, default=8000, help="per language")
    p.add_argument("--max-length", type=int, default=40, help="tokens per sentence")
    p.add_argument("--d-model", type=int, default=128, help="embedding and hidden width")
    p.add_argument("--num-layers", type=int, default=2, help="Transformer blocks per side")
    p.add_argument("--num-heads", type=int, default=4, help="attention heads")
    p.add_argument("--decode", type=int, default=200, help="test sentences to translate")
    args = p.parse_args(argv)
    if args.plot and args.model == "rnn" and args.score == "none":
        p.error("--plot draws attention weights: it needs an RNN with a --score")
    if args.smoke:
        args.epochs, args.batch_size, args.train_examples, args.decode = 1, 8, 16, 4
        args.vocab_size, args.max_length, args.d_model, args.num_layers = 100, 12, 16, 1
    return args


def choose_dataset(args):
    """`--dataset`; else TED when prepared or `--download`; else the generated task."""
    if args.dataset:
        return args.dataset
    if args.download or common.is_prepared(TED, args.data_dir):
        return TED
    generated = GENERATED_SMOKE if args.smoke else GENERATED
    print(
        f"{TED} is not prepared in {args.data_dir or 'the default tfds data_dir'} (pass "
        f"--download to fetch it): training on the generated task {generated} instead."
    )
    return generated


def main(argv=None):
    args = parse_args(argv)
    keras.utils.set_random_seed(args.seed)
    name = choose_dataset(args)

    # -- load: (source sentence, target sentence) string pairs ----------------
    train, _ = common.load(name, "train", args.data_dir, args.download)
    test, _ = common.load(name, "test", args.data_dir, args.download)
    print(common.describe(name, args.data_dir))
    if args.train_examples:
        train = train.take(args.train_examples)
    test = test.take(16 if args.smoke else -1)

    # -- preprocess: TextVectorization on each side; start/end ids after the vocabulary --
    source_vectorizer = keras.layers.TextVectorization(max_tokens=args.vocab_size)
    target_vectorizer = keras.layers.TextVectorization(max_tokens=args.vocab_size, ragged=True)
    source_vectorizer.adapt(train.map(lambda src, tgt: src).batch(512))
    target_vectorizer.adapt(train.map(lambda src, tgt: tgt).batch(512))
    target_vocabulary = target_vectorizer.get_vocabulary() + ["[start]", "[end]"]
    start_id, end_id = len(target_vocabulary) - 2, len(target_vocabulary) - 1

    def to_model_inputs(src, tgt):
        source = tf.cast(source_vectorizer(src)[:, : args.max_length], tf.int32)  # (B, S)
        target = tf.cast(target_vectorizer(tgt)[:, : args.max_length - 1], tf.int32)  # ragged
        start = tf.fill((target.nrows(), 1), start_id)
        end = tf.fill((target.nrows(), 1), end_id)
        decoder_inputs = tf.concat([start, target], axis=1).to_tensor()  # (B, T), 0-padded
        targets = tf.concat([target, end], axis=1).to_tensor()  # shifted left by one
        return {"encoder_inputs": source, "decoder_inputs": decoder_inputs}, targets

    def batches(ds, shuffle=False):
        ds = ds.shuffle(10_000, seed=args.seed) if shuffle else ds
        return ds.batch(args.batch_size).map(to_model_inputs).prefetch(tf.data.AUTOTUNE)

    # -- build --------------------------------------------------------------
    def build(return_attention=False):
        sizes = dict(
            source_vocab_size=source_vectorizer.vocabulary_size(),
            target_vocab_size=len(target_vocabulary),
        )
        if args.model == "transformer":
            return models.transformer_seq2seq(
                **sizes, num_layers=args.num_layers, num_heads=args.num_heads,
                d_model=args.d_model, intermediate_dim=2 * args.d_model,
            )  # fmt: skip
        return models.rnn_seq2seq(
            **sizes, embedding_dim=args.d_model, units=args.d_model,
            score=None if args.score == "none" else args.score, return_attention=return_attention,
        )  # fmt: skip

    model = build()
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),  # padding masked
        metrics=["accuracy"],
    )

    # -- fit and evaluate (teacher forcing: per-token accuracy) ---------------
    model.fit(batches(train, shuffle=True), epochs=args.epochs, verbose=2)
    loss, accuracy = model.evaluate(batches(test), verbose=0)
    print(f"{name} test ({args.model}): token accuracy {accuracy:.4f}, loss {loss:.4f}")

    # -- export: a SavedModel that decodes in its graph ---------------------
    out = common.output_dir(args, f"translate_{args.model}")
    model.save(os.path.join(out, "model.keras"))
    for side, vocabulary in (
        ("source", source_vectorizer.get_vocabulary()),
        ("target", target_vocabulary),
    ):
        with open(os.path.join(out, f"{side}_vocabulary.txt"), "w") as f:
            f.write("\n".join(vocabulary) + "\n")
    models.export_seq2seq(
        model, os.path.join(out, "saved_model"), args.max_length, start_id, end_id
    )
    print(f"Saved {out}/model.keras, the vocabularies and the SavedModel {out}/saved_model")

    # -- translate test sentences with the reloaded SavedModel ----------------
    exported = tf.saved_model.load(os.path.join(out, "saved_model"))
    sentences = next(iter(test.batch(args.decode)))  # (source strings, target strings)
    inputs, targets = to_model_inputs(*sentences)
    decoded = exported.greedy_decode(inputs["encoder_inputs"]).numpy()  # (N, max_length)

    def words(ids):
        ids = [int(i) for i in ids if i]
        return " ".join(target_vocabulary[i] for i in ids if i != end_id)

    hypotheses = [words(row) for row in decoded]
    references = [words(row) for row in targets.numpy()]
    exact = np.mean([h == r for h, r in zip(hypotheses, references, strict=True)])
    print(f"greedy decoding, {len(hypotheses)} test sentences: exact match {exact:.4f}")
    shown = zip(sentences[0].numpy()[:5], hypotheses, references, strict=False)
    for src, hypothesis, reference in shown:
        print(f"  {src.decode()!r}\n    -> {hypothesis!r}\n    reference {reference!r}")

    # -- plot: the alignment of the first translation ----------------------
    if args.plot:
        from keras_attn import plotting

        source = inputs["encoder_inputs"][:1].numpy()
        source = source[:, : max(1, int(np.count_nonzero(source)))]  # (1, S), no padding
        output = [int(i) for i in decoded[0] if i]  # up to and including the end id
        decoder_inputs = np.array([[start_id] + output[:-1]], "int32")  # (1, T)
        weights = alignment(args, model, build, source, decoder_inputs)  # (T, S)
        source_vocabulary = source_vectorizer.get_vocabulary()
        fig = plotting.plot_attention(
            weights,
            source_labels=[source_vocabulary[i] for i in source[0]],
            target_labels=[target_vocabulary[i] for i in output],
            title=f"{args.model} on {name}",
        )
        plotting.save_figure(fig, args.plot)
        print(f"Saved the attention plot {args.plot}")
    return {"dataset": name, "accuracy": accuracy, "exact_match": exact, "export": out}


def alignment(args, model, build, source, decoder_inputs):
    """Attention weights `(T, S)` of one teacher-forced pass over `decoder_inputs`."""
    inputs = {"encoder_inputs": source, "decoder_inputs": decoder_inputs}
    if args.model == "rnn":
        viewer = build(return_attention=True)  # the same layers, weights as an output
        viewer.set_weights(model.get_weights())
        return np.asarray(viewer(inputs)["attention"])[0]
    steps = models.decoding.decoding_steps(model)  # the Transformer's parts, as decoding uses
    encoded = steps.encoder(source, training=False)
    x = steps.embedding(decoder_inputs)
    for block in steps.blocks:
        x, _, cross_weights = block(x, encoded, return_attention_scores=True)  # (1, H, T, S)
    return np.asarray(cross_weights)[0].mean(axis=0)


if __name__ == "__main__":
    main()
