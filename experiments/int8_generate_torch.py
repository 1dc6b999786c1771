"""Ours alone on torch: GPT-2-small `generate`, batch 1, 16 new tokens, float32 vs int8 weights,
repeats interleaved (`KERAS_BACKEND=torch python -m experiments.int8_generate_torch`)."""

import json

import numpy as np

from benchmarks import generation, timing
from keras_attn.models import generate

fns = {}
prompts = np.random.default_rng(1).integers(1, 50257, (1, 32)).astype("int32")
for w in ("float32", "int8"):
    ours, _ = generation.build_weights(w, 32, size=generation.GPT2_SMALL)
    fns[w] = lambda m=ours: generate(m, prompts + 1, 16)
r = timing.time_group(fns, (), repeats=3, min_time=0.0, max_calls=1)
sp = [a / b for a, b in zip(r["float32"]["times_s"], r["int8"]["times_s"], strict=True)]
print("loadavg", timing.loadavg())
print({k: 16 / r[k]["median_s"] for k in fns}, "int8/f32 speed", timing.summarize(sp))
json.dump({k: r[k] for k in fns}, open("/tmp/int8_generate_torch.json", "w"), default=str)
