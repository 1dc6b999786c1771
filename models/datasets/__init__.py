"""tfds datasets for the model zoo: the project's own synthetic builders and an offline loader.

Importing this package registers the builders with tensorflow-datasets:

- `keras_attn_sorting/{n5,n10,n15,n20,n5-20,n50,n100,tiny}`: floats `(n, 1)` -> argsort
  pointers `(n,)`;
- `keras_attn_convex_hull/{n5,n10,n50,n5-50,n100,n200,tiny}`: points `(n, 2)` -> hull
  indices `(k,)`;
- `keras_attn_seq2seq/{copy-5-20,reverse-5-20,reverse-5-50,addition-1-5,addition-1-10}` and
  `tiny-{copy,reverse,addition}`: text -> text (`Translation`, like `ted_hrlr_translate`).
- `keras_attn_ui_strings/pt_to_en` (Django and Sphinx message translations, like
  `ted_hrlr_translate/pt_to_en`) and `keras_attn_rt_polarity` (Rotten Tomatoes snippets,
  like `imdb_reviews`): real text read from installed packages (see `bundled`).

`load(name, split, data_dir, batch_size=...)` prepares them on first use, offline.
`keras_attn.models` itself does not import this package, so the layers and models work without
tensorflow-datasets installed.
"""

from ..geometry import (
    convex_hull_indices,
    hull_metrics,
    is_simple_polygon,
    open_polygon,
    polygon_area,
)
from .builders import (
    SPLITS,
    KerasAttnConvexHull,
    KerasAttnSeq2seq,
    KerasAttnSorting,
    SyntheticConfig,
)
from .bundled import KerasAttnRtPolarity, KerasAttnUiStrings
from .loading import PAD_INDEX, PAD_VALUE, load, padding_values

__all__ = [
    "PAD_INDEX",
    "PAD_VALUE",
    "SPLITS",
    "KerasAttnConvexHull",
    "KerasAttnRtPolarity",
    "KerasAttnSeq2seq",
    "KerasAttnSorting",
    "KerasAttnUiStrings",
    "SyntheticConfig",
    "convex_hull_indices",
    "hull_metrics",
    "is_simple_polygon",
    "load",
    "open_polygon",
    "padding_values",
    "polygon_area",
]
