"""The max of groups of four values in one comparison run: the six pairwise comparisons
at once, the selection riding on their daBits (the math: :mod:`mpc.math.groups_of_four`).
The client side is :mod:`mpc.protocols.max_of_four.run`; the steps (the parties'
masking and selection, the dealer's material) :mod:`mpc.protocols.max_of_four.steps`."""
