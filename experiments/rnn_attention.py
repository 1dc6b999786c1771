"""RNN seq2seq with and without attention, as the sequence grows.

Bahdanau et al. (2015, figure 2) showed the encoder-decoder without attention
falling apart on long sentences, because one fixed-size state must carry the
whole source. This command measures that on the project's generated tasks
(`keras_attn_seq2seq`): for each length, the same `keras_attn.models.rnn_seq2seq` is
trained with `score=None` and with each attention score under the same number
of steps, and evaluated by greedy decoding on held-out sources. Every
evaluation point records the training time so far, so the same runs also give
the comparison at equal wall-clock time.

    python -m experiments.rnn_attention --task copy --lengths 10,20,40,80 \\
        --steps 1500 --output results/rnn_attention.json --plot results/rnn_attention.png

Copy is the task for this question: the first target token sits farthest from
the encoder's final state (reversal puts it right next to it, the easiest case
without attention).
"""

import argparse
import sys
import time

import keras
import numpy as np

from experiments import store

SCORES = ("none", "additive", "dot", "scaled_dot", "bilinear")
PAD, START, END = 0, 1, 2


# ---------------------------------------------------------------------------
# Data: the generated tfds task at one fixed length
# ---------------------------------------------------------------------------


def load_task(task, length, num_train, num_test, data_dir):
    """`(train, test)` lists of `(source, target)` strings of `keras_attn_seq2seq`."""
    import tensorflow_datasets as tfds

    from keras_attn.models.datasets import KerasAttnSeq2seq, SyntheticConfig

    config = SyntheticConfig(
        name=f"{task}-{length}-{length}-{num_train}",
        task=task,
        min_len=length,
        max_len=length,
        num_train=num_train,
        num_validation=num_test,
        num_test=num_test,
    )
    builder = KerasAttnSeq2seq(config=config, data_dir=data_dir)
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False)
    )

    def pairs(split):
        ds = builder.as_dataset(split=split, as_supervised=True)
        return [(s.decode(), t.decode()) for s, t in ds.as_numpy_iterator()]

    return pairs("train"), pairs("test")


def vocabulary(pairs):
    """Token -> id, after padding, start and end."""
    tokens = sorted({w for pair in pairs for text in pair for w in text.split()})
    return {w: i + 3 for i, w in enumerate(tokens)}


def encode(pairs, vocab):
    """Source ids `(N, S)`, decoder inputs and labels `(N, T + 1)` (0-padded)."""
    sources = [[vocab[w] for w in s.split()] for s, _ in pairs]
    targets = [[vocab[w] for w in t.split()] for _, t in pairs]
    source = np.zeros((len(pairs), max(map(len, sources))), "int32")
    inputs = np.zeros((len(pairs), max(map(len, targets)) + 1), "int32")
    labels = np.zeros_like(inputs)
    for i, (s, t) in enumerate(zip(sources, targets, strict=True)):
        source[i, : len(s)] = s
        inputs[i, : len(t) + 1] = [START] + t
        labels[i, : len(t) + 1] = t + [END]
    return source, inputs, labels


def decoded_accuracy(decoded, labels):
    """Token accuracy over the real label positions (the end token included) and
    whole-sequence accuracy (every one of them right).

    >>> labels = np.array([[5, 6, 2, 0], [7, 2, 0, 0]])
    >>> decoded = np.array([[5, 9, 2, 0], [7, 2, 0, 0]])
    >>> decoded_accuracy(decoded, labels)
    (0.8, 0.5)
    """
    real = labels != PAD
    right = (decoded[:, : labels.shape[1]] == labels) & real
    token = float(right.sum() / real.sum())
    sequence = float(np.mean(np.all(right | ~real, axis=1)))
    return token, sequence


# ---------------------------------------------------------------------------
# One run
# ---------------------------------------------------------------------------


class _Evaluate(keras.callbacks.Callback):
    """After every "epoch" (a block of steps): training time so far, greedy accuracy."""

    def __init__(self, source, labels, steps_per_block):
        super().__init__()
        self.source, self.labels, self.steps_per_block = source, labels, steps_per_block
        self.curve, self.train_seconds = [], 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self.started = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.train_seconds += time.perf_counter() - self.started
        from keras_attn.models.decoding import greedy_decode

        decoded = np.asarray(
            greedy_decode(self.model, self.source, self.labels.shape[1], START, END)
        )
        token, sequence = decoded_accuracy(decoded, self.labels)
        self.curve.append(
            {
                "step": (epoch + 1) * self.steps_per_block,
                "train_seconds": round(self.train_seconds, 2),
                "loss": float(logs["loss"]),
                "token_accuracy": token,
                "sequence_accuracy": sequence,
            }
        )


def run(score, train, test, vocab_size, args):
    """Trains one model; returns its evaluation curve."""
    import tensorflow as tf

    from keras_attn.models import rnn_seq2seq

    keras.utils.set_random_seed(args.seed)
    model = rnn_seq2seq(
        vocab_size,
        vocab_size,
        embedding_dim=args.embedding_dim,
        units=args.units,
        score=None if score == "none" else score,
    )
    model.compile(
        optimizer=keras.optimizers.Adam(args.learning_rate, clipnorm=1.0),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=PAD),
    )
    source, inputs, labels = train
    data = (
        tf.data.Dataset.from_tensor_slices(
            ({"encoder_inputs": source, "decoder_inputs": inputs}, labels)
        )
        .shuffle(len(source), seed=args.seed)
        .repeat()
        .batch(args.batch_size)
    )
    blocks = max(1, args.steps // args.eval_every)
    evaluate = _Evaluate(test[0], test[2], args.eval_every)
    model.fit(data, steps_per_epoch=args.eval_every, epochs=blocks, callbacks=[evaluate], verbose=0)
    return {"parameters": model.count_params(), "curve": evaluate.curve}


# ---------------------------------------------------------------------------
# Tables and the plot
# ---------------------------------------------------------------------------


def at_time(curve, seconds):
    """The last evaluation point reached within `seconds` of training (None if none)."""
    reached = [point for point in curve if point["train_seconds"] <= seconds * 1.001]
    return reached[-1] if reached else None


def table(results, lengths, scores):
    """Markdown: sequence (token) accuracy per length, at equal steps and equal time."""
    lines = []
    for title, pick in (
        ("equal steps", lambda runs, score: runs[score]["curve"][-1]),
        (
            "equal wall-clock (the no-attention run's training time)",
            lambda runs, score: (
                at_time(runs[score]["curve"], runs["none"]["curve"][-1]["train_seconds"])
                if "none" in runs
                else None
            ),  # fmt: skip
        ),
    ):
        lines += [f"\n{title}: sequence accuracy % (token accuracy %)\n"]
        lines += ["| length | " + " | ".join(scores) + " |", "|---" * (len(scores) + 1) + "|"]
        for length in lengths:
            runs = results[str(length)]
            cells = []
            for score in scores:
                point = pick(runs, score)
                cells.append(
                    "-"
                    if point is None
                    else f"{100 * point['sequence_accuracy']:.1f} "
                    f"({100 * point['token_accuracy']:.1f})"
                )
            lines.append(f"| {length} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results, lengths, scores, path):
    from keras_attn import plotting

    figure = plotting._new_figure(10, 4)
    axes = figure.subplots(1, 2)
    for score in scores:
        final = [results[str(n)][score]["curve"][-1] for n in lengths]
        for axis, key in zip(axes, ("sequence_accuracy", "token_accuracy"), strict=True):
            axis.plot(lengths, [100 * p[key] for p in final], marker="o", label=score)
    for axis, key in zip(axes, ("whole-sequence", "per-token"), strict=True):
        axis.set(xscale="log", xlabel="sequence length", ylabel=f"{key} accuracy (%)")
        axis.set_xticks(lengths, [str(n) for n in lengths])
        axis.minorticks_off()
        axis.set_ylim(-2, 102)
        axis.grid(alpha=0.3)
    axes[0].legend(title="attention score")
    figure.suptitle("RNN seq2seq: attention vs none, equal training steps")
    plotting.save_figure(figure, path)


# ---------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------


def _parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="copy", choices=["copy", "reverse", "addition"])
    parser.add_argument("--lengths", default="10,20,40,80")
    parser.add_argument("--scores", default=",".join(SCORES))
    parser.add_argument("--steps", type=int, default=1500, help="training steps per run")
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--units", type=int, default=128)
    parser.add_argument("--embedding-dim", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--train-examples", type=int, default=50_000)
    parser.add_argument("--test-examples", type=int, default=500)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="results/rnn_attention.json")
    parser.add_argument("--plot", default=None, help="PNG of accuracy vs length")
    return parser


def main(argv=None):
    args = _parser().parse_args(argv)
    lengths = [int(n) for n in args.lengths.split(",")]
    scores = args.scores.split(",")
    unknown = sorted(set(scores) - set(SCORES))
    if unknown:
        raise SystemExit(f"--scores: unknown {unknown}; choose from {','.join(SCORES)}")
    settings = {k: v for k, v in vars(args).items() if k not in ("output", "plot", "data_dir")}
    # Resume: keep the runs already measured with these settings (lengths and scores may grow).
    results = store.load(args.output, settings, free=("lengths", "scores"))
    for length in lengths:
        train, test = load_task(
            args.task, length, args.train_examples, args.test_examples, args.data_dir
        )
        vocab = vocabulary(train + test)
        encoded = encode(train, vocab), encode(test, vocab)
        runs = results.setdefault(str(length), {})
        for score in scores:
            if score in runs:
                continue
            runs[score] = run(score, *encoded, len(vocab) + 3, args)
            last = runs[score]["curve"][-1]
            print(
                f"length {length:3d} {score:>10}: sequence {100 * last['sequence_accuracy']:5.1f}%"
                f"  token {100 * last['token_accuracy']:5.1f}%  ({last['train_seconds']:.0f} s)",
                flush=True,
            )
            store.save(args.output, settings, results)
    print(table(results, lengths, scores))
    if args.plot:
        plot(results, lengths, scores, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
