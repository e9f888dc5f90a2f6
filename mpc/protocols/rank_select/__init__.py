"""The selection of the entry of rank 0, in one round: given shared small ranks
rank_i in [0, 2^m) and shared values x_i, the shares of delta_i = [rank_i = 0] and of
delta_i x_i, by dealt lookup tables of 2^m words an entry (the second stage of
:mod:`mpc.protocols.ranks`). The client side is :mod:`mpc.protocols.rank_select.run`; the
dealer's and the parties' steps are :mod:`mpc.protocols.rank_select.steps`."""
