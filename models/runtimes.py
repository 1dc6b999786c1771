"""A language model's decoding for runtimes outside TensorFlow: ONNX (run by ONNX Runtime) and
TFLite (run by LiteRT).

Both convert the token-level signatures of `TextLanguageModel.export_text`'s SavedModel:
`prefill` and `decode_step` (streaming: the KV cache in and out as tensors) and `greedy_decode`
(the whole greedy loop in one graph). The text signatures (`serving_default`, `generate`) hold
TensorFlow's string ops and lookup tables, which neither format has: a client maps words to
ids itself, with the `vocabulary.txt` written next to the models (one token a line; ids 0 and
1 are padding and `[UNK]`, the file's first line is id 2).

    from keras_attn.models import export_onnx, export_tflite

    export_onnx("keras_attn_runs/transformer-lm_savedmodel", "lm_onnx")
    export_tflite("keras_attn_runs/transformer-lm_savedmodel", "lm_tflite")

The packages are extras: `pip install keras-attn[onnx]` (tf2onnx, onnx, onnxruntime) and
`keras-attn[litert]` (ai-edge-litert, the interpreter; the converter is TensorFlow's).
"""

import os
import shutil
import tempfile
from collections.abc import Sequence

from .files import write_atomically
from .text import TextLanguageModel

SIGNATURES = ("prefill", "decode_step", "greedy_decode")
# `decode_step`'s cache inputs in ONNX: an ONNX graph's inputs and outputs cannot share a
# name, and the outputs keep `prefill`'s (`keys`, ...), so the inputs take this prefix.
PAST = "past_"
CACHE = ("keys", "values", "valid", "positions", "index")


def export_onnx(
    model: TextLanguageModel | str | os.PathLike,
    directory: str | os.PathLike,
    signatures: Sequence[str] = SIGNATURES,
    opset: int = 17,
) -> dict:
    """Converts a language model's decoding signatures to ONNX, one file each.

    Writes `DIRECTORY/NAME.onnx` for each signature (each with its own copy of the weights)
    and `DIRECTORY/vocabulary.txt`. The models take and give what the SavedModel's
    signatures do (docs/serving.md), except that `decode_step`'s cache inputs are named
    `past_keys`, `past_values`, `past_valid`, `past_positions` and `past_index` (its `token`
    keeps its name, its outputs are `prefill`'s: `logits`, `keys`, ...). TensorFlow's check
    of `index` is not converted (ONNX has no assertion): a client makes at most
    `max_length - 1` steps after `prefill`.

    Two TensorFlow ops have no tf2onnx conversion and are converted here: the cache writes'
    `XlaDynamicUpdateSlice` (as `ScatterND` at the clamped start, XLA's rule) and GELU's
    `Erfc` (as `1 - Erf`).

    Args:
        model: a `TextLanguageModel`, or the path of its `export_text` SavedModel.
        directory: where the files go (made if missing; files of the same names replaced).
        signatures: the signatures to convert, of `"prefill"`, `"decode_step"`,
            `"greedy_decode"`.
        opset: the ONNX opset, at least 13.

    Returns:
        `{signature: path of its .onnx file}`.

    Raises:
        ValueError: a signature the SavedModel does not have, an opset below 13, or a graph
            that holds ops ONNX does not define after conversion (named).
    """
    _check(model, signatures)
    if isinstance(opset, bool) or not isinstance(opset, int) or opset < 13:
        raise ValueError(f"`opset` must be an integer of at least 13. Received: opset={opset!r}")
    tf2onnx = _extra("tf2onnx", "onnx")
    _extra("onnx", "onnx")
    handlers = {"Erfc": (_erfc, []), "XlaDynamicUpdateSlice": (_dynamic_update_slice, [])}
    written = {}
    with tempfile.TemporaryDirectory() as scratch:
        path = _saved_model(model, scratch)
        loaded = _load(path, signatures)
        os.makedirs(directory, exist_ok=True)
        for name in signatures:
            function, specs = _onnx_function(loaded.signatures[name], name)
            proto, _ = tf2onnx.convert.from_function(
                function, input_signature=specs, opset=opset, custom_op_handlers=handlers
            )
            unknown = sorted(_undefined_ops(proto.graph))
            if unknown:
                raise ValueError(
                    f"The {name!r} signature holds ops that ONNX does not define after "
                    f"conversion (tf2onnx {tf2onnx.__version__}): {', '.join(unknown)}"
                )
            target = os.path.join(directory, f"{name}.onnx")
            write_atomically(target, _writer(proto.SerializeToString()))
            written[name] = target
        _copy_vocabulary(path, directory)
    return written


def export_tflite(
    model: TextLanguageModel | str | os.PathLike,
    directory: str | os.PathLike,
    signatures: Sequence[str] = SIGNATURES,
) -> str:
    """Converts a language model's decoding signatures to one TFLite model, builtin ops only.

    Writes `DIRECTORY/model.tflite` (one signature runner per signature, the SavedModel's
    names, inputs and outputs; `-inf` logits become the lowest float32) and
    `DIRECTORY/vocabulary.txt`. LiteRT runs it:
    `ai_edge_litert.interpreter.Interpreter(model_path=...).get_signature_runner("decode_step")`.
    TensorFlow's check of `decode_step`'s `index` is not converted: a client makes at most
    `max_length - 1` steps after `prefill`.

    Args:
        model: a `TextLanguageModel`, or the path of its `export_text` SavedModel.
        directory: where the files go (made if missing; files of the same names replaced).
        signatures: the signatures to convert, of `"prefill"`, `"decode_step"`,
            `"greedy_decode"`.

    Returns:
        The path of `model.tflite`.

    Raises:
        ValueError: a signature the SavedModel does not have.
    """
    import tensorflow as tf

    _check(model, signatures)
    with tempfile.TemporaryDirectory() as scratch:
        path = _saved_model(model, scratch)
        loaded = _load(path, signatures)
        if len(signatures) == 1:
            keys = list(signatures)
            converter = tf.lite.TFLiteConverter.from_saved_model(path, signature_keys=keys)
        else:  # (given several keys of a Keras export, `from_saved_model` converts `serve`)
            functions = [_named(loaded.signatures[name], name) for name in signatures]
            converter = tf.lite.TFLiteConverter.from_concrete_functions(functions, loaded)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        content = converter.convert()
        os.makedirs(directory, exist_ok=True)
        target = os.path.join(directory, "model.tflite")
        write_atomically(target, _writer(content))
        _copy_vocabulary(path, directory)
    return target


def _check(model, signatures):
    if isinstance(signatures, str) or not signatures:
        raise ValueError(
            f"`signatures` must be a non-empty list of {SIGNATURES}. Received: {signatures!r}"
        )
    unknown = [name for name in signatures if name not in SIGNATURES]
    if unknown:
        raise ValueError(f"`signatures` must be of {SIGNATURES}. Received: {unknown}")
    if not isinstance(model, TextLanguageModel | str | os.PathLike):
        raise TypeError(
            "`model` must be a TextLanguageModel or the path of its export_text SavedModel. "
            f"Received: {type(model).__name__}"
        )


def _extra(module, extra):
    """`import module`, or an ImportError that names the extra holding it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"{module} is not installed: `pip install 'keras-attn[{extra}]'`"
        ) from error


def _saved_model(model, scratch):
    """The SavedModel's path: `model`'s, or `model.export_text` written under `scratch`."""
    if isinstance(model, TextLanguageModel):
        path = os.path.join(scratch, "savedmodel")
        model.export_text(path)
        return path
    return os.fspath(model)


def _load(path, signatures):
    """The SavedModel at `path`, checked: a language model's `export_text`."""
    import tensorflow as tf

    loaded = tf.saved_model.load(path)
    missing = [name for name in signatures if name not in loaded.signatures]
    if not os.path.exists(os.path.join(path, "assets", "vocabulary.txt")):
        missing.append("assets/vocabulary.txt")
    if missing:
        raise ValueError(
            "`model` must be the path of a language model's export_text SavedModel (with "
            f"signatures {list(signatures)} and assets/vocabulary.txt). Received: {path!r}, "
            f"without {', '.join(missing)}"
        )
    return loaded


def _copy_vocabulary(path, directory):
    source = os.path.join(path, "assets", "vocabulary.txt")
    target = os.path.join(directory, "vocabulary.txt")
    write_atomically(target, lambda temporary: shutil.copyfile(source, temporary))


def _writer(content):
    """`write_atomically`'s `write` of `content` (bytes)."""

    def write(path):
        with open(path, "wb") as f:
            f.write(content)

    return write


def _named(signature, name):
    """`signature` as a concrete function named `name`: the signature key TFLite gives it
    when it converts several."""
    import tensorflow as tf

    def call(**inputs):
        return signature(**inputs)

    call.__name__ = name
    inputs = signature.structured_input_signature[1]
    return tf.function(call, autograph=False).get_concrete_function(**inputs)


def _onnx_function(signature, name):
    """A tf.function of `signature` with flat, named inputs (`decode_step`'s cache: `past_*`)
    and its input specs: what `tf2onnx.convert.from_function` converts."""
    import tensorflow as tf

    inputs = signature.structured_input_signature[1]  # {name: TensorSpec}
    renamed = {
        (PAST + key if name == "decode_step" and key in CACHE else key): key for key in inputs
    }
    specs = [tf.TensorSpec(inputs[key].shape, inputs[key].dtype, name=new) for new, key in
             renamed.items()]  # fmt: skip

    @tf.function(input_signature=specs, autograph=False)
    def function(*tensors):
        return signature(**{renamed[spec.name]: t for spec, t in zip(specs, tensors, strict=True)})

    return function, specs


def _undefined_ops(graph):
    """The op types of `graph` (and its loops' bodies) that no ONNX opset defines."""
    import onnx

    found = set()
    for node in graph.node:
        if not onnx.defs.has(node.op_type, node.domain):
            found.add(node.op_type)
        for attribute in node.attribute:
            for body in [attribute.g, *attribute.graphs]:
                found |= _undefined_ops(body)
    return found


# tf2onnx handlers, in its `custom_op_handlers` form: `(graph, node, name, args)`, the node
# rewritten in place into ONNX ops.


def _erfc(graph, node, name, args):
    """`Erfc(x)` (exact GELU) as `1 - Erf(x)`."""
    import numpy as np
    from tf2onnx import utils

    dtype = utils.map_onnx_to_numpy_type(graph.get_dtype(node.input[0]))
    erf = graph.make_node("Erf", [node.input[0]]).output[0]
    one = graph.make_const(utils.make_name("one"), np.array(1, dtype)).output[0]
    node.type = "Sub"
    graph.replace_inputs(node, [one, erf])


def _dynamic_update_slice(graph, node, name, args):
    """`XlaDynamicUpdateSlice(data, update, start)` as `ScatterND(data, indices, update)`:
    `indices` `(*update.shape, rank)` hold every updated position, from `start` clamped into
    `[0, data.shape - update.shape]` as XLA clamps it."""
    import numpy as np
    from onnx import TensorProto
    from tf2onnx import utils
    from tf2onnx.graph_builder import GraphBuilder

    builder = GraphBuilder(graph)
    data, update, start = node.input
    rank = graph.get_rank(update)

    def constant(value):
        return graph.make_const(utils.make_name("const"), np.asarray(value, np.int64)).output[0]

    def op(op_type, *inputs, **attributes):
        return graph.make_node(op_type, list(inputs), attr=attributes or None).output[0]

    data_shape, update_shape = op("Shape", data), op("Shape", update)
    start = op("Cast", start, to=TensorProto.INT64)
    start = op("Max", op("Min", start, op("Sub", data_shape, update_shape)), constant([0] * rank))
    coordinates = []
    for axis in range(rank):  # each axis' positions, broadcast to the update's shape
        begin = op("Gather", start, constant(axis))
        size = op("Gather", update_shape, constant(axis))
        line = op("Range", begin, op("Add", begin, size), constant(1))
        along = [1] * rank
        along[axis] = -1
        grid = op("Expand", op("Reshape", line, constant(along)), update_shape)
        coordinates.append(builder.make_unsqueeze({"data": grid, "axes": [rank]}))  # (..., 1)
    node.type = "ScatterND"
    graph.replace_inputs(node, [data, op("Concat", *coordinates, axis=rank), update])
