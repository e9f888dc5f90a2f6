"""The comparison by digit look-ups: msb(x) and msb(x - theta) for public thresholds in 2
rounds (:mod:`mpc.protocols.digit_compare.run`; its steps:
:mod:`mpc.protocols.digit_compare.steps`)."""
