"""The kernels' custom gradients: every tensor the rule reads is an argument.

`custom_gradient(fun, inputs, constants)` is `keras.ops.custom_gradient(fun)`
called on `(*inputs, *constants)`, with the contract the kernels need written
down once:

- `fun(*inputs, *constants)` returns `(output, grad)`; `grad(d_output)`
  returns the gradients of `inputs` (a tuple, in order). The constants
  (masks, non-finite flags, positions, lengths) get no gradient.
- `fun` closes over no tensor: whatever it reads is in `inputs` or
  `constants`. Constants that are not tensors (`None`, Python numbers, a
  static or symbolic dimension) are passed as they are.

Why: on JAX, `keras.ops.custom_gradient` is `jax.custom_gradient`, a
`jax.custom_vjp`. A tensor its function closes over is a tracer of the
enclosing trace; when a jitted function around it is differentiated, as
`jax2tf` does to give a SavedModel its gradients (`model.export` on JAX), the
rule keeps that tracer as a constant of the lowered computation and lowering
fails ("No constant handler for type: DynamicJaxprTracer", or with a
polymorphic batch "Symbolic dimension comparison ... is inconclusive").
Passed as arguments, they are ordinary operands of the custom VJP, on every
backend (TensorFlow's `tf.custom_gradient` and torch's `autograd.Function`
take them as inputs that get a `None` gradient).

An eager call that nothing will differentiate (`_execution.records_gradients`
is False: inference outside a tape, `torch.no_grad`, concrete JAX arrays)
runs `fun` directly: the same output, without the backend's custom-gradient
machinery (on TensorFlow, most of a small eager call's time in it).
"""

from keras import ops

from keras_attn._execution import records_gradients


def custom_gradient(fun, inputs, constants=()):
    """`fun(*inputs, *constants)` differentiated by the `grad` it returns.

    Args:
        fun: `(*inputs, *constants) -> (output, grad)`, closing over no
            tensor; `grad(d_output) -> tuple` of the gradients of `inputs`.
        inputs: the tensors that get gradients.
        constants: values `fun` reads that get none; the tensors among them
            are passed to the custom gradient as arguments.

    Returns:
        `output`.
    """
    inputs, constants = tuple(inputs), tuple(constants)
    if not records_gradients(*inputs):
        return fun(*inputs, *constants)[0]
    tensor_at = [i for i, c in enumerate(constants) if ops.is_tensor(c)]
    count = len(inputs)

    def with_constants(*args):
        values = list(constants)
        for i, tensor in zip(tensor_at, args[count:], strict=True):
            values[i] = tensor
        output, grad = fun(*args[:count], *values)

        # TensorFlow calls `grad(d_output)`, torch `grad(*inputs, upstream=d_output)`.
        def grads(*args, upstream=None):
            d_output = args[0] if upstream is None else upstream
            return tuple(grad(d_output)) + (None,) * len(tensor_at)

        return output, grads

    return ops.custom_gradient(with_constants)(*inputs, *(constants[i] for i in tensor_at))
