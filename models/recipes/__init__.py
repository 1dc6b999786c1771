"""Training recipes: one per task (a zoo model + a tfds dataset), run by `keras-attn train`.

Each recipe loads its dataset (the project's own builders are generated
locally; a real tfds dataset must already be prepared in `data_dir`, or
`download=True`), builds the model, trains it with `model.fit`, evaluates the
task's metric, and returns a `Result` with what the command saves, exports and
plots. Nothing here downloads unless asked to.
"""

from models.recipes.common import Result, Settings, load_supervised
from models.recipes.pointer import pointer_task
from models.recipes.seq2seq import seq2seq_task
from models.recipes.text_classification import imdb_task

# ---------------------------------------------------------------------------
# The tasks
# ---------------------------------------------------------------------------

TASKS = {
    "pointer-sort": (
        "pointer network (LSTM encoder) sorting 5 numbers: keras_attn_sorting/n5",
        pointer_task("pointer-sort", "keras_attn_sorting/n5"),
    ),
    "pointer-hull": (
        "pointer network on convex hulls (closed as in the paper): keras_attn_convex_hull/n5",
        pointer_task("pointer-hull", "keras_attn_convex_hull/n5"),
    ),
    "transformer-reverse": (
        "Transformer seq2seq reversing 5-20 tokens: keras_attn_seq2seq/reverse-5-20",
        seq2seq_task("transformer-reverse", "keras_attn_seq2seq/reverse-5-20", "transformer"),
    ),
    "rnn-attention-reverse": (
        "RNN seq2seq, additive attention, reversing 5-20 tokens: keras_attn_seq2seq/reverse-5-20",
        seq2seq_task("rnn-attention-reverse", "keras_attn_seq2seq/reverse-5-20", "rnn"),
    ),
    "imdb-transformer": (
        "Transformer classifier (attention pooling) on imdb_reviews (prepared, or --download)",
        imdb_task("imdb-transformer", "transformer"),
    ),
    "imdb-han": (
        "hierarchical attention network on imdb_reviews (prepared, or --download)",
        imdb_task("imdb-han", "han"),
    ),
    "ted-translate": (
        "Transformer pt->en: ted_hrlr_translate/pt_to_en (prepared in --data-dir, or --download)",
        seq2seq_task("ted-translate", "ted_hrlr_translate/pt_to_en", "transformer"),
    ),
}


def train(task, settings=None):
    """Runs a task's recipe; returns its `Result`."""
    if task not in TASKS:
        raise ValueError(f"Unknown task {task!r}. Tasks: {', '.join(TASKS)}")
    return TASKS[task][1](settings or Settings())


__all__ = ["TASKS", "Result", "Settings", "load_supervised", "train"]
