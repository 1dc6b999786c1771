"""The keras-attn model zoo: functional-API builders made from `keras_attn` layers.

Each builder returns a plain `keras.Model` that trains with `model.fit`, saves
as `.keras` (reloads with `safe_mode=True`) and exports as a SavedModel.
"""
