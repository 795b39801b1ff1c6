#!/usr/bin/env python
"""Preview the learning-rate and weight-decay schedules of a run without building a model.

    python tools/preview_schedule.py [the training flags] --output-json F [--output-png F]

writes ``{"iteration": [0..train_iters], "consumed_samples": [...], "lr": [...],
"weight_decay": [...]}``: ``lr[i]``/``weight_decay[i]`` are the values of the optimizer step taken
after ``i`` completed iterations (the values the scheduler gives; lr_mult/wd_mult = 1). With
``--data-blend-config`` or ``--train-weighted-split-paths`` it adds ``"mixture"`` and
``"target_mixture"`` (``{dataset: [...]}``, one entry per step, or per
``"mixture_iterations_per_point"`` steps on a run of millions of steps over thousands of datasets:
``mixture[d][i]`` is the fraction
of the global batch of the step taken after ``i`` completed iterations that the built index draws
from ``d``; ``target_mixture`` is what the weights ask) and ``"epochs"`` (``{dataset: epochs}``),
warning about datasets repeated past ``--warn-epochs``.

With ``--load CKPT`` the mixture is that of a resume from that checkpoint with these flags: the
iterations before the checkpoint's as the run really drew them (its data ledger's history, across
earlier edits), the rest as the resume would draw them (an edited mix needs
``--override-data-mix``, as in training); ``"resume_iteration"`` says where the two meet,
``"mix_changes"`` lists the iterations where the mix was edited (the new mix's among them),
``"epochs"`` counts every dataset the run has drawn by its end, and for a run with an adaptive
mixer ``"mixer_updates"`` lists its updates so far (``{"iteration", "policy", "begin",
"weights": {dataset: weight}, "losses": {...}}``, also printed one line each; ``target_mixture``
holds the same weights per iteration).

With a sequence-length curriculum (``--seq-length-schedule``, the ``seq_length_schedule`` key of
``--lr-schedule-config``, or the ``curriculum_learning`` / ``data_efficiency`` section of
``--deepspeed_config``: megatron/config/seqlen_flags.py) it adds ``"seq_length"`` (``k[i]``, the
tokens per sample of the step taken after ``i`` completed iterations, indexed as ``lr``; the last
entry, after the run's last step, is the plan's last length, as iterations past a plan train),
``"consumed_tokens"`` (tokens trained before each step, from the batch schedule: under
``truncate`` the sum of global batch x k over the steps before, under ``split`` samples x
``--seq-length``; indexed as ``consumed_samples``, so the last entry is the run's total) and
``"seq_length_savings"`` (:func:`seq_length_savings`: what the curriculum saves against training
every step at the full ``--seq-length``), also printed. Without a curriculum the preview is what
it was (none of these keys).
Everything is vectorised, so 1e6 iterations take about a second.

Structure for extensions: :func:`preview` returns the dict (more keys may be added by other
functions, e.g. ``mixture``), and :func:`plot_preview` draws one panel per entry of
:data:`PANELS` whose key is present.
"""
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.path.pardir)))

from megatron.runtime.known_warnings import quiet_known_warnings  # noqa: E402

quiet_known_warnings()  # before megatron.core is imported

import json  # noqa: E402
import time  # noqa: E402
from typing import Callable, Dict, List, Optional, Tuple  # noqa: E402

import numpy as np  # noqa: E402

from megatron.config.arguments import validate_args  # noqa: E402
from megatron.config.batch_flags import batch_schedule_from_args  # noqa: E402
from megatron.config.parser import get_parser  # noqa: E402
from megatron.config.tokenizer_flags import tokenizer_setup_from_args  # noqa: E402
from megatron.errors import ArgumentError, ConfigError  # noqa: E402
from megatron.schedules.units import batch_schedule, train_iterations  # noqa: E402
from megatron.utils.atomic_io import atomic_write_text  # noqa: E402


def add_preview_args(parser):
    g = parser.add_argument_group("schedule preview")
    g.add_argument("--output-json", default=None, help="Write the schedule values here.")
    g.add_argument("--output-png", default=None, help="Plot LR and WD against iterations here.")
    g.add_argument("--warn-epochs", type=float, default=1.0,
                   help="Warn when the curriculum would draw a dataset for more than this many "
                        "epochs.")
    g.add_argument("--world-size", type=int, default=1,
                   help="Number of ranks the run would use (for batch-size validation).")
    # The training command's DeepSpeed flags are accepted (the JSON is checked against the batch
    # flags) without importing DeepSpeed, which would dominate the tool's run time.
    g.add_argument("--deepspeed", action="store_true", help="Accepted and ignored.")
    g.add_argument("--deepspeed_config", default=None, help="Checked against the batch flags.")
    return parser


def parse_preview_args(argv: Optional[List[str]] = None):
    parser = get_parser(add_preview_args, deepspeed_args=False)
    args = parser.parse_args(argv)
    try:
        return validate_args(args, world_size=args.world_size, require_data=False)
    except ArgumentError as e:
        parser.error(str(e))


class _NoOptimizer:
    param_groups: list = []


def schedule_arrays(args) -> Dict[str, np.ndarray]:
    """``iteration``, ``consumed_samples``, ``lr``, ``weight_decay`` arrays for the run in ``args``
    (the values :class:`OptimizerParamScheduler` gives, computed vectorised)."""
    from megatron.optim import learning_rates as lrs  # lazy: it imports logging (~10 ms); not --help
    config = args.run_config.schedule
    bs = batch_schedule(config.batch)
    train_iters = train_iterations(config.train_iters, config.train_samples, bs)
    iterations = np.arange(train_iters + 1, dtype=np.int64)
    samples = bs.samples_at_iterations(iterations)
    scheduler = lrs.OptimizerParamScheduler(_NoOptimizer(), lrs.scheduler_params(config, bs),
                                            lrs.schedule_context(config, bs))
    lr, wd = scheduler.values_at(iterations, samples)
    return {"iteration": iterations, "consumed_samples": samples, "lr": lr, "weight_decay": wd}


def training_blend(args):
    """The training :class:`SplitBlend` of ``--data-blend-config``,
    ``--train-weighted-split-paths`` or ``--data-path``/``--train-data-path`` (None without
    training data)."""
    if args.data_blend is not None and args.data_blend.train is not None:
        return args.data_blend.train
    groups = args.weighted_split_groups.get("train") or []
    if groups:
        return groups[0].to_split_blend("--train-weighted-split-paths")
    if args.data_path or args.train_data_path:
        from megatron.data.builder import data_path_blends  # lazy: megatron-core, only for --data-path

        return data_path_blends(args.run_config.data)["train"]
    return None


def mixture_arrays(args, train_iters: int) -> Optional[dict]:
    """``mixture`` (what the built curriculum index draws: fraction of each step's global batch,
    one entry per step, i.e. ``train_iters`` entries), ``target_mixture`` (what the weights ask,
    at each step's first sample) and ``epochs`` (epochs drawn per dataset), from the same index
    the training run builds (same seed and cache). None when the run has no blend to preview."""
    blend = training_blend(args)
    if blend is None:
        return None
    from megatron.data.builder import train_valid_test_num_samples  # lazy: megatron-core, only for a mixture
    from megatron.data.curriculum.constituents import resolve_constituents  # lazy: PyYAML, only for a mixture
    from megatron.data.curriculum.index import CurriculumIndex  # lazy: hashlib & co, only for a mixture

    index = CurriculumIndex(blend, resolve_constituents(blend, args.seq_length,
                                                       packing=args.run_config.data.pack_documents),
                            train_valid_test_num_samples(args.run_config.data)[0],
                            batch_schedule_from_args(args),
                            seed=args.seed, cache_dir=args.data_cache_path,
                            order=args.data_index_order)
    per_point = mixture_iterations_per_point(train_iters, len(index.names))
    mixture = index.iteration_mixture(train_iters, per_point)
    target = index.target_iteration_mixture(train_iters, per_point)
    out = {"mixture": {name: mixture[d] for d, name in enumerate(index.names)},
           "target_mixture": {name: target[d] for d, name in enumerate(index.names)},
           "epochs": dict(index.epochs)}
    if per_point > 1:
        out["mixture_iterations_per_point"] = per_point
    return out


MIXTURE_CELLS = 1 << 22  # the most numbers a preview's mixture holds (per kind: drawn, target)


def mixture_iterations_per_point(train_iters: int, num_datasets: int) -> int:
    """Iterations per point of the preview's mixture: 1 (every iteration) while iterations x
    datasets is at most :data:`MIXTURE_CELLS`, else the fewest that keep it there (a run of 1e6
    iterations over 1,024 datasets: 245)."""
    return max(1, -(-int(train_iters) * max(int(num_datasets), 1) // MIXTURE_CELLS))


def resumed_mixture_arrays(args, train_iters: int) -> dict:
    """The mixture of a run resumed from ``--load`` with these flags: before the checkpoint's
    iteration, what the run drew (its data ledger's phases, rebuilt); from it on, what the resume
    would draw (an edited mix needs ``--override-data-mix``, as in training). Adds
    ``resume_iteration`` and ``epochs`` (each dataset's epochs drawn by the end of the run, those
    of datasets no longer drawn included)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from data_provenance import training_mix_of

    mix = training_mix_of(args)
    history = mix.history()
    at_end = mix.ledger(len(mix.dataset))  # every dataset the run draws, by its ledger name
    names: Dict[tuple, str] = {entry.key: entry.name for entry in at_end}
    per_point = mixture_iterations_per_point(train_iters, len(names))
    points = -(-train_iters // per_point)
    mixture = {name: np.zeros(points) for name in names.values()}
    target = {name: np.zeros(points) for name in names.values()}
    for p, phase in enumerate(mix.phases):
        dataset = history.dataset(p, with_sources=False)
        stop = mix.phases[p + 1].begin_iteration if p + 1 < len(mix.phases) else train_iters
        lo, hi = phase.begin_iteration // per_point, -(-stop // per_point)  # a point per_point wide
        drawn = dataset.index.iteration_mixture(train_iters, per_point)
        wanted = dataset.index.target_iteration_mixture(train_iters, per_point)
        for d, c in enumerate(dataset.constituents):
            name = names.get(c.ledger_key, c.name)
            mixture.setdefault(name, np.zeros(points))
            target.setdefault(name, np.zeros(points))
            mixture[name][lo:hi] = drawn[d][lo:hi]
            target[name][lo:hi] = wanted[d][lo:hi]
    epochs = {e.name: e.drawn / e.samples_per_epoch for e in at_end if e.samples_per_epoch}
    out = {"mixture": mixture, "target_mixture": target, "epochs": epochs,
           "resume_iteration": _checkpoint_iteration(args),
           "mix_changes": [phase.begin_iteration for phase in mix.phases[1:]]}
    from megatron.data.mixture_export import mixer_updates  # lazy: with --load only

    updates = mixer_updates(mix.phases)
    if updates:  # the adaptive mixer's learned weights so far (target_mixture holds them too)
        out["mixer_updates"] = updates
    if per_point > 1:
        out["mixture_iterations_per_point"] = per_point
    return out


def _checkpoint_iteration(args) -> int:
    from megatron.checkpoint.format import read_tracker  # lazy: torch (~1 s), only with --load

    return int(read_tracker(args.load) or 0)


def warn_repeated(epochs: Dict[str, float], threshold: float) -> List[str]:
    """Warnings for datasets drawn for more than ``threshold`` epochs."""
    return [f"warning: dataset {name} would be repeated {e:.2f} epochs (> --warn-epochs "
            f"{threshold:g}); its samples repeat with a fresh shuffle per epoch"
            for name, e in epochs.items() if e > threshold]


def run_mixture_arrays(args, train_iters: int) -> Optional[dict]:
    """The mixture keys of the preview: of a resumed run with ``--load`` (its history from the
    data ledger), else of the flags' blend (None without one)."""
    if args.load:
        return resumed_mixture_arrays(args, train_iters)
    return mixture_arrays(args, train_iters)


def seq_length_arrays(args, iterations: np.ndarray) -> Optional[dict]:
    """``seq_length`` (k of the step after ``i`` completed iterations, for every ``i`` in
    ``iterations``; past the plan its last length) and ``consumed_tokens`` (tokens trained before
    that step: :meth:`BatchSchedule.tokens_at_iterations`) under the run's sequence-length
    curriculum, and ``seq_length_savings`` (:func:`seq_length_savings`). None without one."""
    plan = getattr(args, "seq_length_plan", None)
    if plan is None:
        return None
    bs = batch_schedule_from_args(args)
    lengths = plan.lengths_at(iterations)
    # integer sums of batch x k: exact in float64 below 2**53 tokens
    tokens = np.rint(bs.tokens_at_iterations(iterations)).astype(np.int64)
    samples = bs.samples_at_iterations(iterations)
    return {"seq_length": lengths, "consumed_tokens": tokens,
            "seq_length_savings": seq_length_savings(args, np.diff(samples), lengths[:-1])}


def matmul_params_per_token(args, vocab_size: Optional[int]) -> int:
    """N of the dense FLOPs 6 N per trained token: the weights of the matrix multiplications one
    token goes through, from the model flags. Per layer: attention ``h (q + 2 kv) + q h`` (q =
    heads x kv channels, kv = query groups x kv channels), the MLP ``(1 + glu) h f + f h`` (glu: 1
    with ``--swiglu``), on an MoE layer instead the router ``h E`` and top-k experts of
    ``--moe-ffn-hidden-size`` plus the shared expert; then the output layer ``V h`` (``vocab_size``
    V, padded; left out when None). Embedding lookups, norms and biases are not multiplications."""
    h, layers = args.hidden_size, args.num_layers
    q = args.num_attention_heads * args.kv_channels
    kv = args.num_query_groups * args.kv_channels
    glu = 2 if args.swiglu else 1

    def mlp(f):
        return glu * h * f + f * h

    attention = h * (q + 2 * kv) + q * h
    experts = getattr(args, "num_experts", None)
    if experts:
        freq = args.moe_layer_freq
        pattern = ([1 if i % freq == 0 else 0 for i in range(layers)] if isinstance(freq, int)
                   else list(freq))
        shared = args.moe_shared_expert_intermediate_size
        moe = h * experts + args.moe_router_topk * mlp(args.moe_ffn_hidden_size) + (
            mlp(shared) if shared else 0)
        n_moe = sum(1 for x in pattern if x)
    else:
        moe, n_moe = 0, 0
    return (layers * attention + (layers - n_moe) * mlp(args.ffn_hidden_size) + n_moe * moe
            + (vocab_size or 0) * h)


def _padded_vocab_size(args) -> Optional[int]:
    """The embedding rows the run's tokenizer gives (None, with a warning, when the tokenizer
    cannot be built here: its files are elsewhere)."""
    try:
        return int(tokenizer_setup_from_args(args).padded_vocab_size)
    except (ConfigError, OSError) as e:
        print(f"warning: seq_length_savings: the tokenizer cannot be built ({e}); the output "
              "layer's V x h is left out of the model's parameters", file=sys.stderr)
        return None


def seq_length_savings(args, batches: np.ndarray, lengths: np.ndarray) -> dict:
    """What the curriculum saves against the same steps at the full ``--seq-length`` S, for a run
    whose step ``i`` has global batch ``batches[i]`` and length ``lengths[i]`` = k:

    * ``tokens``: tokens trained, ``sum(batch x t)`` with t = k under ``truncate`` (each sample
      keeps k tokens) and t = S under ``split`` (each sample is cut into S / k samples: no token is
      dropped); ``full_length_tokens``: ``sum(batch x S)``; ``tokens_saved_fraction``: ``1 -
      tokens / full_length_tokens`` (0 under ``split``).
    * ``estimated_time_saved_fraction``: ``1 - cost / full-length cost`` under this model: a step's
      time is proportional to its FLOPs (the same throughput at every k; short sequences often run
      at a lower one, so real savings are smaller), and a token trained in a sequence of k tokens
      costs Megatron's FLOPs per token (Narayanan et al. 2021, ``72 l h^2 (1 + s / 6h + V / 12lh)``
      per token): ``6 N`` for the dense part (N: :func:`matmul_params_per_token`, ``12 l h^2 + V h``
      for the plain GPT) plus ``12 l q k`` for attention (QK^T and the weighted sum over k keys,
      forward and backward, the whole k x k matrix as Megatron counts it; q = heads x kv channels,
      ``--hidden-size`` by default). So a step costs ``batch x t x (1 + k / C)`` with the attention
      constant ``C = 6 N / (12 l q) = N / (2 l q)`` tokens (``attention_constant``, with
      ``model_params`` N and ``vocab_size`` V, None when the tokenizer cannot be built). Full
      recomputation multiplies both parts by 4/3 and changes no fraction. Under ``split`` tokens
      are not saved but attention is (shorter sequences).
    """
    plan = args.seq_length_plan
    full = int(plan.full_length)
    b = np.asarray(batches, dtype=np.float64)
    k = np.asarray(lengths, dtype=np.float64)
    per_sample = k if plan.truncates else np.full_like(k, full)
    tokens = int(np.rint(np.sum(b * per_sample)))
    full_tokens = int(np.sum(np.asarray(batches, dtype=np.int64)) * full)
    vocab = _padded_vocab_size(args)
    n = matmul_params_per_token(args, vocab)
    c = n / (2.0 * args.num_layers * args.num_attention_heads * args.kv_channels)
    cost = float(np.sum(b * per_sample * (1.0 + k / c)))
    full_cost = float(full_tokens) * (1.0 + full / c)
    return {"tokens": tokens, "full_length_tokens": full_tokens,
            "tokens_saved_fraction": 1.0 - tokens / full_tokens if full_tokens else 0.0,
            "estimated_time_saved_fraction": 1.0 - cost / full_cost if full_cost else 0.0,
            "model_params": int(n), "vocab_size": vocab, "attention_constant": c}


def describe_savings(savings: dict, mode: str) -> str:
    """The savings summary as one line."""
    return (f"sequence-length curriculum (mode {mode}): {savings['tokens']:,} tokens trained of "
            f"{savings['full_length_tokens']:,} at the full --seq-length "
            f"({100 * savings['tokens_saved_fraction']:.1f}% saved); estimated time saved "
            f"{100 * savings['estimated_time_saved_fraction']:.1f}% (a step costs tokens x (1 + k / "
            f"{savings['attention_constant']:.0f}): 6 N FLOPs per token with N = "
            f"{savings['model_params']:,} plus 12 x layers x heads x kv-channels x k for attention)")


def _preview_arrays(args) -> dict:
    """The preview's arrays: schedule lists, the sequence-length keys when the run has a
    sequence-length curriculum, and the mixture keys when it has a curriculum blend."""
    arrays = schedule_arrays(args)
    seqlen = seq_length_arrays(args, arrays["iteration"])
    if seqlen is not None:
        arrays.update(seqlen)
    mixture = run_mixture_arrays(args, len(arrays["iteration"]) - 1)
    if mixture is not None:
        arrays.update(mixture)
    return arrays


def preview(args) -> dict:
    """The preview (:func:`_preview_arrays`) as a JSON-ready dict."""
    return json.loads(_json_value(_preview_arrays(args)))


def _plot_lr(ax, data):
    ax.plot(data["iteration"], data["lr"], color="tab:blue")
    ax.set_ylabel("learning rate")


def _plot_wd(ax, data):
    ax.plot(data["iteration"], data["weight_decay"], color="tab:orange")
    ax.set_ylabel("weight decay")


def _plot_mixture(ax, data):
    length = len(next(iter(data["mixture"].values())))
    per_point = int(data.get("mixture_iterations_per_point", 1))
    steps = np.arange(length) * per_point if per_point > 1 else np.asarray(data["iteration"])[:length]
    for k, (name, values) in enumerate(data["mixture"].items()):
        color = f"C{k % 10}"
        ax.plot(steps, values, color=color, label=f"{name} (drawn)")
        target = data.get("target_mixture", {}).get(name)
        if target is not None:
            ax.plot(steps, target, color=color, linestyle="--", linewidth=0.8)
    if "resume_iteration" in data:  # --load: the ledger's history before, the resume after
        for at in data.get("mix_changes", []):
            ax.axvline(at, color="grey", linestyle="--", linewidth=0.8)
            ax.annotate(" mix edited", (at, 0.9), fontsize=7, va="top", color="grey")
        ax.axvline(data["resume_iteration"], color="k", linestyle=":", linewidth=1)
        ax.annotate(" resume", (data["resume_iteration"], 1.0), fontsize=7, va="top")
    ax.set_ylabel("batch fraction")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7, loc="upper right", title="dashed: target", title_fontsize=7)


def _plot_seq_length(ax, data):
    ax.step(data["iteration"], data["seq_length"], where="post", color="tab:green")
    ax.set_ylabel("seq length (tokens)")
    ax.set_ylim(bottom=0)
    savings = data.get("seq_length_savings")
    if savings:
        ax.annotate(f"tokens saved {100 * savings['tokens_saved_fraction']:.1f}%, est. time saved "
                    f"{100 * savings['estimated_time_saved_fraction']:.1f}%", (0.99, 0.05),
                    xycoords="axes fraction", ha="right", fontsize=7)


PANELS: List[Tuple[str, Callable]] = [("lr", _plot_lr), ("weight_decay", _plot_wd),
                                      ("seq_length", _plot_seq_length), ("mixture", _plot_mixture)]
"""(key, draw(ax, data)): a panel is drawn when ``key`` is in the preview dict."""


def _thin(value, keep: np.ndarray):
    """Every array in ``value`` (or in its dict values) sampled at ``keep`` (clipped to length)."""
    if isinstance(value, dict):
        return {k: _thin(v, keep) for k, v in value.items()}
    if isinstance(value, (list, np.ndarray)) and len(value) > 1:
        arr = np.asarray(value)
        return arr[np.unique(np.minimum(keep, len(arr) - 1))]
    return value


def plot_preview(data: dict, path: str, title: Optional[str] = None) -> None:
    """One panel per :data:`PANELS` entry present in ``data`` (LR, WD, sequence length, data
    mixture), against iterations, written as a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [(key, draw) for key, draw in PANELS if key in data]
    n = len(data["iteration"])
    if n > 20000:  # plotting a million points is slow and looks the same
        keep = np.unique(np.linspace(0, n - 1, 20000).astype(np.int64))
        data = {k: _thin(v, keep) for k, v in data.items()}
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.6 * len(panels)), sharex=True,
                             squeeze=False)
    for ax, (_, draw) in zip(axes[:, 0], panels, strict=True):
        draw(ax, data)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("iteration")
    if title:
        axes[0, 0].set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _json_array(values: np.ndarray, key: str = "") -> str:
    """JSON text of a 1-D array; floats use repr (exact round trip), each distinct value once.
    A non-finite value (``inf``/``nan`` are not JSON) raises ``ValueError`` naming ``key``."""
    if values.dtype.kind in "iu":
        return json.dumps(values.tolist())
    finite = np.isfinite(values)
    if not finite.all():
        i = int(np.flatnonzero(~finite)[0])
        raise ValueError(f"preview {key!r}[{i}] is {float(values[i])!r}, which JSON cannot hold")
    unique, inverse = np.unique(values, return_inverse=True)
    if len(unique) * 2 < len(values):
        text = np.asarray(list(map(repr, unique.tolist())), dtype=object)[inverse]
        return "[" + ", ".join(text.tolist()) + "]"
    return "[" + ", ".join(map(repr, values.tolist())) + "]"


def _json_value(value, key: str = "") -> str:
    """Strict JSON text of ``value`` (no ``Infinity``/``NaN``: ``ValueError`` naming the key)."""
    if isinstance(value, np.ndarray) and value.ndim == 1:
        return _json_array(value, key)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_json_value(v, f'{key}.{k}' if key else str(k))}"
                               for k, v in value.items()) + "}"
    try:
        return json.dumps(value.tolist() if isinstance(value, np.ndarray) else value, allow_nan=False)
    except ValueError:
        raise ValueError(f"preview {key!r} holds {value!r}, which JSON cannot hold") from None


def _write_json(data: dict, path: str) -> None:
    """Like ``json.dump(data)`` but about twice as fast for long numeric arrays; written to a
    temporary name and renamed, so a reader never sees half a file."""
    atomic_write_text(path, _json_value(data) + "\n")


def main(argv: Optional[List[str]] = None) -> dict:
    start = time.perf_counter()
    args = parse_preview_args(argv)
    arrays = _preview_arrays(args)
    if "seq_length_savings" in arrays:
        print(describe_savings(arrays["seq_length_savings"], args.seq_length_plan.mode),
              file=sys.stderr)
    for update in arrays.get("mixer_updates", ()):  # --load of an adaptive run: its weights so far
        print(f"mixer {update['policy']} at iteration {update['iteration']}: " + ", ".join(
            f"{name} {w:.4f}" for name, w in update["weights"].items()), file=sys.stderr)
    if "epochs" in arrays:  # the mixture's
        for warning in warn_repeated(arrays["epochs"], args.warn_epochs):
            print(warning, file=sys.stderr)
    if args.output_json:
        _write_json(arrays, args.output_json)
    if args.output_png:
        data = {k: v for k, v in arrays.items()}
        plot_preview(data, args.output_png, title=f"--lr-decay-style {args.lr_decay_style}"
                     if not args.lr_schedule_config else f"--lr-schedule-config {args.lr_schedule_config}")
    print(f"schedule preview: {len(arrays['iteration']) - 1} iterations in "
          f"{time.perf_counter() - start:.2f} s", file=sys.stderr)
    return arrays


if __name__ == "__main__":
    from megatron.runtime.process_exit import run_entry_point

    # a bad blend or schedule file (ConfigError): one "error: ..." line and exit status 1, as the
    # training entry points; bad flags still exit 2 with argparse's usage line
    run_entry_point(main)
