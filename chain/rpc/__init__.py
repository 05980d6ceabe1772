"""Ethereum JSON-RPC over HTTP and WebSocket (aiohttp)."""
