"""What crosses a worker boundary, and the only things a worker decodes: the msgpack +
raw-buffer encoding with its limits (serde), the message set (messages) and the aten ops a
worker may run (ops, an explicit allow-list). These are what the fuzzers target."""
