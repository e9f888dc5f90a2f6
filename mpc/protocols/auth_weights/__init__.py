"""Products with a model's authenticated weights that keep their Beaver mask across
queries (``security="malicious"``): the weight's F = W - B opens once (checked), and every
later product opens only the activation's e = x - A. The client side is
:mod:`mpc.protocols.auth_weights.run`; the dealer's and the parties' steps, and why the
reuse is safe, :mod:`mpc.protocols.auth_weights.steps`."""
