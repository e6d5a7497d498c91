"""The wire and streams: the format of a message, the sockets and shared-memory channels
that carry it, and the names that find them. Imports no other part of srl_jax."""
