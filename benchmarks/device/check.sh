#!/usr/bin/env bash
# The device check: keras-attn on the GPU machine (JAX and torch, no TensorFlow, no network).
#
#   bash benchmarks/device/check.sh            # there; needs benchmarks/device/wheelhouse
#   bash benchmarks/device/check.sh --dry-run  # here: tiny shapes, JAX on CPU, this environment
#
# Writes $OUT/device_check.md (one table) and $OUT/device_check.json; $OUT/parts holds each
# step's rows, $OUT/logs their output. Every step runs under `timeout`, its limit cut to what
# is left of the whole (DEVICE_CHECK_SECONDS, 465 s: the machine allows 10 minutes a command);
# a step that fails or runs out of time costs its own rows only, and the report always runs.
set -uo pipefail
cd "$(dirname "$0")/../.."
dry=0
if [[ "${1:-}" == "--dry-run" ]]; then
    dry=1
elif [[ -n "${1:-}" ]]; then
    echo "usage: bash benchmarks/device/check.sh [--dry-run]" >&2
    exit 2
fi
OUT="${OUT:-$(mktemp -d /tmp/device-check.XXXXXX)}"
parts="$OUT/parts"
logs="$OUT/logs"
rm -rf "$parts" "$logs"
mkdir -p "$parts" "$logs"
start=$SECONDS
reserve=20  # kept for the report
export TF_CPP_MIN_LOG_LEVEL=2 PYTHONUNBUFFERED=1
if (( dry )); then
    total=${DEVICE_CHECK_SECONDS:-600}  # no deadline to speak of: every row must be measured
    flag=(--dry-run)
    export JAX_PLATFORMS=cpu CUDA_VISIBLE_DEVICES=""
    # Its times mean nothing (tiny shapes): LLVM at -O0 compiles JAX's steps in about half the
    # time (speed-jax 43 s -> 23 s, the whole dry run 116 s -> 88 s of CPU), and the older loop
    # emitters in place of the MLIR fusion emitters cut more (tests/conftest.py).
    export XLA_FLAGS="--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false${XLA_FLAGS:+ $XLA_FLAGS}"
    py=python
else
    total=${DEVICE_CHECK_SECONDS:-465}
    flag=()
    export XLA_PYTHON_CLIENT_MEM_FRACTION=0.92
    py="${DEVICE_PYTHON:-python3}"  # the Python that has JAX and torch
    base="$py"
fi

# limit_for MAX: sets $limit to MAX or what is left of the whole, whichever is less.
limit_for() {
    local left=$(( total - (SECONDS - start) - reserve ))
    limit=$(( $1 < left ? $1 : left ))
}

# inner MARGIN: the time a step gives its own work, leaving MARGIN s (or a third) to wind up.
inner() {
    echo $(( limit > 3 * $1 ? limit - $1 : limit * 2 / 3 ))
}

# run_step NAME COMMAND...: runs COMMAND under timeout $limit; records "name rc seconds limit".
run_step() {
    local name=$1
    shift
    if (( limit < 5 )); then
        printf '%s\t-1\t0\t%d\n' "$name" "$limit" >> "$parts/steps.tsv"
        echo "== $name: not run (no time left)"
        return
    fi
    local t0=$SECONDS rc=0
    timeout -k 10 "$limit" "$@" > "$logs/$name.out" 2>&1 || rc=$?
    printf '%s\t%d\t%d\t%d\n' "$name" "$rc" $(( SECONDS - t0 )) "$limit" >> "$parts/steps.tsv"
    echo "== $name: exit $rc in $(( SECONDS - t0 )) s (limit $limit s)"
    tail -n 4 "$logs/$name.out"
}

# The wheels: a venv over the system's JAX, torch and NumPy; else pip --target; else unpacked.
install_wheels() {
    local wh=benchmarks/device/wheelhouse
    if [[ ! -d "$wh" ]]; then
        echo "no $wh: build it with benchmarks/device/build_wheelhouse.sh and carry it" >&2
        return 1
    fi
    if "$base" -m venv --system-site-packages "$venv" \
        && "$venv/bin/python" -m pip install --no-index --find-links "$wh" keras==3.15.1 pytest \
        && "$venv/bin/python" -m pip install --no-index --no-deps --find-links "$wh" keras-attn; then
        echo "venv $venv"
        return 0
    fi
    echo "venv failed; installing into $site" >&2
    rm -rf "$site" && mkdir -p "$site"
    if "$base" -m pip install --no-index --find-links "$wh" --target "$site" keras==3.15.1 pytest \
        && "$base" -m pip install --no-index --no-deps --find-links "$wh" --target "$site" keras-attn
    then
        return 0
    fi
    echo "pip failed; unpacking the wheels into $site" >&2
    for wheel in "$wh"/*.whl; do
        "$base" -m zipfile -e "$wheel" "$site" || return 1
    done
}

if (( ! dry )); then
    venv="${TMPDIR:-/tmp}/keras-attn-device-venv"
    site="${TMPDIR:-/tmp}/keras-attn-device-site"
    export venv site base
    export -f install_wheels
    limit_for 90
    run_step install bash -c install_wheels
    if [[ -x "$venv/bin/python" ]] && KERAS_BACKEND=jax "$venv/bin/python" -c "import keras"; then
        py="$venv/bin/python"
    elif [[ -d "$site" ]]; then
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    fi
fi
bench=("$py" -m benchmarks.device.bench --parts "$parts" --logs "$logs" ${flag[@]+"${flag[@]}"})

limit_for 60
XLA_PYTHON_CLIENT_PREALLOCATE=false run_step env "${bench[@]}" env
for backend in jax torch; do
    if (( dry )); then limit_for 120; else limit_for $([[ $backend == jax ]] && echo 80 || echo 50); fi
    XLA_PYTHON_CLIENT_PREALLOCATE=false \
        run_step "tests-$backend" "${bench[@]}" tests --backend "$backend" --limit "$(inner 20)"
    if (( dry )); then limit_for 150; else limit_for $([[ $backend == jax ]] && echo 180 || echo 90); fi
    run_step "speed-$backend" "${bench[@]}" speed --backend "$backend" --budget "$(inner 10)"
done
limit_for $(( dry ? 60 : 40 ))
XLA_PYTHON_CLIENT_PREALLOCATE=false run_step fit-jax "${bench[@]}" fit --backend jax
limit=$reserve
"${bench[@]}" report --out "$OUT" || { echo "the report failed" >&2; exit 1; }
echo "== device check: $(( SECONDS - start )) s; $OUT/device_check.md"
