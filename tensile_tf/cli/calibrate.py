"""``tensile calibrate [--models a,b] [--cache FILE]``: profile small models on
this machine and fit the cold-start op-latency predictor (seed 000 §IV-A)."""
from __future__ import annotations

from pathlib import Path

from tensile_tf.cli.common import UserError, install_runtime


def cmd_calibrate(args) -> int:
    """Measures op latencies on this machine and caches the learned
    cold-start predictor (tensile_tf/tf/calibration.py)."""
    from tensile_tf.units import parse_bytes

    try:
        pool = parse_bytes(args.pool, what="--pool")
    except ValueError as e:
        raise UserError(str(e)) from None
    names = [n.strip() for n in args.models.split(",") if n.strip()] if args.models else None
    install_runtime(pool)
    from tensile_tf.tf.calibration import CALIBRATION_MODELS, calibrate

    if names:
        unknown = [n for n in names if n not in CALIBRATION_MODELS]
        if unknown or len(names) < 2:
            raise UserError(f"--models {args.models}: " + (f"unknown {unknown}; " if unknown else "")
                            + f"name at least two of {', '.join(CALIBRATION_MODELS)}")
    predictor, rows, path = calibrate(names, path=Path(args.cache) if args.cache else None, repeats=args.repeats)
    print(f"{'held-out model':<22} {'ops':>5} {'learned error':>14} {'bytes-touched error':>20} {'MLP alone':>10}")
    for r in rows:
        print(f"{r.model:<22} {r.ops:>5} {r.learned_error:>14.1%} {r.bytes_touched_error:>20.1%} {r.mlp_error:>10.1%}")
    print("(error: summed |predicted - measured| op seconds over the measured step; each model predicted "
          "by a predictor fitted without it, its compute kernels timed alone; MLP alone: the same predictor "
          "with no kernel timed)")
    if predictor.alone_scale is not None:
        print(f"kernels timed alone are predicted at {predictor.alone_scale:.2f}x their time alone")
    print(f"wrote {path}: fitted on {len(predictor.trained_on)} models, {predictor.samples} ops; cold starts use it")
    return 0
