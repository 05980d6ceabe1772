"""The BFT client: send a transaction and count it done when f+1 validators report the same
receipt. It speaks JSON-RPC to the nodes and depends on nothing of the node's packages.

    async with BftClient({address: url, ...}) as client:
        confirmed = await client.send_transaction(key, TxRequest(to=..., value=...))
"""

from __future__ import annotations

from bft_client.client import BftClient, ConfirmedReceipt, Timeouts, TxRequest, sign_transaction
from bft_client.errors import (
    BftClientError,
    NoAgreement,
    RpcReplyError,
    RpcUnreachable,
    TransactionRejected,
)
from bft_client.tally import ReceiptKey, ReplyTally, fault_tolerance

__all__ = ["BftClient", "BftClientError", "ConfirmedReceipt", "NoAgreement", "ReceiptKey",
           "ReplyTally", "RpcReplyError", "RpcUnreachable", "Timeouts", "TransactionRejected",
           "TxRequest", "fault_tolerance", "sign_transaction"]
