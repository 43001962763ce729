"""The vLLM adapter's job bookkeeping: jobs submitted and not yet reported,
results of rejected submits, and per-request keys whose load failed."""

from __future__ import annotations

import select
from collections.abc import Iterable
from typing import Any

from . import _lib
from ._adapter import FailureLog
from ._mirror import PresenceMirror
from ._vllm_compat import job_result, logger
from .errors import KVTierError
from .records import JobResult
from .tier import Tier

_POLL_BATCH = 1024


def _job_rows(job: Any) -> Any:
    rows = getattr(job, "chunk_ids", None)
    return job.block_ids if rows is None else rows


class JobBook:
    """Submits vLLM's jobs to the tier and reports each exactly once, as
    vLLM's ``JobResult``. Scheduler-facing: never raises; a rejected submit
    becomes a failed result at the next :meth:`finished`."""

    def __init__(
        self,
        tier: Tier,
        mirror: PresenceMirror,
        failed_keys: dict[str, set[bytes]],
        row_bytes: int,
        log: FailureLog,
    ) -> None:
        self._tier = tier
        self._mirror = mirror
        self._row_bytes = row_bytes
        self._log = log
        # job id -> (is_load, keys, req_id, mirror-HIT keys of a load)
        self.jobs: dict[int, tuple[bool, Any, str | None, set[bytes] | None]] = {}
        # Results of rejected submits, reported by the next finished().
        self._ready: list[Any] = []
        # req_id -> keys whose load failed for that request: they look up as
        # MISS for it, so it cannot loop on a promotion that cannot succeed.
        self.failed_keys = failed_keys
        # Readable exactly while results wait: a select on it costs a third
        # of an empty poll, and an engine asks far more often than jobs end.
        # Without one (no descriptor left), every call polls, as before.
        self._results_fd: int | None
        try:
            self._results_fd = tier.completion_fd()
        except KVTierError as exc:
            log.failed("completion_fd", exc)
            self._results_fd = None

    def submit(self, job: Any, is_load: bool) -> None:
        job_id = job.job_id
        req_context = getattr(job, "req_context", None)
        req_id = getattr(req_context, "req_id", None)
        keys: Any = ()
        what = "submit_load" if is_load else "submit_store"
        try:
            keys = job.keys
            # bytes keys: the mirror hashes them (a bytearray cannot be hashed).
            keys = [k if type(k) is bytes else bytes(k) for k in keys]
            rows = _job_rows(job)
            if is_load:
                self._tier.submit_load(job_id, keys, rows)
            else:
                self._mirror.before_store()
                self._tier.submit_store(job_id, keys, rows)
        except KVTierError as exc:
            self._log.failed(what, exc)
            if exc.status == _lib.TIER_ERR_DUPLICATE_JOB:
                # The id is in flight and will be reported once; a second
                # report would break vLLM's exactly-once bookkeeping.
                return
            self._reject(job_id, keys, req_id, is_load)
            return
        except Exception as exc:
            self._log.failed(what, exc)
            self._reject(job_id, keys, req_id, is_load)
            return
        promised = self._mirror.submitted(keys, is_load)
        self.jobs[job_id] = (is_load, keys, req_id, promised)

    def _reject(self, job_id: int, keys: Any, req_id: str | None, is_load: bool) -> None:
        if is_load:
            try:
                self._mark_failed(req_id, keys)
            except TypeError:  # unhashable junk keys: nothing to remember
                pass
        self._ready.append(job_result(job_id=job_id, success=False))

    def _mark_failed(self, req_id: str | None, keys: Iterable[bytes]) -> None:
        if req_id is None:
            return
        failed = self.failed_keys.get(req_id)
        if failed is None:
            failed = self.failed_keys[req_id] = set()
        failed.update(keys)

    def _finished(self, r: JobResult) -> Any:
        is_load, keys, req_id, promised = self.jobs.pop(r.job_id)
        self._mirror.settled(keys)
        success = r.status == _lib.TIER_OK
        # vLLM's backpressure detector and its read/write byte counters take
        # a job's size as len(keys) x row bytes (vLLM's fs tier reports the
        # same), whether or not a block was already present; the library's
        # r.bytes counts only bytes it copied.
        size = len(keys) * self._row_bytes or None
        common = {
            "job_id": r.job_id,
            # Active transfer time, without time queued (as vLLM's fs tier).
            "transfer_time": r.io_ns / 1e9,
            "transfer_bytes": size,
            "transfer_size": size,
        }
        if not is_load or success:
            return job_result(success=success, **common)
        done = min(r.num_done, len(keys))
        failed = keys[done:]
        self._mark_failed(req_id, failed)
        self._mirror.load_failed(promised, failed)
        return job_result(success=False, successful_keys=tuple(keys[:done]) if done else None, **common)

    def finished(self) -> list[Any]:
        """The results of every job reported since the last call; then the
        mirror catches up with the events those jobs recorded."""
        if self._ready:
            results, self._ready = self._ready, []
        else:
            results = []
        polled = False
        if self.jobs and not self._tier.closed and self._results_waiting():
            polled = True
            try:
                while True:
                    batch = self._tier.poll(_POLL_BATCH)
                    for r in batch:
                        if r.job_id not in self.jobs:
                            logger.error("kvtier reported unknown job id %d; dropped", r.job_id)
                            continue
                        results.append(self._finished(r))
                    if len(batch) < _POLL_BATCH:
                        break
            except Exception as exc:
                self._log.failed("get_finished_jobs", exc)
        mirror = self._mirror
        mirror.bound_promises()
        if mirror.reads_events and not self._tier.closed and (polled or mirror.expects_events_between_jobs):
            # After the results: the library records a job's events before
            # queueing its result, so the keys just settled are up to date.
            try:
                mirror.drain_events()
                mirror.resync(len(self.jobs))
            except Exception as exc:
                mirror.failed("get_finished_jobs", exc)
        return results

    def _results_waiting(self) -> bool:
        fd = self._results_fd
        return fd is None or bool(select.select([fd], [], [], 0)[0])

    def has_pending_work(self) -> bool:
        return bool(self.jobs) or bool(self._ready)

    def request_finished(self, req_id: Any) -> None:
        self.failed_keys.pop(req_id, None)

    def clear(self) -> None:
        """Forgets every job (the tier was closed, abandoning them)."""
        self.jobs.clear()
        self.failed_keys.clear()
