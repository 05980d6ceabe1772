"""Rules on what a node says about its consensus records, checked against the signatures:
the signer it names (signer-column), the evidence it keeps (evidence-false), the stable
checkpoints and installed views it must hold (checkpoint-missing, view-change-missing), and
records that do not decode (malformed-value). Who signed what is always the recovered signer
(`spark_etl.audit.signatures`), never a column the node filled in."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F

from spark_etl import schemas
from spark_etl.audit.anchor_rules import quorum_commits
from spark_etl.audit.context import Audit, tagged_union, union_all, violations
from spark_etl.audit.report import ConsensusFigures, InstalledView
from spark_etl.audit.signatures import checked, recovered, signatures

VIEW_MESSAGES = ("view-change", "new-view")  # signed for a view, with no seqNo


def no_violations(audit: Audit) -> DataFrame:
    return audit.data.blocks.sparkSession.createDataFrame([], schemas.VIOLATIONS)


def slot_block(kind: Column, seq_no: Column) -> Column:
    """The block a message of type `kind` is about: its seqNo, none for a view message."""
    return F.when(~kind.isin(*VIEW_MESSAGES), seq_no)


# --- installed views ---------------------------------------------------------------------

def view_change_records(audit: Audit) -> tuple[DataFrame, DataFrame]:
    """(NEW-VIEWs, VIEW-CHANGEs) of the view_changes table, each checked (`problem`): the
    NEW-VIEW is the view's, from its primary; each VIEW-CHANGE is for the view."""
    validators = audit.validators
    size = validators.size_at(F.col("n_height"))
    installs = audit.data.view_changes
    new_views = checked(
        audit,
        installs.select("node", "view", "primary", F.col("new_view").alias("message")).distinct(),
        "n",
        "new-view",
        F.when(F.col("n_view") != F.col("view"), F.lit("NEW-VIEW for another view")),
        F.when(F.col("n_replica") != F.col("view") % size,
               F.lit("NEW-VIEW not from the view's primary")),
        F.when(F.col("primary") != validators.address_of(F.col("view") % size,
                                                          F.col("n_height")),
               F.lit("primary is not validators[view mod N]")),
    )
    votes = checked(
        audit,
        installs.where(F.col("message").isNotNull()),
        "v",
        "view-change",
        F.when(F.col("v_view") != F.col("view"), F.lit("VIEW-CHANGE for another view")),
    )
    return new_views, votes


def installed_views(audit: Audit) -> DataFrame:
    """Per node and view served: `primary` (the NEW-VIEW's recovered signer, null unless it
    is a valid NEW-VIEW for the view from its primary), `senders` (distinct validators with a
    valid VIEW-CHANGE for it), `stable_seq_no` (the highest the senders name) and `complete`
    (a valid NEW-VIEW and N-f VIEW-CHANGEs: the view was installed), `height` (the first
    block the view decides: above the senders' stable checkpoint; its epoch counts them)."""
    new_views, votes = view_change_records(audit)
    valid_new_view = F.col("problem").isNull() & F.col("n_signer").isNotNull()
    primaries = new_views.groupBy("node", "view").agg(
        F.max(F.when(valid_new_view, F.col("n_signer"))).alias("primary")
    )
    senders = votes.groupBy("node", "view").agg(
        F.countDistinct(F.when(F.col("problem").isNull(), F.col("v_signer"))).alias("senders"),
        F.max("stable_seq_no").alias("stable_seq_no"),
    )
    return (
        primaries.join(senders, ["node", "view"], "full")
        .fillna(0, ["senders"])
        .withColumn("height", F.coalesce(F.col("stable_seq_no"), F.lit(0)) + 1)
        .withColumn("complete", F.col("primary").isNotNull()
                    & (F.col("senders") >= audit.validators.view_change_quorum_at(
                        F.col("height"))))
    )


def view_change_missing(audit: Audit) -> DataFrame:
    """view-change-missing: every view above 0 that the node's valid COMMITs or its view
    changes name has an installed-view record there (a valid NEW-VIEW from the view's primary
    and N-f valid VIEW-CHANGEs); reported at the first block certified in that view. A view
    named only by commit certificates is not asked of a node whose own address (the
    manifest's `validator`: an observer's node key) did not decide the block: an observer,
    a validator before it was voted in or after it left, imports blocks with their
    certificates and installs no view (the node's word, as in `_joined`: one that names
    another address escapes this rule for the views of its certificates, not the check of
    the certificates themselves). A node that named none (an older export) is asked all."""
    named_address = audit.data.export_manifest.where(
        F.col("validator").isNotNull()).select("node", "validator").distinct()
    commits = audit.data.commit_certificates.join(recovered(audit, "c"), "message").where(
        F.col("c_valid") & (F.col("c_type") == "commit")
    ).join(named_address, "node", "left").where(
        F.col("validator").isNull()
        | audit.validators.contains(F.col("validator"), F.col("block_number")))
    named = audit.union(
        commits.select("node", F.col("c_view").alias("view"), "block_number",
                       F.lit("its commit certificates").alias("source")),
        audit.data.view_changes.select(
            "node", "view", F.lit(None).cast("long").alias("block_number"),
            F.lit("its view changes").alias("source"),
        ),
    ).where(F.col("view") > 0).groupBy("node", "view").agg(
        F.min("block_number").alias("block_number"),
        F.array_join(F.sort_array(F.collect_set("source")), " and ").alias("sources"),
    )
    needed = audit.validators.view_change_quorum_at(F.coalesce(F.col("height"), F.lit(1)))
    rows = named.join(installed_views(audit), ["node", "view"], "left").where(
        ~F.coalesce(F.col("complete"), F.lit(False))
    )
    served = F.format_string(
        "only part of it is served: %s, %d of the %d valid VIEW-CHANGEs needed",
        F.when(F.col("primary").isNull(), F.lit("no valid NEW-VIEW from its primary"))
        .otherwise(F.lit("a valid NEW-VIEW")),
        F.coalesce(F.col("senders"), F.lit(0)), needed,
    )
    return violations(
        rows,
        "view-change-missing",
        F.format_string(
            "view %d is named by %s, but %s", "view", "sources",
            F.when(F.col("complete").isNull(), F.lit("the node serves no record of it "
                                                     "being installed")).otherwise(served),
        ),
    )


# --- stable checkpoints ------------------------------------------------------------------

def proven_stable(audit: Audit) -> DataFrame:
    """seqNos (`block_number`) some data in the export proves stable: Q validators' valid
    matching CHECKPOINTs, in any node's checkpoints or nested in a VIEW-CHANGE."""
    return _quorum_of_checkpoints(audit, _checkpoint_votes(audit), [])


def _checkpoint_votes(audit: Audit) -> DataFrame:
    return signatures(audit).where(F.col("valid") & (F.col("type") == "checkpoint"))


def _quorum_of_checkpoints(audit: Audit, votes: DataFrame, by: list[str]) -> DataFrame:
    """(`by`..., block_number): seqNos with Q validators' matching CHECKPOINTs in `votes`."""
    return (
        votes.groupBy(*by, "seq_no", "digest").agg(F.countDistinct("signer").alias("signers"))
        .where(F.col("signers") >= audit.validators.quorum_at(F.col("seq_no")))
        .select(*by, F.col("seq_no").alias("block_number")).distinct()
    )


def checkpoint_missing(audit: Audit) -> DataFrame:
    """checkpoint-missing: a node keeps every checkpoint it held stable for good
    (pbft_engine.core.log: `stabilize`, never deleted), so it serves a stable checkpoint row
    at every multiple of K in its exported range, up to the highest stable checkpoint it
    names (in its checkpoints, or as a VIEW-CHANGE's stable checkpoint), that the export
    proves stable (`proven_stable`). The protocol does not make every multiple stable:
    one that no Q validators ever signed alike (a replica of exactly Q live ones fetched the
    blocks past it) is stable nowhere, and is not required. A validator voted in is asked
    only for the multiples from the first block of its first epoch on (`_joined`): as an
    observer it collected no CHECKPOINTs, and the handover checkpoint is the old set's.
    Nor is a multiple m required of a node whose own validator was not live throughout its
    interval (`_live_throughout`): one down across checkpoints catches up by fetching
    certified blocks (DESIGN.md section 4) and never holds those in between, and one killed
    after executing m, before Q CHECKPOINTs at m reached it, never holds m: nobody sends
    them again, and its fetch moves h past m. Skipped without K."""
    interval = audit.validators.checkpoint_interval
    if interval is None:
        return no_violations(audit)
    data = audit.data
    exported = data.blocks.groupBy("node").agg(
        F.min("number").alias("first"), F.max("number").alias("last")
    )
    stable = data.checkpoints.where(F.col("stable")).select(
        "node", F.col("seq_no").alias("block_number")
    ).distinct()
    # What the node serves Q matching CHECKPOINTs for is stable whatever `stable` it says.
    proven_here = _proven_by_node(audit)
    reached = audit.union(
        stable.select("node", F.col("block_number").alias("reached")),
        proven_here.select("node", F.col("block_number").alias("reached")),
        data.view_changes.select("node", F.col("stable_seq_no").alias("reached")),
    ).groupBy("node").agg(F.max("reached").alias("reached"))
    k = F.lit(interval).cast("long")
    start = F.greatest(k, F.ceil(F.col("first") / k) * k,
                       F.ceil(F.coalesce(F.col("joined"), F.lit(1)) / k) * k)
    stop = F.least(F.col("last"), F.col("reached"))
    expected = exported.join(reached, "node").join(_joined(audit), "node", "left").select(
        "node", "reached",
        F.explode(F.when(start <= stop, F.sequence(start, stop, k))).alias("block_number"),
    )
    missing = _named_only_where(audit, expected.join(
        proven_stable(audit), "block_number", "left_semi"), _live_throughout(audit, interval)
    ).join(stable, ["node", "block_number"], "left_anti")
    # (Q others' CHECKPOINTs do not make m stable on a replica that has not executed m: its
    # own must be among them, pbft_engine.core.log `stable`; killed before, it holds them)
    proven_not_stable = _named_only_where(audit, proven_here.join(
        stable, ["node", "block_number"], "left_anti"), _executed_here(audit))
    return violations(
        missing.join(proven_here, ["node", "block_number"], "left_anti"),
        "checkpoint-missing",
        F.format_string(
            "no stable checkpoint at %d, which Q validators' CHECKPOINTs prove stable: "
            "every such multiple of K = %d up to %d (the highest stable checkpoint the node "
            "names) must be served with its proof",
            "block_number", F.lit(interval), "reached",
        ),
    ).unionByName(violations(
        proven_not_stable,
        "checkpoint-missing",
        F.format_string("the node serves Q validators' matching CHECKPOINTs for %d but says "
                        "it is not stable", "block_number"),
    ))


def _own_addresses(audit: Audit) -> DataFrame:
    """(node, validator): the address each node names as its own (the manifest's)."""
    return audit.data.export_manifest.where(F.col("validator").isNotNull()).select(
        "node", F.lower(F.col("validator")).alias("validator")).distinct()


def _named_only_where(audit: Audit, required: DataFrame, where: DataFrame) -> DataFrame:
    """`required` (node, block_number, ...): all of it for a node that names no address,
    only the rows in `where` for one that does (the node's word, as in `_joined`)."""
    named = _own_addresses(audit)
    return audit.union(
        required.join(named, "node", "left_anti"),
        required.join(named.select("node"), "node", "left_semi").join(
            where, ["node", "block_number"], "left_semi"))


def _live_throughout(audit: Audit, interval: int) -> DataFrame:
    """(node, block_number): the multiples m of K throughout whose interval the address a
    node names was live: its valid COMMIT for every block from m to m + K - 1 is in the
    export (in any node's certificates). Each replica sends its CHECKPOINT at m once, on
    executing m, so one that went on voting that long was up when they came; one killed in
    between (its COMMITs at m and m + 1 sent, the blocks after committed without it) may
    never hold m stable: nobody sends them again (issue 31's script, now and then). A
    replica that leaves its own COMMIT for one block of the interval out of its certificates
    (it holds the others' to put in its place) is asked for fewer unless another exported
    node's certificates hold that COMMIT; its blocks, certificates and checkpoints are
    checked all the same."""
    commits = signatures(audit).where(F.col("valid") & (F.col("type") == "commit")).select(
        F.col("signer").alias("validator"), "seq_no").distinct()
    voted = _own_addresses(audit).join(commits, "validator").select("node", "seq_no").distinct()
    multiple = F.floor(F.col("seq_no") / interval) * interval
    return voted.groupBy("node", multiple.alias("block_number")).count().where(
        F.col("count") == interval).select("node", "block_number")


def _executed_here(audit: Audit) -> DataFrame:
    """(node, block_number): checkpoints whose seqNo the node executed, as its rows say:
    its own CHECKPOINT (signed by the address it names) is among them."""
    rows = audit.data.checkpoints.select("node", "message").distinct()
    return rows.join(_checkpoint_votes(audit), "message").join(
        _own_addresses(audit).withColumnRenamed("validator", "signer"), ["node", "signer"]).select(
        "node", F.col("seq_no").alias("block_number")).distinct()


def _joined(audit: Audit) -> DataFrame:
    """(node, joined): the first block of the first epoch that counts the address the node
    named as its own to the export (the manifest's `validator`); 1 for a genesis member, an
    address no epoch counts or a node that named none (an observer). The node's word: one
    that names another member's address escapes checkpoint-missing below that member's
    first epoch, and nothing else (its blocks and certificates are checked all the same).
    Of several addresses (exports at different times), the earliest member's."""
    named = F.col("validator")
    first = F.coalesce(audit.validators.first_member_height(named), F.lit(1))
    return audit.data.export_manifest.where(named.isNotNull()).groupBy("node").agg(
        F.min(first).alias("joined"))


def _proven_by_node(audit: Audit) -> DataFrame:
    """(node, block_number): seqNos a node's own checkpoint rows prove stable (Q validators'
    valid matching CHECKPOINTs among them)."""
    rows = audit.data.checkpoints.select("node", "message").distinct()
    return _quorum_of_checkpoints(audit, rows.join(_checkpoint_votes(audit), "message"), ["node"])


# --- signer columns ----------------------------------------------------------------------

def _named(frame: DataFrame, column: str, named: Column, block: Column,
           message: str = "message", served: Column | None = None) -> DataFrame:
    """(node, block_number, column, served, named, message) of a table's signer column:
    `named` is the address it names, `served` the value as served (for the detail)."""
    return frame.where(F.col(message).isNotNull()).select(
        "node",
        block.cast("long").alias("block_number"),
        F.lit(column).alias("column"),
        F.coalesce(served if served is not None else named, F.lit("no signer")).alias("served"),
        named.alias("named"),
        F.col(message).alias("message"),
    )


def signer_columns(audit: Audit) -> DataFrame:
    """signer-column: every signer a node names (a commit certificate's signer, a CHECKPOINT's
    replica, a VIEW-CHANGE's signer, a NEW-VIEW's primary, the accused of evidence) is the
    address its signed message recovers to."""
    data = audit.data
    replica = F.col("replica")
    replica_address = audit.validators.address_of(replica, F.col("seq_no"))
    named = audit.union(
        _named(data.commit_certificates, "commit_certificates.signer", F.col("signer"),
               F.col("block_number")),
        _named(data.checkpoints, "checkpoints.replica", replica_address,
               F.col("seq_no"), served=F.format_string(
                   "%s (%s)", replica.cast("string"),
                   F.coalesce(replica_address, F.lit("outside the set")))),
        _named(data.view_changes, "view_changes.signer", F.col("signer"), F.lit(None)),
        _named(data.view_changes.select("node", "primary", "new_view").distinct(),
               "view_changes.primary", F.col("primary"), F.lit(None), message="new_view"),
        _named(data.evidence, "evidence.signer", F.col("signer"),
               slot_block(F.col("type"), F.col("seq_no")), message="first"),
    )
    wrong = named.join(recovered(audit, "r"), "message").where(
        F.col("r_signer").isNotNull() & ~F.col("named").eqNullSafe(F.col("r_signer"))
    )
    return violations(
        wrong,
        "signer-column",
        F.format_string("%s is %s; the signed message recovers to %s", "column", "served",
                        "r_signer"),
    )


def record_fields(audit: Audit) -> DataFrame:
    """record-fields: a consensus record's column that its signed message binds is the
    message's: a VIEW-CHANGE's `stable_seq_no` (the sender's stable checkpoint, which
    checkpoint-missing and the report's installed views read)."""
    served = audit.data.view_changes.where(F.col("message").isNotNull())
    wrong = served.join(recovered(audit, "r"), "message").where(
        (F.col("r_type") == "view-change")
        & ~F.col("stable_seq_no").eqNullSafe(F.col("r_seq_no"))
    )
    return violations(
        wrong,
        "record-fields",
        F.format_string("view_changes.stable_seq_no is %s; the signed VIEW-CHANGE of view %d "
                        "names %d", F.coalesce(F.col("stable_seq_no").cast("string"),
                                               F.lit("null")), "r_view", "r_seq_no"),
        block=F.lit(None),
    )


# --- evidence ----------------------------------------------------------------------------

def _message_fault(prefix: str, label: str) -> Column:
    """Why the `label` message of an evidence row is not validly signed by a validator."""
    error, signer = F.col(f"{prefix}_error"), F.col(f"{prefix}_signer")
    return (
        F.when(error.isNotNull(), F.format_string("%s: %s", F.lit(label), error))
        .when(signer.isNull(), F.format_string("%s is not a signed message", F.lit(label)))
        .when(~F.col(f"{prefix}_valid"), F.format_string(
            "%s claims replica %d but recovers to %s, not that validator", F.lit(label),
            f"{prefix}_replica", signer))
    )


def _row_mismatch(prefix: str, label: str) -> Column:
    """How the `label` message differs from what the evidence row says it is."""
    kind, view, seq_no = F.col("type"), F.col(f"{prefix}_view"), F.col(f"{prefix}_seq_no")
    return (
        F.when(~F.col("signer").eqNullSafe(F.col(f"{prefix}_signer")), F.format_string(
            "%s is signed by %s, not by the accused", F.lit(label), f"{prefix}_signer"))
        .when(~kind.eqNullSafe(F.col(f"{prefix}_type")), F.format_string(
            "%s is a %s message", F.lit(label), f"{prefix}_type"))
        .when((kind != "checkpoint") & ~F.col("view").eqNullSafe(view), F.format_string(
            "%s is for view %s", F.lit(label), view.cast("string")))
        .when(~kind.isin(*VIEW_MESSAGES) & ~F.col("seq_no").eqNullSafe(seq_no),
              F.format_string("%s is for seqNo %s", F.lit(label), seq_no.cast("string")))
    )


def verified_evidence(audit: Audit) -> DataFrame:
    """The evidence table with `problem` (why it proves nothing; null when it does) and
    `proof`: "equivocation" (two different messages the accused validator signed for the
    row's type, view and seqNo), "one message" (the accused signed `first` as the row says,
    and no `second` was kept: the node's word that it was a fault, never an accusation), or
    null when `problem` is set."""
    certified = quorum_commits(audit).select(
        F.col("seq_no").alias("q_seq_no"), F.col("digest").alias("q_digest"))
    rows = (
        audit.data.evidence.join(recovered(audit, "a", "first"), "first", "left")
        .join(recovered(audit, "b", "second"), "second", "left")
        .join(certified, (F.col("a_seq_no") == F.col("q_seq_no"))
              & (F.col("a_digest") == F.col("q_digest")), "left")
    )
    second = F.col("second").isNotNull()
    # What one signed message proves by itself (the engine keeps just these with no second):
    # a PREPARE from the view's primary, which never sends one, and a PRE-PREPARE of a block
    # not certified at its seqNo (refused as invalid). Any other lone message is one an
    # honest validator signs: a replayed COMMIT must never accuse its signer.
    lone_fault = (
        ((F.col("type") == "prepare")
         & (F.col("a_replica") == F.col("view") % audit.validators.size_at(F.col("a_height"))))
        | ((F.col("type") == "pre-prepare") & F.col("q_digest").isNull())
    )
    problem = F.coalesce(
        F.when(F.col("first").isNull(), F.lit("no first message")),
        _message_fault("a", "first"),
        _row_mismatch("a", "first"),
        F.when(second, F.coalesce(
            _message_fault("b", "second"),
            _row_mismatch("b", "second"),
            F.when(F.col("a_digest") == F.col("b_digest"),
                   F.lit("first and second sign the same content")),
        )),
        F.when(~second & ~lone_fault, F.lit(
            "one message an honest validator signs, and no second: only a PREPARE from the "
            "view's primary or a PRE-PREPARE of a block never certified proves a fault alone")),
    )
    return rows.withColumn("problem", problem).withColumn(
        "proof",
        F.when(F.col("problem").isNull(),
               F.when(second, F.lit("equivocation")).otherwise(F.lit("one message"))),
    )


def evidence_false(audit: Audit) -> DataFrame:
    """evidence-false: evidence accuses a validator only with two different messages it
    signed for the row's type, view and seqNo (or one it signed, with `second` null: kept,
    never counted as equivocation); anything else accuses without proof."""
    return violations(
        verified_evidence(audit).where(F.col("problem").isNotNull()),
        "evidence-false",
        F.format_string(
            "evidence against %s (%s, view %s, seqNo %s) proves nothing: %s",
            F.coalesce(F.col("signer"), F.lit("no one")), "type",
            F.coalesce(F.col("view").cast("string"), F.lit("-")),
            F.coalesce(F.col("seq_no").cast("string"), F.lit("-")), "problem",
        ),
        block=slot_block(F.col("type"), F.col("seq_no")),
    )


# --- malformed records -------------------------------------------------------------------

# Each consensus table's hex columns: (column, bytes it must hold; None: a signed message).
HEX_COLUMNS: dict[str, tuple[tuple[str, int | None], ...]] = {
    "commit_certificates": (("block_hash", 32), ("digest", 32), ("signer", 20),
                            ("signature", 65), ("message", None)),
    "checkpoints": (("block_hash", 32), ("state_root", 32), ("signature", 65),
                    ("message", None)),
    "view_changes": (("primary", 20), ("signer", 20), ("new_view", None), ("message", None)),
    "evidence": (("signer", 20), ("first", None), ("second", None)),
}


def _shown(value: Column) -> Column:
    """A served value for a detail line, cut short."""
    return F.when(F.length(value) > 24, F.concat(F.substring(value, 1, 24), F.lit("...")))\
        .otherwise(value)


def _column_fault(table: str, column: str, size: int | None) -> Column:
    value = F.col(column)
    pattern = r"^0x([0-9a-f]{2})*$" if size is None else rf"^0x[0-9a-f]{{{2 * size}}}$"
    what = "hex" if size is None else f"{size} bytes of hex"
    fault = F.when(~value.rlike(pattern), F.format_string(
        "%s.%s %s is not %s", F.lit(table), F.lit(column), _shown(value), F.lit(what)))
    if size is None:  # a signed message: the bytes must also decode as one
        fault = fault.when(F.col(f"{column}_error").isNotNull(), F.format_string(
            "%s.%s %s: %s", F.lit(table), F.lit(column), _shown(value), f"{column}_error"))
    return F.when(value.isNotNull(), fault)


def malformed_records(audit: Audit) -> DataFrame:
    """malformed-value: every hash, address and signature column of the consensus tables is
    hex of its size, and every message column hex bytes that decode as a signed message."""
    undecodable = signatures(audit).where(F.col("malformed")).select("message", "error")
    blocks = {
        "commit_certificates": F.col("block_number"),
        "checkpoints": F.col("seq_no"),
        "view_changes": F.lit(None),
        "evidence": slot_block(F.col("type"), F.col("seq_no")),
    }
    found = []
    for table, columns in HEX_COLUMNS.items():
        frame = getattr(audit.data, table)
        for column, size in columns:
            if size is None:
                frame = frame.join(undecodable.select(
                    F.col("message").alias(column), F.col("error").alias(f"{column}_error")
                ), column, "left")
        faults = F.array_compact(F.array(*(_column_fault(table, c, s) for c, s in columns)))
        exploded = frame.select("node", blocks[table].cast("long").alias("block_number"),
                                F.explode(faults).alias("fault"))
        found.append(violations(exploded, "malformed-value", F.col("fault")))
    return union_all(*found)


# --- figures -----------------------------------------------------------------------------

def _per_signer(audit: Audit, frame: DataFrame, kind: str, key: str) -> DataFrame:
    """(key, count) per recovered validator: distinct `key`s of its valid `kind` messages in
    `frame`."""
    valid = signatures(audit).where(F.col("valid") & (F.col("type") == kind))
    return (frame.select("message").distinct().join(valid, "message")
            .groupBy(F.col("signer").alias("key")).agg(F.countDistinct(key).alias("count")))


def figure_rows(audit: Audit) -> DataFrame:
    """The consensus figures as rows (`figure`: what a row counts; `key` and `count`, or a
    view's columns) to collect with the audit's other results in one job."""
    data = audit.data
    evidence = verified_evidence(audit)
    slot = F.concat_ws("/", "type", "view", "seq_no")
    parts = {
        "commits": _per_signer(audit, data.commit_certificates, "commit", "seq_no"),
        "checkpoints": _per_signer(audit, data.checkpoints, "checkpoint", "seq_no"),
        "view_changes": _per_signer(audit, data.view_changes, "view-change", "view"),
        "equivocations": evidence.where(F.col("proof") == "equivocation")
        .groupBy(F.col("a_signer").alias("key")).agg(F.countDistinct(slot).alias("count")),
        "proofs": evidence.groupBy(F.col("proof").alias("key")).agg(F.count("*").alias("count")),
        "views": installed_views(audit).groupBy("view").agg(
            F.max("primary").alias("primary"), F.max("senders").alias("senders"),
            F.max("stable_seq_no").alias("stable_seq_no")),
    }
    return tagged_union("figure", parts)


def figures_of(rows: list[Row]) -> ConsensusFigures:
    """The figures from the collected `figure_rows`."""
    counts: dict[str, dict[str | None, int]] = {}
    views = []
    for row in rows:
        if row["figure"] == "views":
            views.append(InstalledView(row["view"], row["primary"], row["senders"],
                                       row["stable_seq_no"]))
        else:
            counts.setdefault(row["figure"], {})[row["key"]] = row["count"]

    def per_validator(figure: str) -> dict[str, int]:
        return {key: n for key, n in counts.get(figure, {}).items() if key is not None}

    proofs = counts.get("proofs", {})
    return ConsensusFigures(
        commits=per_validator("commits"),
        checkpoints=per_validator("checkpoints"),
        view_changes=per_validator("view_changes"),
        equivocations=per_validator("equivocations"),
        unproven_evidence=proofs.get(None, 0),
        one_message_evidence=proofs.get("one message", 0),
        views=tuple(sorted(views, key=lambda v: v.view)),
    )


def consensus_figures(audit: Audit) -> ConsensusFigures:
    return figures_of(audit.collect(figure_rows(audit)))
