"""Quorum arithmetic for N replicas (Castro & Liskov; docs/ARCHITECTURE.md), shared by the core
and the ETL check."""


def max_faulty(n: int) -> int:
    """f: how many byzantine replicas N replicas tolerate."""
    return (n - 1) // 3


def quorum(n: int) -> int:
    """Q = ceil((N + f + 1) / 2): any two quorums intersect in at least f + 1 replicas."""
    return (n + max_faulty(n) + 2) // 2


def view_change_quorum(n: int) -> int:
    """N - f: VIEW-CHANGE messages the new primary needs before it sends NEW-VIEW."""
    return n - max_faulty(n)


def weak_quorum(n: int) -> int:
    """f + 1: enough matching messages that at least one comes from a correct replica."""
    return max_faulty(n) + 1
