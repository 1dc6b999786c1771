"""Speed and memory of keras-attn against its peers, one command, one table.

Run `python -m benchmarks.run [--quick] [--json PATH]`. Everything is measured
in one run, ours and the peer's repeats interleaved, and reported as ratios
(ours / peer): absolute numbers on a shared machine move with its load, ratios
measured side by side much less.

Modules:
    timing      interleaved timing of two callables; matmul peak
    cases       the layers compared, their training/inference steps, FLOP counts
    memory      peak RSS of one MHA step in a fresh subprocess
    complexity  the Transformer paper's per-layer complexity table, measured
    run         the command: runs everything, prints the table, writes JSON
"""
