"""Group formation in Snakemake 9 made idempotent, so a batch of profiling jobs runs once.

profiles/slurm batches the profiling jobs with ``groups`` and ``group-components``.
Snakemake (checked against 9.27.1) forms the group jobs in ``DAG.update_groups``, which
runs on every ``DAG.postprocess``. When the profiling jobs are already known at start-up
(the op list exists: a new network after ``snakemake results/ops/unique.parquet``, a new
GPU setting, deleted raw logs), it runs twice before the first job starts: once after the
checkpoint's dependencies are updated, once more when the run begins. Two defects then
meet (upstream: snakemake/snakemake#1628, snakemake/snakemake-executor-plugin-slurm#253):

- ``GroupJobFactory.new`` caches group jobs by their member set, but joining the
  components of a batch *mutates* the cached first one (``GroupJob.merge``). On the
  second pass the cache hands out that grown object for its first member, and the
  batching joins up to 50 such objects: one extra group job holding every profiling job.
- ``DAG.update_ready`` adds the second pass's group jobs to the ready set, which still
  holds those of the first pass. Both are submitted: the same ops measured twice, at
  once, and the run's bookkeeping ends early ("288 of 157 steps", exit code 0).

:func:`apply` replaces ``DAG.update_groups`` with a version that builds every group job
from the frozen union of its members through the factory (nothing cached is changed),
orders the components before cutting them into batches (the same DAG gives the same
batches on every pass), keeps group jobs already running as they are, and removes from
the ready set the group jobs that the new grouping no longer has. It refuses, with one
line, a Snakemake whose internals differ from those it was checked against.
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from typing import Any

from opcost.errors import OpcostError

# Major versions whose DAG internals this module was checked against (pyproject pins
# snakemake>=9,<10; checked in detail against 9.27.1).
CHECKED_MAJOR_VERSIONS = ("9",)
# What the replaced method must look like for the replacement to fit.
_EXPECTED_IN_UPDATE_GROUPS = ("group_job_factory.new", "_update_group_components", "bfs(")
_REQUIRED_DAG_ATTRIBUTES = (
    "update_groups",
    "update_ready",
    "validate_group",
    "_check_groups",
    "needrun_jobs",
    "needrun",
    "bfs",
)

_applied = False


class SnakemakeCompatError(OpcostError, RuntimeError):
    """This Snakemake's internals are not those the group fix was checked against."""


def _incompatible(version: str, what: str) -> SnakemakeCompatError:
    return SnakemakeCompatError(
        f"opcost cannot batch profiling jobs safely with Snakemake {version}: {what} "
        "(opcost.snakemake_compat was checked against Snakemake 9.x, up to 9.27.1); "
        "install a Snakemake 9 (pip install 'snakemake>=9,<10')"
    )


def check_internals() -> None:
    """Raise :class:`SnakemakeCompatError` unless Snakemake's internals fit the patch."""
    import snakemake
    import snakemake.api  # noqa: F401  (loads snakemake.dag in an order without import cycles)
    from snakemake import dag as dag_module
    from snakemake import jobs as jobs_module

    version = getattr(snakemake, "__version__", "unknown")
    if version.split(".")[0] not in CHECKED_MAJOR_VERSIONS:
        raise _incompatible(version, "not a version this fix was checked against")
    dag_class = getattr(dag_module, "DAG", None)
    factory = getattr(jobs_module, "GroupJobFactory", None)
    if dag_class is None or factory is None:
        raise _incompatible(version, "snakemake.dag.DAG or snakemake.jobs.GroupJobFactory missing")
    missing = [name for name in _REQUIRED_DAG_ATTRIBUTES if not hasattr(dag_class, name)]
    if missing:
        raise _incompatible(version, f"DAG lacks {', '.join(missing)}")
    if list(inspect.signature(factory.new).parameters) != ["self", "id", "jobs", "resources"]:
        raise _incompatible(version, "GroupJobFactory.new takes other arguments")
    original = getattr(dag_class.update_groups, "__opcost_original__", dag_class.update_groups)
    source = inspect.getsource(original)
    absent = [s for s in _EXPECTED_IN_UPDATE_GROUPS if s not in source]
    if absent:
        raise _incompatible(version, f"DAG.update_groups no longer uses {', '.join(absent)}")


def _job_key(job: Any) -> tuple:
    """A total order of jobs that does not depend on set or hash order."""
    wildcards = tuple(sorted((str(k), str(v)) for k, v in job.wildcards_dict.items()))
    return (job.rule.name, wildcards, tuple(sorted(str(f) for f in job.output)))


def update_groups(self: Any) -> None:
    """``DAG.update_groups`` that yields the same group jobs however often it runs.

    Each needrun job of a group joins the group's jobs it reaches through its
    dependencies (its connected component, as in Snakemake). A group's components, in a
    fixed order, are cut into batches of ``group-components`` each; each batch becomes
    the factory's group job for exactly its members. Group jobs that are running keep
    their members; ready group jobs that no longer exist are dropped from the ready set.
    """
    running_groups = {g for g in self._running if g.is_group()}
    running_members = {job: g for g in running_groups for job in g.jobs}

    components: dict[Any, frozenset] = {}
    for job in self.needrun_jobs():
        if job.group is None or job in running_members:
            continue
        groupid = job.group
        members = {
            j
            for j in self.bfs(self._dependencies, job, stop=lambda j, g=groupid: j.group != g)
            if self.needrun(j) and j not in running_members
        }
        # Join the components found before that share a job with this one.
        for j in list(members):
            if j in components:
                members |= components[j]
        frozen = frozenset(members)
        for j in frozen:
            components[j] = frozen

    by_groupid: dict[str, set[frozenset]] = defaultdict(set)
    for component in set(components.values()):
        by_groupid[next(iter(component)).group].add(component)

    groups: dict[Any, Any] = {}
    for groupid, comps in by_groupid.items():
        for comp in comps:
            self.validate_group(
                self.group_job_factory.new(groupid, comp, self.workflow.global_resources)
            )
        lookup_id = self.workflow.parent_groupids.get(groupid, groupid)
        size = max(1, self.workflow.group_settings.group_components.get(lookup_id, 1))
        ordered = sorted(comps, key=lambda c: min(_job_key(j) for j in c))
        for start in range(0, len(ordered), size):
            members = frozenset().union(*ordered[start : start + size])
            group = self.group_job_factory.new(groupid, members, self.workflow.global_resources)
            for j in members:
                groups[j] = group
    for group in running_groups:
        for j in group.jobs:
            groups[j] = group

    self._group = groups
    current = set(groups.values())
    for group in current:
        group.finalize()
    self._check_groups()
    stale = {g for g in self._ready_jobs if g.is_group() and g not in current}
    self._ready_jobs -= stale


def apply() -> None:
    """Install :func:`update_groups` as ``snakemake.dag.DAG.update_groups`` (once).

    Raises:
        SnakemakeCompatError: this Snakemake's internals differ from those checked.
    """
    global _applied
    if _applied:
        return
    check_internals()
    from snakemake.dag import DAG

    update_groups.__opcost_original__ = DAG.update_groups  # type: ignore[attr-defined]
    DAG.update_groups = update_groups
    _applied = True
