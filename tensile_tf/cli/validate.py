"""``tensile validate CONFIG``: every check that can be made without training,
for a run config or a search config."""
from __future__ import annotations

from tensile_tf.cli.common import UserError, check_references, install_runtime, is_search_config, load_checked


def cmd_validate(args) -> int:
    from tensile_tf.config.schema import ConfigError

    if is_search_config(args.config):
        from tensile_tf.search.config import load_search_config

        from tensile_tf.config.schema import read_yaml
        from tensile_tf.config.validation import check_search, raise_problems

        try:
            scfg = load_search_config(args.config)
            marks = read_yaml(args.config)[1]
            raise_problems(check_search(scfg, references=False), source=args.config, marks=marks)
            install_runtime(None)
            raise_problems(check_search(scfg), source=args.config, marks=marks)
        except ConfigError as e:
            raise UserError(str(e)) from None
        s = scfg.search
        print(f"{args.config}: valid search: pool {scfg.pool} bytes, study {s.study_name!r}, "
              f"{s.sampler.name.value} sampler, {len(s.space)} parameters "
              f"({', '.join(s.space)}), n_trials {s.total_trials}")
        return 0
    cfg, marks = load_checked(args.config)
    check_references(cfg, args.config, marks, install_pool=False)
    if getattr(args, "data", False):
        _read_every_example(cfg)
    print(f"{args.config}: valid: pool {cfg.pool} bytes, {len(cfg.jobs)} jobs "
          f"({_names(j.name for j in cfg.jobs)}); every reference resolves and every size fits")
    return 0


def _read_every_example(cfg) -> None:
    """``--data``: every job's examples read as a run reads them (every image decoded, every array
    loaded and checked against the job), so a corrupt file is named before anything trains."""
    from tensile_tf.config.schema import FILE_KINDS
    from tensile_tf.jobs.datasets import DataError, load_examples, load_validation_examples

    problems = []
    for spec in cfg.jobs:
        if spec.data.kind not in FILE_KINDS:
            continue
        try:
            load_examples(spec)
            if spec.data.validation_path:
                load_validation_examples(spec)
        except DataError as e:
            problems.append(str(e))
    if problems:
        raise UserError("the data does not read:\n  " + "\n  ".join(problems))


def _names(names, shown: int = 6) -> str:
    """The job names, the first few and the last where there are many (a 50,000-job config)."""
    names = list(names)
    if len(names) <= shown:
        return ", ".join(names)
    return ", ".join(names[:shown - 1]) + f", ... {len(names) - shown} more ..., {names[-1]}"
