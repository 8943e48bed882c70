"""Issue 57: the summary table written to a file or a CI log is not cut (it was, to 80 columns:
"finish…", "median st…"); on a terminal the console is at least 120 wide."""
import io
from types import SimpleNamespace

from tensile_tf.reports.console import FILE_WIDTH, summary_table, wide_console


def _result():
    state = SimpleNamespace(name="a-job-with-a-rather-long-name-from-a-search-trial-0042", error=None,
                            status=SimpleNamespace(value="finished"), steps_done=1200,
                            job=SimpleNamespace(steps=1200), median_step_s=0.123456, training_peak_bytes=123 << 20,
                            plan=SimpleNamespace(predicted_planned_peak_bytes=456 << 20),
                            persistent_bytes=78 << 20, temporary_bytes=90 << 20, last_loss=0.123456)
    pool = SimpleNamespace(peak=1 << 30, run_ooms=0, run_stitched=0, training_peak=1 << 29)
    return SimpleNamespace(capacity=2 << 30, pool=pool, wall_s=12.3, most_jobs_running=1, jobs=[state],
                           planner=None, trace=SimpleNamespace(events_dropped=False))


def test_a_table_written_to_a_file_is_whole():
    out = io.StringIO()
    console = wide_console(out)
    assert console.width == FILE_WIDTH
    summary_table(_result(), console)
    text = out.getvalue()
    assert "…" not in text
    for whole in ("a-job-with-a-rather-long-name-from-a-search-trial-0042", "finished", "median step",
                  "predicted peak", "456.0 MiB (plan)", "0.1235"):
        assert whole in text, text


def test_the_control_at_80_columns_cuts_it():
    from rich.console import Console

    out = io.StringIO()
    summary_table(_result(), Console(file=out, width=80))
    assert "…" in out.getvalue()
