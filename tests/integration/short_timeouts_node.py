"""`pbft-node` with JSON-RPC timeouts short enough for tests of slow clients.

Run as `python short_timeouts_node.py ARGS...` in place of `python -m cli.node ARGS...`. The
node's flags have no setting for these limits (RpcServer takes RpcLimits; the node uses the
defaults), so this sets the defaults before the node starts.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from chain.rpc import server
from cli.node import main

READ_TIMEOUT = 1.0
IDLE_TIMEOUT = 3.0

if __name__ == "__main__":
    server.DEFAULT_LIMITS = replace(
        server.DEFAULT_LIMITS, read_timeout=READ_TIMEOUT, idle_timeout=IDLE_TIMEOUT
    )
    sys.exit(main(sys.argv[1:]))
