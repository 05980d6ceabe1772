"""What the integration tests and the benchmarks share: real node processes and clusters of
them on loopback (`nodes`, `cluster`). Not part of the installed product."""
