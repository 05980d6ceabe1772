"""The audit's three ways of running (`Audit.one_partition`, `Audit.on_driver`): a tiny
export in one partition with the passes' Python on the driver, a small one in one partition
(no shuffle), a large one's passes over every row in parallel partitions first. All must
report the same violations, counts and figures: the same rules, run three ways."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from spark_etl.audit import RULES, ValidatorSet, _results, run_audit
from spark_etl.audit.context import DRIVER_BYTES, Audit
from tests.etl.chain_factory import ServedChain
from tests.etl.conftest import NODE_A, Tables, dataset
from tests.etl.test_audit import FAULTS

WAYS = ((True, True), (True, False), (False, False))  # (one_partition, on_driver)


def test_every_way_of_running_finds_every_planted_fault_alike(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet, test_chain: ServedChain,
) -> None:
    # every planted fault at once, but the transaction dropped from the block whose raw
    # transaction is changed (the one hides the other); a plant two faults share (a block
    # dropped: a gap, and rows of a block not in blocks) is planted once
    faults = [fault for name, fault in FAULTS.items() if name != "transaction missing"]
    for plant in dict.fromkeys(plant for plant, _, _, _ in faults):
        plant(tables, test_chain)
    data = dataset(spark, tables)
    driver, *others = (run_audit(data, validator_set, one_partition=one, on_driver=on_driver)
                       for one, on_driver in WAYS)
    found = {(v.rule, v.node, v.block_number) for v in driver.violations}
    planted = {(name, NODE_A, block) for _, _, name, block in faults}
    assert planted <= found, planted - found
    for other in others:
        assert driver.violations == other.violations
        assert (driver.blocks, driver.transactions, driver.signatures, driver.figures) == (
            other.blocks, other.transactions, other.signatures, other.figures)


@pytest.mark.parametrize("size, expected", [
    (0, (True, True)), (DRIVER_BYTES + 1, (True, False)), (1 << 40, (False, False)),
])
def test_the_way_is_chosen_by_the_size_of_the_export(
    spark: SparkSession, clean_tables: Tables, validator_set: ValidatorSet,
    monkeypatch: pytest.MonkeyPatch, size: int, expected: tuple[bool, bool],
) -> None:
    from spark_etl.audit import context

    monkeypatch.setattr(context.Dataset, "estimated_bytes", lambda _: size)
    audit = context.Audit(dataset(spark, clean_tables), validator_set)
    assert (audit.one_partition, audit.on_driver) == expected


@pytest.mark.parametrize("on_driver", [True, False])
def test_on_the_driver_the_rules_query_runs_no_python(
    spark: SparkSession, clean_tables: Tables, validator_set: ValidatorSet, on_driver: bool,
) -> None:
    # a Python worker's start and the stages waiting on the task that caches a pass were
    # seconds of a 5-block audit whose passes take milliseconds
    audit = Audit(dataset(spark, clean_tables), validator_set, True, on_driver)
    try:
        with audit.planning():
            plan = _results(audit, RULES)._jdf.queryExecution().executedPlan().toString()
    finally:
        audit.release()
    assert ("MapInArrow" in plan or "ArrowEvalPython" in plan) is not on_driver


def test_in_one_partition_the_audit_is_one_job_of_one_task_stages(
    spark: SparkSession, clean_tables: Tables, validator_set: ValidatorSet,
) -> None:
    # each task has a fixed cost: the results' union read one task per part (61 on a
    # 5-block chain) until it was read as one partition
    tracker = spark.sparkContext.statusTracker()
    job_ids = audit_jobs(spark, clean_tables, validator_set, one_partition=True,
                         on_driver=False)
    jobs = [tracker.getJobInfo(job) for job in job_ids]
    stages = [tracker.getStageInfo(stage) for job in jobs if job for stage in job.stageIds]
    tasks = [stage.numTasks if stage else None for stage in stages]
    assert (len(jobs), set(tasks)) == (1, {1}), tasks


def test_a_large_export_is_a_job_a_pass_and_one_for_the_rules(
    spark: SparkSession, clean_tables: Tables, validator_set: ValidatorSet,
) -> None:
    # planned adaptively and with broadcast joins, the rules of a large export were ~150
    # jobs of 1-2 tasks (each adaptive query stage and each broadcast a job): now each pass
    # over every row (signatures, column checks, row digests) is a job, and the rules one
    assert len(audit_jobs(spark, clean_tables, validator_set, one_partition=False,
                          on_driver=False)) == 4


def audit_jobs(spark: SparkSession, tables: Tables, validator_set: ValidatorSet,
               one_partition: bool, on_driver: bool) -> list[int]:
    """The ids of the Spark jobs a sound audit of `tables` ran."""
    context = spark.sparkContext
    group = f"audit-jobs-{one_partition}"
    context.setJobGroup(group, "the audit's jobs")
    try:
        result = run_audit(dataset(spark, tables), validator_set, one_partition=one_partition,
                           on_driver=on_driver)
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    assert result.ok
    return list(context.statusTracker().getJobIdsForGroup(group))
