"""The arithmetic under the protocols, with no pointers and no workers: the ring Z/2^64
and its exact products (ring), the AES keystream generator (prg), the fixed-point
encoding (encoding), the packed bit words of the comparison's carry tree (carry_tree) and the max of groups of four (groups_of_four) and
the distributed comparison function of function secret sharing (dcf).

Nothing here imports :mod:`pointers` (tests/test_layering.py enforces it), so these
modules can be read, tested and reused on plain tensors.
"""
