"""A masked Fourier series times a shared value, in one round: [v F(x)] for shared v and x
(softmax's exponential times its clamp bit, once both are known). The client side is
:mod:`mpc.protocols.series_product.run`; the dealer's and the parties' steps are
:mod:`mpc.protocols.series_product.steps`; the fits are in :mod:`mpc.math.fourier`."""
