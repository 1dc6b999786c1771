"""`load_run`: the text model of a task's last run (what `keras-attn train` wrote)."""

import os

import keras

from .classifier import TextClassifier
from .language_model import TextLanguageModel
from .seq2seq import TextSeq2Seq

RUNS = "keras_attn_runs"


def load_run(task: str, runs_dir: str = RUNS, tasks: dict | None = None) -> keras.Model:
    """The text model of `task`'s last run in `runs_dir` (what `keras-attn train` wrote).

    Args:
        task: a text task of `keras-attn list` (seq2seq, language model or classifier).
        runs_dir: the run directory (`keras-attn train --output`).
        tasks: `{task: whether it is a text task}` of `keras-attn train` (the CLI passes the
            recipes'), so a missing run of a task that is none says so; None: not known.

    Returns:
        A `TextSeq2Seq`, `TextLanguageModel` or `TextClassifier`: `predict_text(["..."])`
        gives one string per input; `export_text(path)` the SavedModel.

    Example:

    >>> from keras_attn.models import text
    >>> model = text.load_run("transformer-reverse")  # doctest: +SKIP
    >>> model.predict_text(["n a f h g"])  # doctest: +SKIP
    ['g h f a n']
    """
    path = os.path.join(runs_dir, f"{task}.keras")
    if not os.path.exists(path):
        if tasks is not None and not tasks.get(task):  # no text task: no use training it
            what = "no text task" if task in tasks else "no task of keras-attn"
            raise FileNotFoundError(
                f"No run of {task!r} in {runs_dir!r} (no {path}), and {task!r} is {what}: "
                f"`predict` takes the text tasks {', '.join(t for t in tasks if tasks[t])} "
                "(`keras-attn list`), or a run of your own saved as RUNS_DIR/NAME.keras."
            )
        raise FileNotFoundError(
            f"No run of {task!r} in {runs_dir!r} (no {path}): train it first with "
            f"`keras-attn train {task} --output {runs_dir}`."
        )
    model = keras.saving.load_model(path, safe_mode=True)
    if not isinstance(model, TextSeq2Seq | TextLanguageModel | TextClassifier):
        raise ValueError(
            f"The run of {task!r} holds no text model (a {type(model).__name__}): `predict` "
            f"takes the text tasks (seq2seq, language model, classifiers). Received: task={task!r}"
        )
    return model
