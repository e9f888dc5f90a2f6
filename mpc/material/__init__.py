"""Protocol steps not yet in their protocol's folder (:mod:`mpc.protocols`); the table of
every step a worker runs is :mod:`mpc.protocols.functions`."""
