"""The PBFT consensus engine: a pure replica state machine (core/), its wire messages, its stores.

Kept free of imports so `pbft_engine.messages` can be used on its own (the audit ETL does).
"""
