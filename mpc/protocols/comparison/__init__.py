"""The comparison: the most significant bit of a shared value, and the selections that
ride on it (ReLU, max, |x|: v * msb(x) for shared v).

- :mod:`~mpc.protocols.comparison.run`: the client side of the default protocol (a
  radix-4 carry tree, 4 rounds), on :mod:`~mpc.protocols.comparison.base`, the parts
  every comparison mode shares (the first round, the daBit's selections);
- :mod:`~mpc.protocols.comparison.steps`: the carry tree's steps;
- :mod:`~mpc.protocols.comparison.selection`: the selections' steps (both modes);
- :mod:`~mpc.protocols.comparison.arith` and :mod:`~mpc.protocols.comparison.
  arith_select`: the arithmetic last level, which ends a run of at most
  ``MPCConfig.three_round_up_to`` elements in 3 rounds, with its selections.

The comparison of the session's mode (this one, or :mod:`mpc.protocols.fss`) is chosen
in :mod:`mpc.protocols.compare`.
"""
