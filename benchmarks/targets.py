"""The issue's targets, read from a benchmark run's rows, each with the ceiling the run allows."""

from benchmarks import cases


def _ceiling(row, peer="peer"):
    """The highest ours/peer speed ratio a row allows: ours at 100 % of its matmul probe.

    The probe is the row's own `tf.matmul` speed (fp32, or bf16 under mixed
    precision); FLOPs count only the matmuls, so no step of ours can beat
    `probe / peer GFLOP/s`, and softmax, layer norm and the optimizer keep the
    true bound lower still. `None` when the row lacks the peer's numbers.
    """
    gflops = row.get(peer, {}).get("gflops")
    return row["probe_gflops"] / gflops if gflops and "probe_gflops" in row else None


def targets(rows, mem_rows):
    """The issue's targets, each with the measured value and whether it is met.

    Speed targets also carry `ceiling` (`_ceiling`): a target above it cannot
    be met on the machine of the run, whatever the code.
    """
    found = {}
    for r in rows:
        if r["status"] == "ok":
            found[(r["family"], r["mode"], r["policy"], (r["batch"], r["length"], r["dim"]))] = r
    out = []
    for shape in cases.SHAPES:
        r = found.get(("mha", "train", "float32", shape))
        if r:
            out.append(("MHA train fp32 >= 1.5x keras", shape, r["ratio"]["median"], 1.5,
                        _ceiling(r)))  # fmt: skip
        b = found.get(("mha", "train", "mixed_bfloat16", shape))
        if b and "ratio_vs_peer_fp32" in b:
            value = b["ratio_vs_peer_fp32"]["median"]
            out.append(("MHA train mixed_bf16 >= 2.5x keras fp32", shape, value, 2.5,
                        _ceiling(b, "peer_fp32")))  # fmt: skip
        e = found.get(("encoder", "train", "float32", shape))
        if e:
            value = e["ratio"]["median"]
            out.append(("EncoderBlock train fp32 >= 1.3x keras-hub", shape, value, 1.3,
                        _ceiling(e)))  # fmt: skip
    r = found.get(("mha", "train", "float32", (8, 512, 512)))
    if r:
        value = r["ours"]["pct_probe"]
        out.append(("MHA train fp32 >= 60% of fp32 matmul", (8, 512, 512), value, 60.0, 100.0))
    for m in mem_rows:
        if m["impl"] != "keras" and m["length"] == 16384 and m["mode"] == "train":
            value = m["peak_rss_mib"] / 1024 if m["status"] == "ok" else float("inf")
            shape = (m["batch"], m["length"], m["dim"])
            out.append(("MHA fwd+bwd B1 L16384 d256 peak RSS < 2 GiB", shape, value, 2.0, None))
    return [
        {"target": name, "shape": list(shape), "value": value, "goal": goal, "ceiling": ceiling,
         "met": bool(value < goal if "RSS" in name else value >= goal)}
        for name, shape, value, goal, ceiling in out
    ]  # fmt: skip
