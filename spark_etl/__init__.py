"""The chain audit ETL on Apache Spark: export a PBFT chain and its consensus evidence from
nodes' JSON-RPC to Parquet (`spark_etl.export`), and audit the exported tables
(`spark_etl.audit`). Imports nothing of the node's own packages except
`pbft_engine.messages` (for decoding and verifying signed consensus messages)."""
