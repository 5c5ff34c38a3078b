"""Running the Beam pipeline: where a remote job can be watched, and its progress while it runs.

A local DirectRunner run is watched through its staging folder (progress.py). A job on
another runner (Dataflow, Flink, Spark, Portable) runs elsewhere: the launcher prints
its job id and monitoring URL as soon as it is submitted, then, every `interval_s`, the
job's state and hbpe's Beam counters (units, documents, MB of text) as the runner
reports them. Ctrl-C cancels the job, so none is left running unseen.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from hbpe.schemas.errors import HbpeError


def job_link(result: Any, options: Any) -> str | None:
    """Where to watch a submitted job: Dataflow's console URL, else the job id (and Flink's UI when named)."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    if type(result).__name__ == "DataflowPipelineResult" and getattr(result, "has_job", False):
        gcp = options.view_as(GoogleCloudOptions)
        return f"https://console.cloud.google.com/dataflow/jobs/{gcp.region}/{result.job_id()}?project={gcp.project}"
    job_id = getattr(result, "_job_id", None)  # PortableRunner and the Flink/Spark runners built on it
    if not job_id:
        return None
    flink = options.get_all_options().get("flink_master")
    ui = f", Flink UI http://{flink}" if flink and not str(flink).startswith("[") else ""
    return f"job {job_id}{ui}"


def counters(result: Any) -> dict[str, int]:
    """hbpe's Beam counters as the runner reports them now (committed if known, else attempted); {} if none yet."""
    from apache_beam.metrics.metric import MetricsFilter

    try:
        found = result.metrics().query(MetricsFilter().with_namespace("hbpe"))["counters"]
    except Exception:  # a runner without metrics, or a transient API error: progress is best effort
        return {}
    out: dict[str, int] = {}
    for m in found:
        value = m.committed if m.committed is not None else m.attempted
        out[m.key.metric.name] = out.get(m.key.metric.name, 0) + int(value or 0)
    return out


def progress_line(state: str, c: dict[str, int], n_units: int, elapsed: float) -> str:
    """'[beam] RUNNING 42s: units 3/12, 1,234 documents, 56.7 MB of text, shards 0'."""
    parts = [f"units {c.get('units_encoded', 0)}/{n_units}"]
    if "documents_read" in c:
        parts.append(f"{c['documents_read']:,} documents")
    if "bytes" in c:
        parts.append(f"{c['bytes'] / 1e6:.1f} MB of text")
    if "shards_written" in c:
        parts.append(f"shards {c['shards_written']}")
    return f"[beam] {state} {elapsed:.0f}s: " + ", ".join(parts)


def run_and_watch(
    pipeline: Any, options: Any, *, n_units: int, say: Callable[[str], None], interval_s: float = 10.0
) -> None:
    """Run `pipeline` to the end; for a runner other than the DirectRunner, show where and how it goes."""
    from apache_beam.options.pipeline_options import StandardOptions
    from apache_beam.runners.runner import PipelineState

    result = pipeline.run()  # the DirectRunner returns when done; other runners once the job is submitted
    local = options.view_as(StandardOptions).runner in ("DirectRunner", "BundleBasedDirectRunner")
    if not local:
        link = job_link(result, options)
        say(f"[beam] submitted to {options.view_as(StandardOptions).runner}" + (f": {link}" if link else ""))
    box: dict[str, Any] = {}

    def wait() -> None:
        try:
            box["state"] = result.wait_until_finish()
        except BaseException as e:  # re-raised in the launcher's thread
            box["error"] = e

    # a thread waits: PortableRunner's wait_until_finish(duration) cannot be called twice (its streams are
    # generators), and the launcher's thread must stay free for Ctrl-C
    waiter = threading.Thread(target=wait, name="hbpe-beam-wait", daemon=True)
    waiter.start()
    t0, last, shown = time.monotonic(), 0.0, None
    try:
        while waiter.is_alive():
            waiter.join(0.2)
            if local or time.monotonic() - last < interval_s or not waiter.is_alive():
                continue
            last = time.monotonic()
            state, c = str(result.state), counters(result)
            if (state, c) != shown:  # a line when something moved, not one every interval
                say(progress_line(state, c, n_units, last - t0))
                shown = (state, c)
    except KeyboardInterrupt:
        if not local:
            try:
                result.cancel()
                say("[beam] the job was cancelled")
            except Exception as e:  # it may have ended meanwhile, or the runner cannot cancel
                say(f"[beam] could not cancel the job ({e}); stop it on the runner")
        raise
    if "error" in box:
        raise box["error"]
    state = box.get("state")
    if state is not None and str(state) not in (PipelineState.DONE, "DONE"):
        raise HbpeError(f"the Beam job ended in state {state}; see the runner's logs")
    if not local:
        say(progress_line(str(state), counters(result), n_units, time.monotonic() - t0))
