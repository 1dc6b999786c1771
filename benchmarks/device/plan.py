"""What the device check measures: shapes, policies, cases, and the key of each table row.

Pure Python (no Keras, no backend): `check.sh`'s report step imports it even where the
install failed. One plan for the GPU machine (`FULL`) and one for `--dry-run` (`DRY`):
the same cases on tiny shapes, so the dry run walks every code path of the real one.
"""

# (B, L, d, heads): head width 64 (8 heads at d=512, 16 at d=1024), the width the
# backends' fused kernels are written for.
FULL_SHAPES = ((8, 512, 512, 8), (2, 4096, 1024, 16), (1, 32768, 1024, 16))
DRY_SHAPES = ((2, 16, 32, 4),)
POLICIES = ("float32", "mixed_bfloat16")
LAYERS = ("ours", "keras")
# Off the fused path (at the smallest shape, in float32): what "auto" must route to the
# dense kernel, and Keras' layer to its einsum path.
OFF_PATH = ("dropout 0.1", "return scores", "padding mask")
BACKENDS = ("jax", "torch")
# The attention core alone (`keras_attn.ops.attention` vs `keras.ops.dot_product_attention`),
# fwd+bwd, from this length (dry run: at its one shape).
CORE_MIN_LENGTH = 4096

SETTINGS = {
    # warmup steps (after the compiling call), timed samples, a sample's least duration
    "full": {"warmup": 2, "repeats": 7, "min_sample_s": 0.05, "matmul_n": 8192},
    "dry": {"warmup": 1, "repeats": 3, "min_sample_s": 0.0, "matmul_n": 256},
}


def shapes(mode):
    return FULL_SHAPES if mode == "full" else DRY_SHAPES


def core_min_length(mode):
    return CORE_MIN_LENGTH if mode == "full" else DRY_SHAPES[0][1]


def fmt_shape(shape):
    """`(2, 4096, 1024, 16)` -> `"2×4096×1024 (16 heads)"`."""
    batch, length, dim, heads = shape
    return f"{batch}×{length}×{dim} ({heads} heads)"


def row_key(row):
    """The identity of a row: what it measured, not what it found."""
    return (row["part"], row["backend"], row["case"], row["shape"], row["dtype"], row["layer"])


def _case(part, backend, case, shape, dtype, layer, **extra):
    return {
        "part": part,
        "backend": backend,
        "case": case,
        "shape": shape if isinstance(shape, str) else fmt_shape(shape),
        "dims": None if isinstance(shape, str) else list(shape),
        "dtype": dtype,
        "layer": layer,
        **extra,
    }


def speed_cases(mode, backend, length=None):
    """The timed cases of one backend (of one length, if given), in the order they run.

    Per shape: the self-attention training step of both layers in both policies; at the
    smallest shape the off-path cases; from `core_min_length` the attention core alone.
    """
    out = []
    all_shapes = shapes(mode)
    for shape in all_shapes:
        if length is not None and shape[1] != length:
            continue
        if shape == all_shapes[0]:
            out.append(_case("matmul peak", backend, "bf16 n^3", "-", "bfloat16", "-"))
            out.append(_case("matmul peak", backend, "fp32 n^3", "-", "float32", "-"))
        for policy in POLICIES:
            for layer in LAYERS:
                out.append(_case("train step", backend, "self-attention", shape, policy, layer))
        if shape == all_shapes[0]:
            for case in OFF_PATH:
                for layer in LAYERS:
                    out.append(_case("train step", backend, case, shape, "float32", layer))
        if shape[1] >= core_min_length(mode):
            for dtype in ("float32", "bfloat16"):
                for layer in LAYERS:
                    out.append(_case("attention core", backend, "fwd+bwd", shape, dtype, layer))
    return out


def test_cases(backends=BACKENDS):
    return [_case("tests", b, "layer tests", "-", "float32", "-") for b in backends]


def fit_cases(backends=BACKENDS):
    """`model.fit` of a zoo model: on JAX only (the device's time goes to the timed cases)."""
    return [
        _case("zoo fit", b, "transformer_classifier", "-", "float32", "-")
        for b in backends
        if b == "jax"
    ]


def all_cases(mode, backends=BACKENDS):
    """Every row the report must hold, in table order."""
    rows = []
    for backend in backends:
        rows += test_cases([backend])
    for backend in backends:
        rows += speed_cases(mode, backend)
    return rows + fit_cases(backends)
