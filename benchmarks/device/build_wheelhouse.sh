#!/usr/bin/env bash
# Builds, on this machine, the wheels the device check installs on the GPU machine
# (Python 3.12, manylinux x86_64, no network there): Keras and the dependencies a
# JAX + torch machine may lack, pytest, and keras-attn itself. The GPU machine brings
# JAX, torch and NumPy; TensorFlow is neither there nor needed.
#
#   bash benchmarks/device/build_wheelhouse.sh      # -> benchmarks/device/wheelhouse/
#
# The folder is ignored by git: the `run` call carries it (carry=["benchmarks/device/wheelhouse"]).
# Refuses (exit 1) above 60 MiB: the working tree and what it carries travel in 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/../.."
wheelhouse=benchmarks/device/wheelhouse
limit_mib=60
# Keras' own requirements (its METADATA: absl-py, numpy, rich, namex, h5py, optree,
# ml-dtypes, packaging), rich's and optree's; pytest's. Pinned to the versions this
# repository is tested with; numpy comes from the GPU machine (JAX needs it).
packages=(
    keras==3.15.1
    absl-py==2.5.1
    namex==0.1.0
    optree==0.20.0
    typing-extensions
    rich==15.0.0
    markdown-it-py==4.3.0
    mdurl==0.1.2
    pygments==2.20.0
    h5py==3.14.0
    ml-dtypes==0.7.0
    packaging==26.2
    pytest==9.0.3
    iniconfig==2.3.0
    pluggy==1.6.0
)
rm -rf "$wheelhouse"
mkdir -p "$wheelhouse"
python -m pip download --quiet --dest "$wheelhouse" --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --platform any \
    "${packages[@]}"
# keras-attn from this working tree; its TensorFlow requirement is not installed there
# (check.sh installs it with --no-deps).
python -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$wheelhouse" .
ls -1 "$wheelhouse"
bytes=$(du -sb "$wheelhouse" | cut -f1)
mib=$(( (bytes + 1048575) / 1048576 ))
echo "wheelhouse: $(ls "$wheelhouse" | wc -l) wheels, ${bytes} bytes (${mib} MiB) in ${wheelhouse}"
if (( bytes > limit_mib * 1048576 )); then
    echo "error: the wheelhouse is over ${limit_mib} MiB (${mib} MiB): it would not travel" >&2
    exit 1
fi
