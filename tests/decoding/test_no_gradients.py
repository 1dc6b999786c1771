"""The decoders record nothing for a backward pass (torch, where every eager op is recorded).

Before `keras_attn._execution.no_gradients`, each eager decode on torch recorded its steps,
and the kernels' custom gradients kept them alive after the call returned: a GPT-2-small-sized
model at batch 8 grew by about 1.4 GB a call (measured), a tiny one by 17 recorded tensors.
"""

import gc

import keras
import numpy as np
import pytest

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="torch records every eager op for gradients; TensorFlow and JAX record nothing here",
)


def _recorded_tensors():
    """The live torch tensors that carry a recorded op (`grad_fn`)."""
    torch = pytest.importorskip("torch")

    gc.collect()
    return [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.grad_fn is not None]


def test_decoders_keep_no_recorded_steps_and_leave_gradients_on():
    torch = pytest.importorskip("torch")

    from keras_attn.models import generate, greedy_decode, transformer_lm

    keras.utils.set_random_seed(0)
    model = transformer_lm(30, num_layers=1, d_model=16, intermediate_dim=32, dropout=0.0)
    prompts = np.array([[5, 6, 7], [8, 9, 0]], "int32")
    # Other tests of the process may hold recorded tensors: these are held here (so that no
    # new tensor takes one's id) and only new ones count.
    before = _recorded_tensors()
    generate(model, prompts, 3)
    generate(model, prompts, 3, sampler="beam", end_id=2, beam_width=2)
    greedy_decode(model, prompts, 3)
    stream = generate(model, prompts, 3, stream=True)
    next(stream)
    assert torch.is_grad_enabled()  # the stream turns gradients off per call, not across yields
    list(stream)
    held = {id(t) for t in before}
    assert [t.shape for t in _recorded_tensors() if id(t) not in held] == []
    assert torch.is_grad_enabled()
