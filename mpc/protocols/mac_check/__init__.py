"""The batched MAC check of the authenticated mode: every value opened since the last
check, in one random linear combination with public coins drawn after the values are
fixed, committed then opened. The client side is :mod:`mpc.protocols.mac_check.run`, the
parties' steps :mod:`mpc.protocols.mac_check.steps`."""
