"""`layout_map` and `check_layout`: a model of our layers sharded with `keras.distribution`.

Megatron's split (Shoeybi et al. 2019) of every Transformer block over the mesh's model
axis, `M` devices:

    attention      q, k, v (and gate) kernels (d, h, k) over the heads h (column-parallel);
                   the output kernel (h, k, d) over its input heads (row-parallel)
    feed-forward   the intermediate kernel (d, f) over f (and a gated one's gate kernel),
                   the output kernel (f, d) over f
    embeddings     token and position tables (V, d) over the vocabulary V, else over d;
                   an untied output table (d, V) likewise; the Dense that gives a model
                   output (the logits) over its units, else over its input
    the rest       replicated: norms, the row-parallel layers' biases, RNN cells, scores,
                   poolers, the small vectors, the dropout seeds

So a block's activations stay whole on every model device: one all-reduce after the
attention (the sum over heads in the output projection) and one after the feed-forward
(the sum over f), no gather between them. Weights are replicated over the batch axis (the
batch is split over it).

Keras matches a variable's path against the map's keys (an exact key first, else the
keys as regular expressions, `re.fullmatch`; two matching keys raise, none replicates the
variable silently): `layout_map` writes one key per kind of weight, its layers' numbers
generalised (`decoder_block(_\\d+)*/self_attention(_\\d+)*/query(_\\d+)*/kernel`), so the
keys also match a rebuild whose auto-numbered names differ; where layers named alike up to
their numbers split differently, their weights get exact keys. `check_layout` says which
variables a map misses or matches twice and which of its keys match nothing.

The map is read from a built model (paths and shapes only); build the model again under the
distribution, so that its variables are created sharded:

    with keras.StatelessScope(initialize_variables=False):  # shapes only, nothing allocated
        layouts = models.layout_map(build(), mesh)
    keras.backend.clear_session()  # drops the shapes-only model (and restarts the names)
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="batch"))
    model = build()
"""

import dataclasses
import re

import keras

import keras_attn

KV_HEADS = ("error", "replicate")
# The projections of a multi-head attention layer (ours, and Keras' MHA and GQA): kernels
# `(d, heads, head_dim)` and biases `(heads, head_dim)`; the output kernel `(heads, head_dim, d)`.
_HEAD_PROJECTIONS = ("query", "key", "value", "gate")
_ATTENTION = (
    keras_attn.MultiHeadAttention,
    keras.layers.MultiHeadAttention,
    keras.layers.GroupQueryAttention,
)
# The feed-forward sublayers of our Transformer blocks (keras-hub's weight names): the
# column-parallel ones (up, and a gated network's gate), then the row-parallel one.
_FEEDFORWARD = (
    "feedforward_intermediate_dense",
    "feedforward_gate_dense",
    "feedforward_output_dense",
)


def layout_map(
    model: keras.Model,
    device_mesh: keras.distribution.DeviceMesh,
    model_axis: str = "model",
    batch_axis: str | None = "batch",
    kv_heads: str = "error",
) -> keras.distribution.LayoutMap:
    """A `keras.distribution.LayoutMap` of every variable of `model`: Megatron's split.

    Sharded over `model_axis` (see the module's docstring): the heads of every multi-head
    attention layer (`keras_attn.MultiHeadAttention`, `GroupedQueryAttention`, Keras' own
    `MultiHeadAttention` / `GroupQueryAttention`), the intermediate dimension of every
    feed-forward (`keras_attn.FeedForward` and the Transformer blocks'), embedding tables
    (`keras.layers.Embedding` and `ReversibleEmbedding`, `keras_attn.PositionEmbedding`)
    over their rows (the vocabulary) or else their width, `keras_attn.RelativePositionBias`
    over its heads, and each `keras.layers.Dense` that gives a model output over its units or
    else its input. Every other variable is replicated by a rule of its own, so the map
    holds a key for every variable of `model.variables` and each variable matches exactly
    one key (`check_layout(model, layout_map(model, mesh)).ok`).

    Args:
        model: a built `keras.Model` (or layer); only its variables' paths and shapes are
            read, so it may be built under `keras.StatelessScope(initialize_variables=False)`.
        device_mesh: a `keras.distribution.DeviceMesh` with an axis named `model_axis`.
        model_axis: the mesh axis the weights are split over.
        batch_axis: the mesh axis the batch is split over (`None`: none); must differ from
            `model_axis`. The weights are replicated over it.
        kv_heads: `"error"`: key/value heads that do not divide the model axis raise, as
            every other indivisible dimension does; `"replicate"`: such key and value
            projections are kept whole on every device (grouped-query attention with fewer
            key/value heads than model devices).

    Returns:
        A `keras.distribution.LayoutMap` on `device_mesh`, for
        `keras.distribution.ModelParallel(layout_map=..., batch_dim_name=batch_axis)`.

    Raises:
        ValueError: an axis not in the mesh, `model_axis == batch_axis`, an unknown
            `kv_heads`, an unbuilt model, or a dimension to shard that is not a multiple of
            the model axis' size (naming the variable's path, its shape and the axis size).
        TypeError: `model` is not a Keras layer, `device_mesh` not a `DeviceMesh`.

    Example:

        mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"))
        layouts = models.layout_map(model, mesh)
        print(layouts["decoder_block_0/self_attention/query/kernel"].axes)  # (None, 'model', None)
        keras.distribution.set_distribution(
            keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="batch"))
        # ... then build the model again: its variables are created split (module docstring)
    """
    if not isinstance(model, keras.layers.Layer):
        raise TypeError(f"`model` must be a Keras model or layer. Received: model={model!r}")
    if not isinstance(device_mesh, keras.distribution.DeviceMesh):
        raise TypeError(
            "`device_mesh` must be a keras.distribution.DeviceMesh. "
            f"Received: device_mesh={device_mesh!r}"
        )
    size = _axis_size(device_mesh, "model_axis", model_axis)
    if batch_axis is not None:
        _axis_size(device_mesh, "batch_axis", batch_axis)
        if batch_axis == model_axis:
            raise ValueError(
                "`batch_axis` and `model_axis` must be different mesh axes. "
                f"Received: batch_axis={batch_axis!r}, model_axis={model_axis!r}"
            )
    if kv_heads not in KV_HEADS:
        raise ValueError(f"`kv_heads` must be one of {KV_HEADS}. Received: kv_heads={kv_heads!r}")
    if not model.built:
        raise ValueError(
            f"`model` must be built (its variables created) first. Received: {model.name!r}, "
            "not built"
        )
    split = _Split(model_axis, size, kv_heads)
    outputs = _output_layers(model)
    for layer in model._flatten_layers():
        split.layer(layer, id(layer) in outputs)
    return _rules(model, device_mesh, split)


@dataclasses.dataclass(frozen=True)
class LayoutCheck:
    """What `check_layout` found: a map's gaps, as variable paths and map keys.

    Attributes:
        unmatched: paths of the variables no key matches (Keras replicates them silently).
        ambiguous: paths of the variables more than one key matches (Keras raises when it
            creates them).
        unused: the keys that match no variable (a rule that shards nothing; keys meant for
            layer outputs, `.../output`, are listed here too).
        ok: none of these.
    """

    unmatched: tuple[str, ...]
    ambiguous: tuple[str, ...]
    unused: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not (self.unmatched or self.ambiguous or self.unused)


def check_layout(model: keras.Model, layout_map: keras.distribution.LayoutMap) -> LayoutCheck:
    """Which variables of `model` a `LayoutMap` misses, or matches twice, and its unused keys.

    A variable matches as Keras matches it (`LayoutMap.__getitem__`): the key equal to its
    path, else every key that `re.fullmatch`es the path. Reads `model.variables` (the
    weights and the other state, e.g. dropout seeds).

    Args:
        model: a built `keras.Model` (or layer).
        layout_map: a `keras.distribution.LayoutMap` (e.g. from `layout_map`).

    Returns:
        A `LayoutCheck`: `unmatched` and `ambiguous` variable paths, `unused` keys, in the
        order of `model.variables` and of the map; `.ok` when all three are empty.

    Example:

        found = models.check_layout(model, layouts)
        assert found.ok, found
    """
    if not isinstance(layout_map, keras.distribution.LayoutMap):
        raise TypeError(
            "`layout_map` must be a keras.distribution.LayoutMap. "
            f"Received: layout_map={layout_map!r}"
        )
    keys = list(layout_map)
    exact, used, unmatched, ambiguous = set(keys), set(), [], []
    for variable in model.variables:
        path = variable.path
        found = [path] if path in exact else [k for k in keys if re.fullmatch(k, path)]
        if not found:
            unmatched.append(path)
        elif len(found) > 1:
            ambiguous.append(path)
        used.update(found)
    unused = tuple(k for k in keys if k not in used)
    return LayoutCheck(tuple(unmatched), tuple(ambiguous), unused)


# ---------------------------------------------------------------------------
# The split: each variable's axes, layer by layer
# ---------------------------------------------------------------------------


def _axis_size(mesh, argument, name):
    if name not in mesh.axis_names:
        raise ValueError(
            f"`{argument}` must name an axis of the device mesh {tuple(mesh.axis_names)}. "
            f"Received: {argument}={name!r}"
        )
    return mesh.shape[list(mesh.axis_names).index(name)]


def _sublayers(layer):
    return layer._flatten_layers(include_self=False, recursive=False)


def _output_layers(model):
    """The ids of the layers whose call gives a functional model's outputs."""
    outputs = getattr(model, "outputs", None) or ()
    return {id(t._keras_history.operation) for t in outputs if hasattr(t, "_keras_history")}


class _Split:
    """The axes chosen for each variable (by id); variables left out are replicated."""

    def __init__(self, axis, size, kv_heads):
        self.axis, self.size, self.kv_heads = axis, size, kv_heads
        self.axes = {}

    def layer(self, layer, gives_output):
        """Claims the variables `layer` shards: its own, or its projections'."""
        if isinstance(layer, _ATTENTION):
            for sub in _sublayers(layer):
                self._projection(sub)
        elif isinstance(layer, (keras_attn.TransformerEncoder, keras_attn.TransformerDecoder)):
            for sub in _sublayers(layer):
                if sub.name in _FEEDFORWARD:
                    self._feedforward(sub, sub.name != _FEEDFORWARD[-1])
        elif isinstance(layer, keras_attn.FeedForward):
            self._feedforward(layer.intermediate_dense, True)
            self._feedforward(layer.output_dense, False)
        elif isinstance(layer, keras.layers.Embedding):
            self._table(layer.embeddings, rows=0)
            if getattr(layer, "reverse_embeddings", None) is not None:  # untied (d, V)
                self._table(layer.reverse_embeddings, rows=1)
        elif isinstance(layer, keras_attn.PositionEmbedding):
            self._table(layer.position_embeddings, rows=0)
        elif isinstance(layer, keras_attn.RelativePositionBias):  # (buckets, heads)
            self.shard(layer.table, 1, "heads")
        elif isinstance(layer, keras.layers.Dense) and gives_output:
            self._output_dense(layer)

    def shard(self, variable, dim, what, hint=""):
        """Splits `variable` along `dim`, or `ValueError` if the axis does not divide it."""
        if variable.shape[dim] % self.size:
            raise ValueError(
                f"Cannot shard `{variable.path}` of shape {tuple(variable.shape)} over the mesh "
                f"axis {self.axis!r} of size {self.size}: its {what} ({variable.shape[dim]}) "
                f"is not a multiple of {self.size}.{hint}"
            )
        self.axes[id(variable)] = tuple(
            self.axis if i == dim else None for i in range(len(variable.shape))
        )

    def _divides(self, variable, dim):
        return variable.shape[dim] % self.size == 0

    def _projection(self, dense):
        """An attention projection: q/k/v/gate over their heads, the output over its input."""
        if dense.name == "attention_output":
            self.shard(dense.kernel, 0, "number of heads")  # (h, k, d): row-parallel
            return
        if dense.name not in _HEAD_PROJECTIONS:
            return
        if dense.name in ("key", "value"):
            if self.kv_heads == "replicate" and not self._divides(dense.kernel, 1):
                return  # replicated
            hint = " Pass kv_heads='replicate' to keep the key/value heads whole on every device."
        else:
            hint = ""
        self.shard(dense.kernel, 1, "number of heads", hint)  # (d, h, k): column-parallel
        if dense.bias is not None:
            self.shard(dense.bias, 0, "number of heads", hint)  # (h, k)

    def _feedforward(self, dense, intermediate):
        if intermediate:  # (d, f) and (f,): column-parallel
            self.shard(dense.kernel, 1, "intermediate dimension")
            if dense.bias is not None:
                self.shard(dense.bias, 0, "intermediate dimension")
        else:  # (f, d): row-parallel, its bias replicated
            self.shard(dense.kernel, 0, "intermediate dimension")

    def _table(self, variable, rows):
        """A table over its rows (vocabulary, positions) if they divide, else its width."""
        width = 1 - rows
        if self._divides(variable, rows):
            self.shard(variable, rows, "rows")
        elif self._divides(variable, width):
            self.shard(variable, width, "width")
        else:
            raise ValueError(
                f"Cannot shard `{variable.path}` of shape {tuple(variable.shape)} over the mesh "
                f"axis {self.axis!r} of size {self.size}: neither its {variable.shape[rows]} "
                f"rows (the vocabulary or the positions) nor its width {variable.shape[width]} "
                f"is a multiple of {self.size}. Pad the vocabulary to a multiple of {self.size}."
            )

    def _output_dense(self, dense):
        """The logits: over the units (column-parallel), else over the input (row-parallel)."""
        if self._divides(dense.kernel, 1):
            self.shard(dense.kernel, 1, "units")
            if dense.bias is not None:
                self.shard(dense.bias, 0, "units")
        elif self._divides(dense.kernel, 0):
            self.shard(dense.kernel, 0, "input width")
        else:
            raise ValueError(
                f"Cannot shard `{dense.kernel.path}` of shape {tuple(dense.kernel.shape)} (the "
                f"output layer {dense.name!r}) over the mesh axis {self.axis!r} of size "
                f"{self.size}: neither its units ({dense.kernel.shape[1]}) nor its input width "
                f"({dense.kernel.shape[0]}) is a multiple of {self.size}."
            )


# ---------------------------------------------------------------------------
# The keys: one per kind of variable
# ---------------------------------------------------------------------------


def _pattern(path):
    """`path` as a regular expression that also matches its layers renumbered.

    In each layer name of the path (all but the last name, the variable's), the trailing
    `_<n>` that Keras appends to make a name unique becomes `(_\\d+)*`, so that
    `seed_generator`, `seed_generator_3` and a rebuild's `seed_generator_9` share a key, as
    do `decoder_block_0` and `decoder_block_11`; any other run of digits becomes `\\d+`.
    A path matches exactly one such key (a regular expression never matches across a `/`,
    and the suffix of a name is recovered from it), so the keys never overlap.
    """
    *layers, variable = path.split("/")
    names = [_generalised(re.sub(r"(?:_\d+)+$", "", name)) + r"(_\d+)*" for name in layers]
    return "/".join([*names, _generalised(variable)])


def _generalised(name):
    """`name` escaped, each run of digits as `\\d+`."""
    parts = re.split(r"(\d+)", name)  # odd items: the runs of digits
    return "".join(r"\d+" if i % 2 else re.escape(part) for i, part in enumerate(parts))


def _rules(model, device_mesh, split):
    """The `LayoutMap`: a key per pattern, or per path where one pattern's variables differ.

    Distinct patterns never match the same path (the runs of digits are maximal, so a
    path's pattern is unique), and a pattern matches its own variables only.
    """
    groups = {}  # pattern -> {path: axes}
    for variable in model.variables:
        axes = split.axes.get(id(variable), (None,) * len(variable.shape))
        paths = groups.setdefault(_pattern(variable.path), {})
        if paths.setdefault(variable.path, axes) != axes:
            raise ValueError(
                f"Two variables share the path `{variable.path}` but not a layout, "
                f"{paths[variable.path]} and {axes}: a layout map tells them apart by path "
                "only. Give their layers distinct names."
            )
    result = keras.distribution.LayoutMap(device_mesh)
    for pattern, paths in groups.items():
        if len(set(paths.values())) == 1:
            result[pattern] = next(iter(paths.values()))
        else:  # e.g. layers numbered alike with heads that divide and heads kept whole
            for path, axes in paths.items():
                result[re.escape(path)] = axes
    return result
