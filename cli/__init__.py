"""Command-line entry points: `pbft-node` (and later `pbft-etl`)."""
