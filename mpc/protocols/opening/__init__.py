"""Opening values among the parties: each party sends its share to every other party and
each sums (or XORs) what it holds, values of one round packed in one delivery per peer.
The client side is :mod:`mpc.protocols.opening.run`, the parties' steps
:mod:`mpc.protocols.opening.steps`."""
