"""Flags of other projects' launch scripts that this project takes under another name, accepts
without effect, or refuses: one table, as data.

The families are BigScience's Megatron-DeepSpeed fork (``bigscience``), NVIDIA Megatron-LM
(``megatron-lm``) and Microsoft Megatron-DeepSpeed (``microsoft``). Flags those scripts use that are
implemented here under the same name with the same meaning are simply flags of the parser
(:func:`megatron.config.parser.get_parser`); this module lists the others, and the parser registers
each of them from here (megatron/config/compat_flags.py), so the table and the parser cannot drift
apart.

Data structure (what ``docs/compatibility.md`` is generated from):

* :data:`COMPAT_FLAGS` — a tuple of :class:`CompatFlag`, one per flag, with

  - ``flag``: the option string as the scripts write it, e.g. ``"--num-key-value-heads"``;
  - ``status``: ``"alias"`` (same meaning as ``use_instead``, which the parser fills in its
    place), ``"inert"`` (accepted; no effect on results here; rank 0 lists the ones given in one
    start-up line) or ``"refused"`` (the run fails with one line naming the flag and
    ``use_instead``);
  - ``use_instead``: for an alias the canonical flag, with its value when the alias stands for a
    flag-and-value (``"--position-embedding-type rope"``); for a refused flag what to use instead
    (``""`` when nothing here does it: the error then says to drop the flag); ``""`` for an inert
    flag;
  - ``families``: which of :data:`FAMILIES` use it;
  - ``takes_value``: whether a value follows the flag on the command line (``False``: a switch);
  - ``accepted_values``: only for an alias that takes a value: the values it accepts (any other
    is an error naming the flag, the value and these);
  - ``inert_values``: only for ``refused`` flags that some scripts give with a value that asks
    for nothing (``--context-parallel-size 1``): those values are accepted as inert, any
    other is refused;
  - ``note``: one sentence saying why (what the flag does elsewhere, why it has no effect here,
    or what is not built).

* :data:`VALUE_ALIASES` — a tuple of :class:`ValueAlias`: other spellings of a value of an
  implemented flag (``--position-embedding-type rotary`` = ``rope``), with ``flag``, ``value``,
  ``canonical`` (the value it means), ``families`` and ``note``. Matching is case-insensitive
  where ``case_insensitive`` is set (``--normalization rmsnorm``).

Helpers: :func:`compat_flag` (look one up), :func:`canonical_value` (the value-alias
resolution the parser's ``type=`` functions use).
"""
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

FAMILIES = ("bigscience", "megatron-lm", "microsoft")
STATUSES = ("alias", "inert", "refused")

BS, MLM, MS = "bigscience", "megatron-lm", "microsoft"


@dataclass(frozen=True)
class CompatFlag:
    """One flag of another family's scripts and what this project does with it (module docstring)."""

    flag: str
    status: str
    use_instead: str
    families: Tuple[str, ...]
    takes_value: bool
    note: str
    inert_values: Tuple[str, ...] = ()
    accepted_values: Tuple[str, ...] = ()

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"{self.flag}: status {self.status!r} is not one of {STATUSES}")
        if not set(self.families) <= set(FAMILIES):
            raise ValueError(f"{self.flag}: families {self.families} not within {FAMILIES}")
        if self.status == "alias" and not self.use_instead:
            raise ValueError(f"{self.flag}: an alias needs use_instead")
        if self.inert_values and (self.status != "refused" or not self.takes_value):
            raise ValueError(f"{self.flag}: inert_values only for refused flags with a value")
        if self.accepted_values and (self.status != "alias" or not self.takes_value):
            raise ValueError(f"{self.flag}: accepted_values only for aliases with a value")

    @property
    def dest(self) -> str:
        """The argparse destination of the flag when it is registered under its own name."""
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class ValueAlias:
    """Another spelling of a value of an implemented flag."""

    flag: str
    value: str
    canonical: str
    families: Tuple[str, ...]
    note: str = ""
    case_insensitive: bool = False


def _alias(flag, use_instead, families, takes_value, note, accepted_values=()):
    return CompatFlag(flag, "alias", use_instead, families, takes_value, note,
                      accepted_values=tuple(accepted_values))


def _inert(flag, families, takes_value, note):
    return CompatFlag(flag, "inert", "", families, takes_value, note)


def _refused(flag, use_instead, families, takes_value, note, inert_values=()):
    return CompatFlag(flag, "refused", use_instead, families, takes_value, note,
                      tuple(inert_values))


# what Microsoft's Mixture-of-Students scripts (examples_deepspeed/MoE/*_MoS.sh) can run here
_NO_TEACHER = "pretraining without a teacher (drop --mos and its teacher flags)"

COMPAT_FLAGS: Tuple[CompatFlag, ...] = (
    # ------------------------------------------------------------------------------ aliases
    _alias("--topk", "--moe-router-topk", (MS,), True,
           "Microsoft's top-k of the MoE gate (its default is 1, Megatron-LM's 2: scripts that "
           "rely on the default should give it)."),
    _alias("--moe-loss-coeff", "--moe-aux-loss-coeff", (MS,), True,
           "Microsoft's weight of the load-balancing loss (its default is 0.1, Megatron-LM's 0)."),
    _alias("--moe-expert-parallel-size", "--expert-model-parallel-size", (MS,), True,
           "Microsoft's expert-parallel size."),
    _alias("--moe-train-capacity-factor", "--moe-expert-capacity-factor", (MS,), True,
           "Microsoft's expert capacity factor (token dropping unless "
           "--disable-moe-token-dropping)."),
    _alias("--num-key-value-heads", "--num-query-groups", (MS,), True,
           "Grouped-query attention: key/value heads (Microsoft's Llama scripts)."),
    _alias("--layernorm-epsilon", "--norm-epsilon", (BS, MS), True,
           "Epsilon of every LayerNorm/RMSNorm (the older Megatron name)."),
    _alias("--use-rotary-position-embeddings", "--position-embedding-type rope", (MS,), False,
           "Rotary position embeddings (Microsoft's Llama scripts)."),
    _alias("--rotary-position-embeddings-theta", "--rotary-base", (MS,), True,
           "RoPE base (theta); needs rotary position embeddings."),
    _alias("--rope-theta", "--rotary-base", (MS,), True,
           "RoPE base (theta); needs rotary position embeddings."),
    _alias("--prefixlm", "--prefix-lm", (BS,), False,
           "Prefix-LM (non-causal decoder) attention for T0 finetuning; only where --prefix-lm "
           "exists (finetune_t0.py)."),
    _alias("--glu-activation", "--swiglu", (BS,), True,
           "BigScience's GLU variants; only swiglu is implemented (= --swiglu); geglu, liglu and "
           "reglu are refused by value.", accepted_values=("swiglu",)),
    _alias("--use-distributed-optimizer", "--zero-stage 1", (MLM, MS), False,
           "Megatron-LM's distributed optimizer shards optimizer states over data-parallel ranks; "
           "with DeepSpeed that is ZeRO stage 1 (a higher --zero-stage also shards them), stated "
           "in the start-up log."),
    _alias("--wandb-name", "--wandb-exp-name", (MLM,), True,
           "Weights & Biases run name (llm-jp's Megatron-LM fork); with --wandb-project."),
    # -------------------------------------------------------------------------------- inert
    *(_inert(f"--train-{kind}-idx-path", (MS,), True,
             f"Microsoft's data-efficiency scripts: the Pile's {kind} index map as DeepSpeed's "
             "offline data analysis saved it, which only the analysis-based curriculum metrics "
             "(refused) read; the index maps here are megatron-core's, built from --data-path "
             "and --seed.") for kind in ("doc", "sample", "shuffle")),
    _inert("--tensorboard-queue-size", (BS, MLM, MS), True,
           "TensorBoard writer queue length; the writer here flushes on its own schedule."),
    _inert("--log-validation-ppl-to-tensorboard", (BS, MLM, MS), False,
           "Validation perplexity is always written to TensorBoard here ({split}/{group}/ppl)."),
    _inert("--log-optimizer-states-to-tensorboard", (MS,), False,
           "Optimizer state norms in TensorBoard (Microsoft); not logged here."),
    _inert("--data-impl", (BS, MS), True,
           "Indexed-dataset implementation; datasets here are always megatron-core's mmap "
           "format (tools/preprocess_data.py writes it)."),
    _inert("--dataloader-type", (BS, MLM, MS), True,
           "Sampler kind; the order here is 'single' (Megatron-LM's default), whatever the value "
           "says: the samplers follow the global sample index."),
    _inert("--valid-num-workers", (BS,), True,
           "DataLoader workers for validation; evaluation here reads in the main process."),
    _inert("--abort-on-unmet-fused-kernel-constraints", (BS,), False,
           "BigScience fused-softmax kernel guard; no fused kernels are used here."),
    _inert("--no-async-tensor-model-parallel-allreduce", (MLM, MS), False,
           "Disables a CUDA overlap of tensor-parallel all-reduce; nothing to disable on this "
           "stack."),
    _inert("--no-gradient-accumulation-fusion", (MLM, MS), False,
           "Disables Megatron-LM's fused weight-gradient accumulation kernel; not used here."),
    _inert("--no-query-key-layer-scaling", (MLM, MS), False,
           "Query-key layer scaling is off here (megatron-core's default), so this asks for what "
           "already happens."),
    _inert("--apply-query-key-layer-scaling", (MLM,), False,
           "fp16 overflow guard of the old fused softmax; the attention here scales by "
           "1/sqrt(head dim) in fp32 softmax."),
    _inert("--use-flash-attn", (MLM, MS), False,
           "Flash attention; the core attention is chosen with --attention-backend (SDPA picks "
           "a flash kernel where the device has one)."),
    _inert("--use-flash-attn-v2", (MS,), False,
           "Flash attention 2; see --attention-backend."),
    _inert("--use-flash-attn-triton", (MS,), False,
           "Triton flash attention; see --attention-backend."),
    _inert("--sync-tp-duplicated-parameters", (BS,), False,
           "BigScience's periodic sync of tensor-parallel copies of norm weights; megatron-core "
           "keeps them identical (same gradients), so there is nothing to sync."),
    _inert("--checkpoint-in-cpu", (MS, BS), False,
           "DeepSpeed activation checkpointing: keep checkpoints in CPU memory; a memory placement "
           "with no effect on results, not applied here."),
    _inert("--partition-activations", (MS, BS), False,
           "DeepSpeed activation checkpointing: partition saved activations over TP ranks; "
           "use --distribute-saved-activations for that here."),
    _inert("--contigious-checkpointing", (MS,), False,
           "DeepSpeed activation checkpointing: contiguous buffers (memory layout only)."),
    _inert("--synchronize-each-layer", (MS,), False,
           "DeepSpeed activation checkpointing: synchronize after each layer (debug timing)."),
    _inert("--profile-backward", (MS,), False,
           "DeepSpeed activation checkpointing: profile the backward pass."),
    _inert("--use-mpi", (MS,), False,
           "Discover ranks through MPI; the deepspeed launcher sets the rank variables here."),
    _inert("--use-mcore-models", (MLM,), False,
           "The models here are always megatron-core's."),
    _inert("--no-masked-softmax-fusion", (MLM, MS), False,
           "Disables megatron-core's fused masked-softmax kernel, which the core attentions here "
           "(SDPA, FlexAttention, Transformer Engine) never call."),
    _inert("--overlap-grad-reduce", (MLM,), False,
           "Overlap of Megatron-LM's DDP gradient reduce; DeepSpeed owns the data-parallel "
           "reduction here."),
    _inert("--overlap-param-gather", (MLM,), False,
           "Overlap of the distributed optimizer's parameter gather; DeepSpeed owns it here."),
    _inert("--create-moe-param-group", (MS,), False,
           "Separate optimizer groups for expert parameters; they are always made here "
           "(docs/moe.md)."),
    _inert("--disable-moe-top2-2nd-expert-sampling", (MS,), False,
           "DeepSpeed's top-2 gate samples its second expert unless this is given; megatron-core's "
           "router always takes the top k, which is what the flag asks."),
    _inert("--use-tutel", (MS,), False,
           "Tutel's MoE kernels for DeepSpeed's MoE layer; megatron-core's dispatchers run here."),
    # ------------------------------------------------------------------------------ refused
    _refused("--ds-sequence-parallel-fpdt",
             "--ds-sequence-parallel-size N (DeepSpeed-Ulysses) with --recompute-granularity full",
             (MS,), False,
             "FPDT (Ulysses with chunked, offloaded attention) is not built here; plain Ulysses is."),
    _refused("--ds-sequence-parallel-fpdt-chunk-size",
             "--ds-sequence-parallel-size N (DeepSpeed-Ulysses) with --recompute-granularity full",
             (MS,), True, "FPDT chunk size; FPDT is not built here."),
    _refused("--ds-sequence-parallel-fpdt-offloading",
             "--ds-sequence-parallel-size N (DeepSpeed-Ulysses) with --recompute-granularity full",
             (MS,), False, "FPDT CPU offloading; FPDT is not built here."),
    _refused("--context-parallel-size",
             "--ds-sequence-parallel-size N (DeepSpeed-Ulysses sequence parallelism)",
             (MLM,), True, "Megatron-LM context parallelism (ring attention) is not built here; "
             "DeepSpeed-Ulysses splits the sequence instead.", inert_values=("1",)),
    _refused("--mlp-type", "--moe-shared-expert-intermediate-size (a shared expert beside the "
             "routed ones)", (MS,), True,
             "Microsoft's Residual MoE mixes a dense MLP and the experts with learned per-token "
             "coefficients; megatron-core's MoE layer has no such mix (standard is the default "
             "MoE).", inert_values=("standard",)),
    _refused("--mos", _NO_TEACHER, (MS,), False,
             "Microsoft's Mixture-of-Students (knowledge distillation of a smaller MoE student "
             "from a teacher checkpoint) is not built here."),
    _refused("--kd-beta-ce", _NO_TEACHER, (MS,), True,
             "Weight of Mixture-of-Students' distillation loss; distillation is not built here."),
    _refused("--load-teacher", _NO_TEACHER, (MS,), True,
             "Teacher checkpoint of Mixture-of-Students; distillation is not built here."),
    _refused("--num-layers-teacher", _NO_TEACHER, (MS,), True,
             "Teacher shape of Mixture-of-Students; distillation is not built here."),
    _refused("--hidden-size-teacher", _NO_TEACHER, (MS,), True,
             "Teacher shape of Mixture-of-Students; distillation is not built here."),
    _refused("--num-attention-heads-teacher", _NO_TEACHER, (MS,), True,
             "Teacher shape of Mixture-of-Students; distillation is not built here."),
    _refused("--num-experts-teacher", _NO_TEACHER, (MS,), True,
             "Teacher expert counts of Mixture-of-Students; distillation is not built here."),
    _refused("--virtual-pipeline-model-parallel-size", "--pipeline-model-parallel-size",
             (MLM,), True,
             "Interleaved (virtual) pipeline stages are not built; DeepSpeed's pipe engine runs "
             "one stage per rank."),
    _refused("--num-layers-per-virtual-pipeline-stage", "--pipeline-model-parallel-size",
             (MLM,), True, "Interleaved (virtual) pipeline stages are not built here."),
    _refused("--random-ltd", "training on whole sequences (drop the flag)", (MS,), False,
             "DeepSpeed random layerwise token dropping is not built here."),
    _refused("--cpu-optimizer", "--zero-stage with a DeepSpeed offload_optimizer section in "
             "--deepspeed_config", (MS,), False,
             "Microsoft's CPU Adam switch is not built here."),
    _refused("--fp8-format", "--bf16", (MLM,), True,
             "FP8 training (Transformer Engine) is not built here."),
)

VALUE_ALIASES: Tuple[ValueAlias, ...] = (
    ValueAlias("--position-embedding-type", "rotary", "rope", (BS,),
               "BigScience's name for rotary position embeddings."),
    ValueAlias("--position-embedding-type", "absolute", "learned_absolute", (BS,),
               "BigScience's name for learned absolute position embeddings."),
    ValueAlias("--normalization", "rmsnorm", "RMSNorm", (MS,), "Any case.", case_insensitive=True),
    ValueAlias("--normalization", "layernorm", "LayerNorm", (MS,), "Any case.",
               case_insensitive=True),
)

_BY_FLAG: Dict[str, CompatFlag] = {c.flag: c for c in COMPAT_FLAGS}
if len(_BY_FLAG) != len(COMPAT_FLAGS):
    raise ValueError("megatron/config/flag_compat.py: a flag is listed twice in COMPAT_FLAGS")


def compat_flag(flag: str) -> Optional[CompatFlag]:
    """The :class:`CompatFlag` of option string ``flag`` (``"--data-impl"``), or None."""
    return _BY_FLAG.get(flag)


def canonical_value(flag: str, value: str) -> str:
    """``value`` of ``flag`` with a :data:`VALUE_ALIASES` spelling replaced by the value it
    means (``("--position-embedding-type", "rotary")`` -> ``"rope"``); other values unchanged."""
    for alias in VALUE_ALIASES:
        if alias.flag != flag:
            continue
        if value == alias.value or (alias.case_insensitive and value.lower() == alias.value.lower()):
            return alias.canonical
        if alias.case_insensitive and value.lower() == alias.canonical.lower():
            return alias.canonical
    return value
