"""Measured comparisons behind the results tables (results/README.md), one module per question.

Each is a command that trains under a fixed budget, writes JSON (and a plot), and
prints a table:

- `python -m experiments.rnn_attention`: RNN seq2seq with and without
  attention (each score) as the sequence grows;
- `python -m experiments.han_ablation`: the hierarchical attention network
  with attention pooling vs mean pooling, over seeds.
"""
