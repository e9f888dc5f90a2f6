"""Plans and Protocols: functions traced once at the aten level (trace), held as a graph of
allow-listed ops (graph), sent without pickle (wire), run with one message per call
(plan), and deployed role by role (protocol)."""
