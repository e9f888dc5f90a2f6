"""Weight instances: a model's fixed shared weight keeps its Beaver mask across queries,
so a query's products send the activations' masked values, not the weights'. The client
side is :mod:`mpc.protocols.weights.run`; the dealer's and the parties' steps
:mod:`mpc.protocols.weights.steps`."""
