"""keras-attn: attention layers for Keras 3."""

__version__ = "0.1.0"

from keras_attn import _checkout, kernels, masks, ops, scores
from keras_attn.additive_attention import AdditiveAttention
from keras_attn.base import ScoreAttention
from keras_attn.bilinear_attention import BilinearAttention
from keras_attn.cache import KVCache
from keras_attn.dot_attention import DotAttention, ScaledDotAttention
from keras_attn.embeddings import TokenAndPositionEmbedding
from keras_attn.feed_forward import FeedForward
from keras_attn.grouped_query_attention import GroupedQueryAttention, GroupQueryAttention
from keras_attn.hard_attention import HardAttention
from keras_attn.key_value_attention import KeyValueAttention
from keras_attn.multi_head_attention import MultiHeadAttention
from keras_attn.ops import AttentionBias
from keras_attn.pointer_attention import PointerAttention
from keras_attn.pooling import AttentionPooling

# PositionBias: the base class of the position biases (importable; not a layer to use as is,
# so not in __all__).
from keras_attn.position_bias import AlibiBias, PositionBias, RelativePositionBias  # noqa: F401

# The former names of the positions and blocks (subclasses registered under them, so the files
# saved under them load): importable, not in __all__.
from keras_attn.positional import (  # noqa: F401
    LearnedPositionalEmbedding,
    PositionEmbedding,
    SinePositionEncoding,
    SinusoidalPositionalEncoding,
)
from keras_attn.rotary import RotaryEmbedding
from keras_attn.transformer_decoder import TransformerDecoder, TransformerDecoderBlock  # noqa: F401
from keras_attn.transformer_encoder import TransformerEncoder, TransformerEncoderBlock  # noqa: F401

# The model zoo, `keras_attn.models`, is the repository's `models/` folder: an install maps
# it under this package (setup.cfg's package_dir); in a source checkout (the repository
# root on sys.path: pytest, `python -m keras_attn.models.cli`) one finder maps this one name
# to the folder beside this package. Nothing of the zoo is imported here.
_checkout.map_models_folder(__path__[0])

__all__ = [
    "AdditiveAttention",
    "AlibiBias",
    "AttentionBias",
    "AttentionPooling",
    "BilinearAttention",
    "DotAttention",
    "FeedForward",
    "GroupQueryAttention",
    "GroupedQueryAttention",
    "HardAttention",
    "KVCache",
    "KeyValueAttention",
    "MultiHeadAttention",
    "PointerAttention",
    "PositionEmbedding",
    "RelativePositionBias",
    "RotaryEmbedding",
    "ScaledDotAttention",
    "ScoreAttention",
    "SinePositionEncoding",
    "TokenAndPositionEmbedding",
    "TransformerDecoder",
    "TransformerEncoder",
    "kernels",
    "masks",
    "ops",
    "scores",
]


def __getattr__(name):
    # `keras_attn.testing` (the property checks) loads on first use: it is not
    # needed to build or run a model, and imports more of the backend.
    # `keras_attn.models` (the model zoo) likewise, and never from `import keras_attn`.
    if name in ("testing", "models"):
        import importlib

        return importlib.import_module(f"keras_attn.{name}")
    raise AttributeError(f"module 'keras_attn' has no attribute {name!r}")
