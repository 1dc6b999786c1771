"""Load a tfds dataset offline: prepare the project's own builders locally, never download."""

import tensorflow as tf
import tensorflow_datasets as tfds

from .bundled import LocalBuilder

PAD_VALUE = -1.0  # pads float inputs: outside [0, 1), so `keras.layers.Masking(PAD_VALUE)` works
PAD_INDEX = -1  # pads integer (pointer) targets: never a valid index


def padding_values(element_spec):
    """The padding convention of `load(..., batch_size=...)` for a dataset's element spec.

    Args:
        element_spec: a (nested) `tf.TensorSpec` structure, e.g. `ds.element_spec`.

    Returns:
        The same structure of scalar tensors: `PAD_VALUE` for floats, `PAD_INDEX` for
        integers, `""` for strings; pass it to `Dataset.padded_batch(padding_values=...)`.

    Example:

    >>> spec = (tf.TensorSpec((None, 2), tf.float32), tf.TensorSpec((None,), tf.int32))
    >>> [float(v) for v in padding_values(spec)]
    [-1.0, -1.0]
    """

    def value(spec):
        if spec.dtype == tf.string:
            return tf.constant("", tf.string)
        return tf.constant(PAD_VALUE if spec.dtype.is_floating else PAD_INDEX, spec.dtype)

    return tf.nest.map_structure(value, element_spec)


def read_config():
    """tfds' `ReadConfig` without its in-memory cache of small datasets.

    tfds caches a small dataset whole; a pipeline that then reads only part of it
    (`take(k)`, a bounded evaluation) makes TensorFlow discard the partial cache and warn
    at every pass. Cache what you read instead: `load(...).take(k).cache()`.
    """
    return tfds.ReadConfig(try_autocache=False)


def load(name, split="train", data_dir=None, *, batch_size=None, shuffle_files=False):
    """Returns `(inputs, targets)` pairs of a tfds dataset, preparing it first if it is ours.

    The project's builders (`keras_attn_*`) are generated into `data_dir` on first use
    (seconds for the full configs, nothing downloaded). Any other tfds name must already
    be prepared in `data_dir`: this function never downloads, and raises instead of
    waiting for network retries.

    Args:
        name: a tfds name with its config, e.g. `"keras_attn_sorting/n10"` or
            `"ted_hrlr_translate/pt_to_en"`.
        split: a tfds split, e.g. `"train"`, `"validation"`, `"test[:50%]"`.
        data_dir: the tfds data directory; tfds' default (`$TFDS_DATA_DIR` or
            `~/tensorflow_datasets`) when None.
        batch_size: when given, batch with `padded_batch` and the padding of
            `padding_values` (floats -1.0, integers -1); a fixed-length config gives full
            tensors, a variable-length one pads each batch to its longest example.
        shuffle_files: passed to `as_dataset`.

    The dataset is not cached (`read_config`): call `.cache()` after any `take`.

    Returns:
        A `tf.data.Dataset` of `(inputs, targets)` (`as_supervised=True`).

    Raises:
        FileNotFoundError: `name` is not one of ours and is not prepared in `data_dir`.

    Example:

    ```python
    from .. import datasets
    ds = datasets.load("keras_attn_sorting/tiny", "test", "/tmp/tfds", batch_size=16)
    inputs, targets = next(iter(ds))  # (16, 5, 1) float32, (16, 5) int32
    ```
    """
    builder = tfds.builder(name, data_dir=data_dir)
    if not builder.is_prepared():
        if not isinstance(builder, LocalBuilder):  # ours: synthetic, or read from packages
            raise FileNotFoundError(
                f"{name!r} is not prepared in {builder.data_dir!r} and keras-attn never "
                "downloads. With network access, run once: "
                f"tfds.builder({name!r}, data_dir=...).download_and_prepare()"
            )
        builder.download_and_prepare(
            download_config=tfds.download.DownloadConfig(try_download_gcs=False)
        )
    ds = builder.as_dataset(
        split=split, as_supervised=True, shuffle_files=shuffle_files, read_config=read_config()
    )
    if batch_size is not None:
        ds = ds.padded_batch(batch_size, padding_values=padding_values(ds.element_spec))
    return ds
