"""The sequence-length curriculum's flags (``--seq-length-schedule``,
``--data-efficiency-curriculum-learning``) and its check: the one place that reads its three
spellings and makes the run's :class:`~megatron.schedules.seqlen_plan.SeqLengthPlan`
(``args.seq_length_plan``; docs/seqlen_curriculum.md).

Spellings, at most one per run:

* ``--seq-length-schedule '{type: linear, from: 64, span: 1000, multiple_of: 64}'`` or the
  ``seq_length_schedule`` key of the ``--lr-schedule-config`` file (native);
* DeepSpeed's legacy top-level ``"curriculum_learning"`` section of ``--deepspeed_config``
  (Microsoft Megatron-DeepSpeed's ``curriculum_learning_legacy``), taken out of the config
  DeepSpeed sees (DeepSpeed 0.19.8 refuses it);
* ``--data-efficiency-curriculum-learning`` with the JSON's
  ``data_efficiency.data_sampling.curriculum_learning.curriculum_metrics`` holding
  ``seqlen_truncate`` (mode truncate) or ``seqlen_reshape`` (mode split); the section is taken out
  of DeepSpeed's config too.
"""
from typing import Any, Dict, List, Optional, Tuple

from megatron.config.batch_flags import batch_schedule_from_args, train_iterations_from_args
from megatron.errors import ArgumentError, ConfigError
from megatron.schedules.base import ScheduleContext, ScheduleError, build_schedule, get_schedule_class, known_kinds
from megatron.schedules.seqlen import (
    SeqLengthSpec,
    describe_plan,
    seq_length_plan,
    seq_length_spec,
    seq_length_spec_from_deepspeed,
)

SEQLEN_METRICS = {"seqlen_truncate": "truncate", "seqlen_reshape": "split"}


def add_seqlen_args(parser) -> None:
    """``--seq-length-schedule`` and ``--data-efficiency-curriculum-learning``."""
    g = parser.add_argument_group("sequence-length curriculum (docs/seqlen_curriculum.md)")
    g.add_argument("--seq-length-schedule", default=None, metavar="SCHEDULE",
                   help="Train on shorter sequences first: a schedule (YAML/JSON mapping, any "
                        "registered kind, in iterations, samples or tokens) of the tokens per "
                        "sample each iteration trains, with 'mode' (truncate: keep each sample's "
                        "first k tokens; split: cut each sample into --seq-length/k samples) and "
                        "'multiple_of' (round down to it), e.g. '{type: linear, from: 64, span: "
                        "1000, multiple_of: 64}' ('to' defaults to --seq-length). Evaluation runs "
                        "at --seq-length. Also the seq_length_schedule key of "
                        "--lr-schedule-config's file.")
    g.add_argument("--data-efficiency-curriculum-learning", action="store_true",
                   help="Microsoft Megatron-DeepSpeed: train the sequence-length curriculum of "
                        "the --deepspeed_config's data_efficiency.data_sampling."
                        "curriculum_learning section (metric seqlen_truncate or seqlen_reshape).")


# ------------------------------------------------------------------ the spellings
def _parse_inline(text: str) -> Any:
    import yaml  # lazy: only runs that give the flag parse YAML

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ArgumentError(f"--seq-length-schedule {text!r}: cannot parse ({e})") from None


def _with_full_length(spec: SeqLengthSpec, seq_length: int) -> SeqLengthSpec:
    """A native mapping of a kind with a ``to`` key (the registry's) and no ``to`` ends at
    ``--seq-length``."""
    schedule = spec.schedule
    if isinstance(schedule, dict) and "to" not in schedule and schedule.get("type") in known_kinds() \
            and "to" in get_schedule_class(schedule["type"]).keys:
        return SeqLengthSpec({**schedule, "to": seq_length}, spec.mode, spec.multiple_of, spec.source)
    return spec


def _native_specs(args) -> List[SeqLengthSpec]:
    specs = []
    if args.seq_length_schedule is not None:
        specs.append(seq_length_spec(_parse_inline(args.seq_length_schedule), "--seq-length-schedule"))
    config = args.lr_schedule_config_dict  # read by the "schedule file" check
    if config is not None and "seq_length_schedule" in config:
        specs.append(seq_length_spec(config["seq_length_schedule"],
                                     f"--lr-schedule-config {args.lr_schedule_config}: "
                                     "seq_length_schedule"))
    return [_with_full_length(spec, args.seq_length) for spec in specs]


def take_legacy_section(config: Dict[str, Any], path: str, notes: List[str]) -> Optional[SeqLengthSpec]:
    """The native spelling of the ``--deepspeed_config`` file ``path``'s legacy top-level
    ``curriculum_learning`` section (None when absent or ``enabled: false``), removed from
    ``config`` (DeepSpeed 0.19.8 refuses the section) with a start-up line in ``notes``."""
    section = config.pop("curriculum_learning", None)
    if section is None:
        return None
    where = f"--deepspeed_config {path}: curriculum_learning"
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: expected an object, got {type(section).__name__}")
    if not section.get("enabled", False):
        notes.append(f"{where} is disabled (enabled: false) and left out of the DeepSpeed config "
                     "(DeepSpeed 0.19.8 refuses the section)")
        return None
    spec = seq_length_spec_from_deepspeed(section, where)
    notes.append(f"{where} ({section['schedule_type']}, {section['min_difficulty']} to "
                 f"{section['max_difficulty']} tokens): trained here as the native schedule "
                 f"{spec.to_dict()} and left out of the config DeepSpeed sees (DeepSpeed 0.19.8 "
                 "refuses the legacy section)")
    return spec


def take_data_efficiency_section(config: Dict[str, Any], path: str, notes: List[str]) -> SeqLengthSpec:
    """The native spelling of ``--data-efficiency-curriculum-learning``: the sequence-length
    metric of the ``--deepspeed_config`` file ``path``'s
    ``data_efficiency.data_sampling.curriculum_learning`` section. The ``data_efficiency`` section
    is removed from ``config`` (this project trains the curriculum and samples the data itself).
    Metrics other than ``seqlen_truncate``/``seqlen_reshape`` need DeepSpeed's offline data
    analysis and are refused naming them."""
    where = f"--deepspeed_config {path}: data_efficiency"
    section = config.get("data_efficiency")
    curriculum = (((section or {}).get("data_sampling") or {}).get("curriculum_learning") or {})
    metrics = curriculum.get("curriculum_metrics") if isinstance(curriculum, dict) else None
    if not isinstance(metrics, dict) or not metrics or not curriculum.get("enabled", False):
        raise ConfigError(f"--data-efficiency-curriculum-learning needs an enabled {where}."
                          "data_sampling.curriculum_learning section with curriculum_metrics in "
                          "--deepspeed_config; found none")
    others = sorted(set(metrics) - set(SEQLEN_METRICS))
    if others:
        raise ConfigError(f"{where}.data_sampling.curriculum_learning.curriculum_metrics: "
                          f"metric {others[0]!r} needs DeepSpeed's offline data-analysis index "
                          "files, which are not built here; the metrics trained here are "
                          f"{', '.join(SEQLEN_METRICS)}")
    if len(metrics) > 1:
        raise ConfigError(f"{where}: curriculum_metrics has both {', '.join(sorted(metrics))}; "
                          "give one sequence-length metric")
    (name, metric), = metrics.items()
    metric_where = f"{where}.data_sampling.curriculum_learning.curriculum_metrics.{name}"
    for key, allowed in (("difficulty_type", "value"), ("clustering_type", "single_cluster")):
        if metric.get(key, allowed) != allowed:
            raise ConfigError(f"{metric_where}: {key} {metric[key]!r}; a sequence-length metric "
                              f"takes {allowed!r}")
    spec = seq_length_spec_from_deepspeed({"curriculum_type": "seqlen", **metric}, metric_where,
                                          mode=SEQLEN_METRICS[name])
    del config["data_efficiency"]
    notes.append(f"{metric_where} ({metric['schedule_type']}, {metric['min_difficulty']} to "
                 f"{metric['max_difficulty']} tokens, mode {spec.mode}): trained here as the "
                 f"native schedule {spec.to_dict()}; the data_efficiency section is left out of "
                 "the config DeepSpeed sees")
    return spec


# ------------------------------------------------------------------ the check
def layout_rules(args) -> List[Tuple[int, str]]:
    """``(divisor, why)``: what the parallel layout asks of every trained length."""
    rules = []
    tp, sp = args.tensor_model_parallel_size, args.ds_sequence_parallel_size
    if sp > 1:
        rules.append((sp, f"DeepSpeed-Ulysses splits each sequence over --ds-sequence-parallel-size "
                          f"{sp}"))
    if args.sequence_parallel and tp > 1:
        rules.append((tp * sp, f"--sequence-parallel splits each rank's sequence over "
                               f"--tensor-model-parallel-size {tp}"))
    return rules


def _depends_on_run_length(spec: SeqLengthSpec) -> bool:
    try:
        build_schedule(spec.schedule, ScheduleContext(None, {}))
    except ScheduleError:
        return True
    return False


def validate_seq_length_curriculum(args, notes: List[str]) -> None:
    """``args.seq_length_plan``: the run's sequence-length plan from whichever spelling the
    flags give (None without one), checked against ``--seq-length`` and the layout
    (:func:`layout_rules`); the DeepSpeed sections it reads leave ``args.deepspeed_config_dict``.
    ArgumentError names the flag or key, the value and the rule."""
    args.seq_length_plan = None
    try:
        specs = _native_specs(args)
        config, path = args.deepspeed_config_dict, args.deepspeed_config
        if config is not None:
            legacy = take_legacy_section(config, path, notes)
            specs += [legacy] if legacy is not None else []
        if args.data_efficiency_curriculum_learning:
            if config is None:
                raise ConfigError("--data-efficiency-curriculum-learning needs --deepspeed_config "
                                  "with a data_efficiency.data_sampling.curriculum_learning section")
            specs.append(take_data_efficiency_section(config, path, notes))
        if len(specs) > 1:
            raise ConfigError(f"two sequence-length curricula: {specs[0].source} and "
                              f"{specs[1].source}; give one")
        if not specs:
            return
        spec = specs[0]
        if args.train_tokens is not None and _depends_on_run_length(spec):
            raise ConfigError(f"{spec.source}: with --train-tokens the run's length depends on the "
                              "curriculum; give the schedule an explicit 'span'")
        bs = batch_schedule_from_args(args)  # args.seq_length_plan is None: no plan yet
        plan = seq_length_plan(spec, bs, train_iterations_from_args(args, bs), args.seq_length,
                               layout_rules(args))
    except ConfigError as e:
        raise ArgumentError(str(e)) from None
    args.seq_length_plan = plan
    notes.append(describe_plan(plan))
