"""Functions as masked Fourier series on fixed-point shares (e^x for x <= 0, sigmoid, GELU,
SiLU): the client side is :mod:`mpc.protocols.fourier.run`, the dealer's and the parties'
steps :mod:`mpc.protocols.fourier.steps`; the fits are in :mod:`mpc.math.fourier`."""
