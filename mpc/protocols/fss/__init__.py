"""The comparison by function secret sharing (the session option ``comparison="fss"``,
2 parties): the client side is :mod:`mpc.protocols.fss.run`, the dealer's and the
parties' steps :mod:`mpc.protocols.fss.steps` (the comparison) and
:mod:`mpc.protocols.fss.relu` (the one-round ReLU of a product); the distributed
comparison function is :mod:`mpc.math.dcf`."""
