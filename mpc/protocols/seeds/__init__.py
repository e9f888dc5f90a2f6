"""The seeds under every protocol: a session's seeds, which the dealer draws and delivers
to each party once, and the seeds from which a party expands its share of an input
(:mod:`mpc.protocols.seeds.steps`)."""
