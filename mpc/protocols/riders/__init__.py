"""Truncations whose opening rides in the next comparison's first round (no round of
their own): :func:`mpc.protocols.riders.run.riding`."""
