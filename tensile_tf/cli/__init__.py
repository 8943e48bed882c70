"""The ``tensile`` command (also ``python -m tensile_tf``).

    tensile run CONFIG [--out DIR]      train the config's jobs concurrently
    tensile run CONFIG --compare-vanilla  the same, unplanned then planned, and compare
    tensile validate CONFIG             check a config without running it
    tensile plan CONFIG [--out DIR]     trace and plan the jobs (TENSILE), write plan.json
    tensile search CONFIG [--out DIR] [--storage URL] [--resume]
                                        hyperparameter search, trials packed into the pool

One module per command (``run``, ``validate``, ``plan``, ``calibrate``,
``search``), what they share in ``common``; this module only parses and
dispatches, and turns errors into exit codes.
"""
from __future__ import annotations

import argparse
import sys

from tensile_tf.cli.calibrate import cmd_calibrate
from tensile_tf.cli.common import UserError
from tensile_tf.cli.plan import cmd_plan
from tensile_tf.cli.run import cmd_run
from tensile_tf.cli.search import add_search_parser
from tensile_tf.cli.validate import cmd_validate
from tensile_tf.scheduler.latency_predictor import PROFILED_STEPS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tensile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show the traceback of any error")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train the jobs of a YAML config concurrently in one process")
    run.add_argument("config")
    run.add_argument("--out", help="output directory (default: the config's run.out_dir)")
    run.add_argument("--compare-vanilla", action="store_true",
                     help="run the config unplanned, then planned (TENSILE), with deterministic ops; report "
                          "peaks, MSR, time ratio, swaps, recomputation, late swap-ins, bit-for-bit match; "
                          "writes compare.json")
    run.add_argument("--plan", help="run this plan.json (from `tensile plan`) instead of planning afresh; refused "
                     "if it was made for other graphs")
    run.set_defaults(func=cmd_run)
    validate = sub.add_parser("validate", help="check a YAML config without running it")
    validate.add_argument("config")
    validate.add_argument("--data", action="store_true",
                          help="also read every job's examples (decode every image, load every array) as a run would")
    validate.set_defaults(func=cmd_validate)
    plan = sub.add_parser("plan", help="trace the config's jobs and plan swaps/recomputation without training")
    plan.add_argument("config")
    plan.add_argument("--out", help="output directory for plan.json (default: the config's run.out_dir)")
    plan.add_argument("--budget", help="most bytes the jobs may use together, e.g. 512MiB (default: the config's "
                      "run.plan_budget, else the pool less its 10%% headroom, as `tensile run` plans; never above that)")
    plan.add_argument("--bandwidth", help="swap link bandwidth per second, e.g. 12GiB, or a device link: h200-pcie5, "
                      "h200-pcie5-bf16 (default: PCIe 3 x16)")
    plan.set_defaults(func=cmd_plan)
    calibrate = sub.add_parser("calibrate", help="measure op latencies on this machine and fit the cold-start "
                               "latency predictor (cached; used when a job's first step does not fit)")
    calibrate.add_argument("--models", help="comma-separated calibration models (default: all)")
    calibrate.add_argument("--cache", help="where to write the predictor (default: the user cache directory, "
                           "or $TENSILE_LATENCY_PREDICTOR)")
    calibrate.add_argument("--repeats", type=int, default=PROFILED_STEPS,
                           help=f"profiled steps per model (default {PROFILED_STEPS})")
    calibrate.add_argument("--pool", default="2GiB", help="device pool for the measurements (default 2GiB)")
    calibrate.set_defaults(func=cmd_calibrate)
    add_search_parser(sub)
    for command in sub.choices.values():  # `tensile run X --debug` as well as `tensile --debug run X`
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="show the traceback of any error")
    return parser


EXIT_USAGE = 2   # a bad config, argument or path (argparse uses 2 too)


def _terminate_like_interrupt():
    """SIGTERM outside a run (the config being checked, TensorFlow importing, a plan being made)
    ends the command as Ctrl-C does: a message and exit 130, not a silent 143. Inside a run,
    Note [Stopping on a signal] (runtime/interrupts.py) takes both signals over and writes the
    results. Returns the handler it replaced (None off the main thread)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def interrupted(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    # SIGINT too: a process started with SIGINT ignored (a background job, a test runner's worker)
    # would otherwise not hear Ctrl-C until the run's own handler is in place
    return {signal.SIGTERM: signal.signal(signal.SIGTERM, interrupted),
            signal.SIGINT: signal.signal(signal.SIGINT, interrupted)}


def _restore_terminate(previous) -> None:
    import signal

    for sig, handler in (previous or {}).items():
        signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 every job finished; 1 a job failed or was rejected (or
    an internal error); 2 a bad config or usage; 130 interrupted. A user's
    mistake prints what, where and what to do, never a traceback (``--debug``
    shows one for any error)."""
    args = build_parser().parse_args(argv)
    previous = _terminate_like_interrupt()
    try:
        return args.func(args)
    except UserError as e:
        if getattr(args, "debug", False):
            raise
        print(f"tensile {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        if getattr(args, "debug", False):
            raise
        from tensile_tf.runtime.interrupts import EXIT_INTERRUPTED

        print(f"tensile {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - the last line of defence: one line, and how to see more
        if getattr(args, "debug", False):
            raise
        print(f"tensile {args.command}: internal error: {type(e).__name__}: {e}\n"
              f"  run it again with --debug for the traceback", file=sys.stderr)
        return 1
    finally:
        _restore_terminate(previous)


if __name__ == "__main__":
    sys.exit(main())
