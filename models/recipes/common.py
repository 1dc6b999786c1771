"""What every recipe shares: run settings, the result, and offline data loading."""

import dataclasses

import keras
import numpy as np

from models.datasets import loading

START, END = "<s>", "</s>"


@dataclasses.dataclass
class Settings:
    """What a run may change: dataset, sizes, epochs (`None`: the task's default)."""

    dataset: str | None = None
    data_dir: str | None = None
    epochs: int | None = None
    train_examples: int | None = None
    test_examples: int = 500
    batch_size: int = 64
    download: bool = False
    seed: int = 0


@dataclasses.dataclass
class Result:
    """A trained model, its metrics, and how to export and plot it."""

    dataset: str
    model: keras.Model
    metrics: dict
    export: object  # callable(path): writes a SavedModel
    plot: object  # callable(path): writes a PNG of attention weights


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------


def load_supervised(name, split, settings):
    """`(inputs, targets)` pairs of `name`: ours are prepared locally; others must exist."""
    if name.startswith("keras_attn_"):
        return loading.load(name, split, settings.data_dir)
    import tensorflow_datasets as tfds

    try:
        return tfds.load(
            name,
            split=split,
            data_dir=settings.data_dir,
            as_supervised=True,
            download=settings.download,
        )
    except (AssertionError, FileNotFoundError) as error:  # tfds: "could not find data"
        raise FileNotFoundError(
            f"The tfds dataset {name!r} is not prepared in data_dir={settings.data_dir!r}. "
            "keras-attn does not download unless asked: pass --download (needs network), "
            "or run a task on one of the local datasets (`keras-attn list`)."
        ) from error


def take(ds, count):
    return ds if count is None else ds.take(count)


def numpy_pairs(ds):
    """A small dataset of `(x, y)` pairs as two stacked NumPy arrays (padded with -1)."""
    batches = list(ds.padded_batch(1 << 16, padding_values=loading.padding_values(ds.element_spec)))
    return tuple(np.asarray(t) for t in batches[0])


def text_vectorizer(texts, max_tokens=None):
    """A whitespace `TextVectorization` adapted on `texts` (0 = padding, 1 = unknown)."""
    vectorizer = keras.layers.TextVectorization(
        max_tokens=max_tokens, standardize=None, split="whitespace"
    )
    vectorizer.adapt(texts)
    return vectorizer
