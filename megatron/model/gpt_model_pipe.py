"""The GPT model as a DeepSpeed ``PipelineModule`` (``GPTModelPipe``) made of megatron-core pieces.

The pipe is the sequence ``embedding, layer 0 .. layer L-1, final norm, output layer`` with the loss
(vocab-parallel cross entropy under the loss mask) computed on the last stage. The layers come from
the same layer spec and ``TransformerConfig`` as :func:`megatron.model.gpt_model.build_gpt_model`;
layer ``i`` is built with its global layer number ``i + 1`` whatever stage holds it (this module
numbers layers, so megatron-core's per-stage offset is switched off), and every parameter has a
*canonical name*, the name it has in the one-stage ``GPTModel`` (``decoder.layers.{i}.…``), through
which it is initialised. PP=2 therefore starts from exactly the PP=1 model's weights.

Unless ``--untie-embeddings-and-output-weights``, the input embedding and the output layer share
one weight: a DeepSpeed ``TiedLayerSpec`` on the first and the last stage, whose gradients DeepSpeed
all-reduces over the two stages (the sum of both uses, as in the one-stage model).

What flows between stages (DeepSpeed sends tuples of tensors):

- into the first stage: ``(tokens, position_ids, *attention)``;
- between stages: ``(hidden [s, b, h], *attention)``;
- to the loss on the last stage: ``(labels, loss_mask[, dataset_id])``.

``attention`` is the batch's compact attention structure (megatron/model/masks.py): its optional
``segment_ids`` ``[b, s]`` as int32 with the loader's fixed-length ``cu_seqlens`` ``[b*s + 1]``
(int32, 1-D; megatron/model/segment_layout.py) and ``is_prefix`` ``[b, s]`` as uint8 (DeepSpeed's p2p
sends no bool tensors under nccl), told apart by dtype and shape; none for plain causal attention.
The host segment layout does not travel (stages exchange tensors only, of fixed shapes), so the
stages' backends use the forms that need no host integers (SDPA's dense mask, TE's fixed-length
``cu_seqlens``). The transformer layers of a stage share one :class:`StageAttentionStructure`,
which builds the ``AttentionStructure`` their core attention takes once per micro batch (so the
mask a backend builds from it is built once per micro batch and stage, as in ``GPTModel``, not once
per layer).
"""
import collections
import contextlib
import copy
import dataclasses
from typing import Callable, Deque, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
from megatron.core import tensor_parallel
from megatron.core.models.common.embeddings.language_model_embedding import LanguageModelEmbedding
from megatron.core.transformer.spec_utils import ModuleSpec, build_module
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, _get_block_submodules
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron.errors import ArgumentError
from megatron.model.alibi import model_position_embedding_type
from megatron.model.embedding_norm import add_embedding_layernorm
from megatron.model.init import initialize_parameters
from megatron.model.lm_loss import masked_lm_loss, vocab_parallel_token_loss
from megatron.model.masks import AttentionStructure
from megatron.model.model_config import ModelConfig
from megatron.model.norms import sequence_parallel_capable
from megatron.model.param_names import global_expert_name, pipe_key_to_gpt_name
from megatron.model.rotary import NO_SCALING, RopeScaling, rotary_embedding, yarn_fields
from megatron.model.segment_layout import padded_cu_seqlens
from megatron.model.vocab_padding import local_padding_start, mask_padding_logits_, tp_coordinates
from megatron.parallel.experts import first_local_expert
from megatron.parallel.topology import deepspeed_topology

TIED_EMBEDDING_KEY = "embed"
# What GPTModel's transformer_layer_spec takes: one layer's spec or the block's submodules.
LayerSpecs = Union[ModuleSpec, TransformerBlockSubmodules]


SEGMENT_IDS_PIPE_DTYPE = torch.int32
IS_PREFIX_PIPE_DTYPE = torch.uint8


def _split(inputs) -> Tuple[torch.Tensor, tuple]:
    """``(hidden, attention tensors)`` from what the previous pipe layer returned."""
    if torch.is_tensor(inputs):
        return inputs, ()
    return inputs[0], tuple(inputs[1:])


def _pack(hidden: torch.Tensor, attention: tuple):
    return (hidden, *attention) if attention else hidden


def attention_tensors(segment_ids: Optional[torch.Tensor], is_prefix: Optional[torch.Tensor],
                      cu_seqlens: Optional[torch.Tensor] = None) -> tuple:
    """The pipe form of a batch's attention structure: ``segment_ids`` as int32 with its
    fixed-length ``cu_seqlens`` (int32; derived from ``segment_ids`` when not given), and
    ``is_prefix`` as uint8, each only when present."""
    out = []
    if segment_ids is not None:
        out.append(segment_ids.to(SEGMENT_IDS_PIPE_DTYPE))
        if cu_seqlens is None:
            cu_seqlens = padded_cu_seqlens(segment_ids)
        out.append(cu_seqlens.to(SEGMENT_IDS_PIPE_DTYPE))
    if is_prefix is not None:
        out.append(is_prefix.to(IS_PREFIX_PIPE_DTYPE))
    return tuple(out)


def attention_structure_from_pipe(attention: Sequence[torch.Tensor]):
    """The ``AttentionStructure`` (or None: plain causal) of :func:`attention_tensors`' output,
    without a host segment layout (nothing here reads the tensors back to the host)."""
    int32 = [t for t in attention if t.dtype == SEGMENT_IDS_PIPE_DTYPE]
    segment_ids = next((t for t in int32 if t.dim() == 2), None)
    cu_seqlens = next((t for t in int32 if t.dim() == 1), None)
    is_prefix = next((t.bool() for t in attention if t.dtype == IS_PREFIX_PIPE_DTYPE), None)
    if segment_ids is None and is_prefix is None:
        return None
    return AttentionStructure(segment_ids=segment_ids, is_prefix=is_prefix, cu_seqlens=cu_seqlens)


def stage_config(config: TransformerConfig) -> TransformerConfig:
    """``config`` as the pipe layers are built with: one pipeline stage as far as megatron-core is
    concerned (layers carry their global layer number, so ``get_transformer_layer_offset`` must not
    add a stage offset), and full recompute left to DeepSpeed's ``activation_checkpoint_interval``
    (megatron-core's full recompute lives in ``TransformerBlock``, which the pipe does not use)."""
    changes = {"pipeline_model_parallel_size": 1}
    if config.recompute_granularity == "full":
        changes.update(recompute_granularity=None, recompute_method=None, recompute_num_layers=None,
                       distribute_saved_activations=False)
    staged = dataclasses.replace(config, **changes)
    for field, value in yarn_fields(config).items():  # YaRN's attributes are not fields
        setattr(staged, field, value)
    return staged


class StageAttentionStructure:
    """The ``AttentionStructure`` of the micro batch a stage's layers are running, shared by them.

    :meth:`get` returns the structure built for the last attention tensors it saw while they are
    the same tensor objects, unmodified (same ``_version``); anything else (the next micro batch,
    the detached copies a recomputed chunk runs on) builds a new one. It holds only the last micro
    batch's tensors and the forms backends cached on its structure."""

    def __init__(self):
        self._key: Optional[Tuple[Tuple[torch.Tensor, int], ...]] = None
        self._structure = None

    def get(self, attention: Sequence[torch.Tensor]):
        """The structure of ``attention`` (:func:`attention_structure_from_pipe`), built once."""
        if not attention:
            return None
        key = tuple((t, t._version) for t in attention)
        cached = self._key
        if (cached is not None and len(cached) == len(key)
                and all(a is b and va == vb for (a, va), (b, vb) in zip(cached, key, strict=True))):
            return self._structure
        self._structure = attention_structure_from_pipe(attention)
        self._key = key
        return self._structure


class EmbeddingPipe(torch.nn.Module):
    """First stage: token (+ learned position) embeddings and embedding dropout,
    ``(tokens, position_ids, *attention) -> (hidden [s, b, h], *attention)``; with
    ``embed_layernorm`` BLOOM's LayerNorm on the word embeddings (megatron/model/embedding_norm.py).

    The same module serves as the tied output layer on the last stage (:meth:`logits`): it holds a
    weightless megatron-core ``ColumnParallelLinear`` that projects with ``word_embeddings.weight``.
    """

    def __init__(self, config: TransformerConfig, vocab_size: int, max_sequence_length: int,
                 position_embedding_type: str, embed_layernorm: bool = False,
                 real_vocab_size: Optional[int] = None):
        super().__init__()
        self.config = config
        # logits of rows >= real_vocab_size (padding) are -inf (megatron/model/vocab_padding.py)
        self.padding_start = local_padding_start(real_vocab_size, vocab_size, *tp_coordinates())
        self.embedding = LanguageModelEmbedding(
            config=config, vocab_size=vocab_size, max_sequence_length=max_sequence_length,
            position_embedding_type=position_embedding_type)
        if embed_layernorm:
            add_embedding_layernorm(self.embedding, config)
        self.output_projection = tensor_parallel.ColumnParallelLinear(
            config.hidden_size, vocab_size, config=config, init_method=config.init_method, bias=False,
            skip_bias_add=False, gather_output=False, skip_weight_param_allocation=True)

    @property
    def word_embeddings(self):
        """The (vocab-parallel) token embedding; its ``weight`` is the tied weight."""
        return self.embedding.word_embeddings

    def forward(self, inputs):
        tokens, position_ids, attention = inputs[0], inputs[1], tuple(inputs[2:])
        return _pack(self.embedding(input_ids=tokens, position_ids=position_ids), attention)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Vocab-parallel logits ``[s, b, v / TP]`` with the tied weight (last stage)."""
        logits, _ = self.output_projection(hidden, weight=self.word_embeddings.weight)
        return mask_padding_logits_(logits, self.padding_start)


def tied_output_forward(embedding: EmbeddingPipe, inputs) -> torch.Tensor:
    """The tied output layer (``TiedLayerSpec.forward_fn``): logits with the embedding's weight."""
    hidden, _ = _split(inputs)
    return embedding.logits(hidden)


class TransformerLayerPipe(torch.nn.Module):
    """One transformer layer from the layer spec, with its global ``layer_number`` (1-based),
    ``(hidden, *attention) -> (hidden, *attention)``. With ``--position-embedding-type rope`` (its
    ``rope_scaling``) or ``yarn`` the rotary embedding (no parameters) is recomputed here from
    the sequence length, as ``GPTModel`` does (YaRN's attention factor is applied by the
    attention, from the config's ``yarn_*`` attributes)."""

    def __init__(self, config: TransformerConfig, layer_spec: ModuleSpec, layer_number: int,
                 position_embedding_type: str, rotary_percent: float, rotary_base: int,
                 stage_attention: Optional[StageAttentionStructure] = None,
                 rope_scaling: RopeScaling = NO_SCALING):
        super().__init__()
        self.config = config
        self.layer_number = layer_number
        # Shared by the stage's layers (GPTModelPipe passes one); a layer built alone gets its own.
        self.stage_attention = stage_attention if stage_attention is not None else (
            StageAttentionStructure())
        self.layer = build_module(layer_spec, config=config, layer_number=layer_number)
        self.rotary_pos_emb = rotary_embedding(config, position_embedding_type, rotary_percent,
                                               rotary_base, rope_scaling)

    def forward(self, inputs):
        hidden, attention = _split(inputs)
        rotary = None
        if self.rotary_pos_emb is not None:
            seq_len = hidden.size(0) * (self.config.tensor_model_parallel_size
                                        if self.config.sequence_parallel else 1)
            rotary = self.rotary_pos_emb(seq_len)
            if isinstance(rotary, tuple):  # YaRN: (angles, attention factor)
                rotary = rotary[0]
        # As TransformerBlock: sequence-parallel dropout draws from the model-parallel RNG stream.
        rng = (tensor_parallel.get_cuda_rng_tracker().fork() if self.config.sequence_parallel
               else contextlib.nullcontext())
        with rng:
            output, _ = self.layer(hidden_states=hidden, attention_mask=None, rotary_pos_emb=rotary,
                                   packed_seq_params=self.stage_attention.get(attention))
        return _pack(output, attention)


def recompute_function(distribute_saved_activations: bool):
    """The pipe's ``activation_checkpoint_func``: megatron-core's ``tensor_parallel.checkpoint``
    (which restores the CPU/CUDA generators and megatron-core's model-parallel RNG tracker, so the
    recomputed forward draws the same dropout masks) around a chunk of transformer layers. DeepSpeed
    calls it as ``func(chunk, hidden, *attention)``; only the hidden state is differentiable, the
    attention tensors pass by."""

    def checkpoint(chunk, *inputs):
        hidden, attention = _split(inputs)

        def run(h, *a):
            return _split(chunk(h, *a))[0]

        output = tensor_parallel.checkpoint(run, distribute_saved_activations, hidden, *attention)
        return _pack(output, attention)

    return checkpoint


class FinalNormPipe(torch.nn.Module):
    """The decoder's final norm (``norm``: what ``TransformerBlock`` would build for the layer
    spec), ``(hidden, *attention) -> hidden``."""

    def __init__(self, config: TransformerConfig, norm):
        super().__init__()
        self.final_layernorm = build_module(norm, config=config, hidden_size=config.hidden_size,
                                            eps=config.layernorm_epsilon)

    def forward(self, inputs):
        hidden, _ = _split(inputs)
        return self.final_layernorm(hidden)


class OutputLayerPipe(torch.nn.Module):
    """Untied output layer (``--untie-embeddings-and-output-weights``): hidden -> vocab-parallel
    logits ``[s, b, v / TP]``."""

    def __init__(self, config: TransformerConfig, vocab_size: int,
                 real_vocab_size: Optional[int] = None):
        super().__init__()
        self.output_layer = tensor_parallel.ColumnParallelLinear(
            config.hidden_size, vocab_size, config=config, init_method=config.init_method, bias=False,
            skip_bias_add=False, gather_output=False)
        self.padding_start = local_padding_start(real_vocab_size, vocab_size, *tp_coordinates())

    def forward(self, hidden):
        logits, _ = self.output_layer(hidden)
        return mask_padding_logits_(logits, self.padding_start)


class PipeLMLoss:
    """The last stage's loss function ``(logits, (labels, loss_mask[, dataset_id])) -> loss`` (see
    :func:`megatron.model.lm_loss.masked_lm_loss`). It also keeps, per micro batch, ``(loss,
    per-sample loss, dataset_id or None)`` until :meth:`pop_records`, which is how the training
    loop gets per-dataset losses out of the pipe. Per iteration the loop may give each micro
    batch's factor to the back-propagated loss (:meth:`set_factors`: the per-token and per-sample
    normalisations, megatron/optim/loss_normalization.py); observers (:meth:`observe`) see each micro
    batch's mean loss and loss mask. While ``keep_token_losses`` is set (an evaluation with
    position buckets, megatron/train/steps.py) it also keeps each micro batch's per-token losses
    (``[b, s]``, nats, detached) until :meth:`pop_token_losses`."""

    __name__ = "masked_lm_loss"  # DeepSpeed prints the loss function's name

    def __init__(self):
        self._records: List[Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]] = []
        self._factors: Deque[torch.Tensor] = collections.deque()
        self._observers: List[Callable[[torch.Tensor, torch.Tensor], None]] = []
        self._token_losses: List[torch.Tensor] = []
        self.keep_token_losses = False

    def set_factors(self, factors: Sequence[torch.Tensor]) -> None:
        """The coming micro batches' factors, in order: each is returned ``loss x factor``."""
        self._factors = collections.deque(factors)

    def observe(self, observer: Callable[[torch.Tensor, torch.Tensor], None]) -> None:
        """Call ``observer(loss, loss_mask)`` with each micro batch's mean loss."""
        self._observers.append(observer)

    def __call__(self, logits: torch.Tensor, labels) -> torch.Tensor:
        targets, loss_mask = labels[0], labels[1]
        dataset_id = labels[2] if len(labels) > 2 else None
        per_token = vocab_parallel_token_loss(logits, targets)
        loss, per_sample = masked_lm_loss(per_token, loss_mask)
        self._records.append((loss.detach(), per_sample, dataset_id))
        if self.keep_token_losses:
            self._token_losses.append(per_token.detach())
        for observer in self._observers:
            observer(loss, loss_mask)
        if self._factors:
            return loss * self._factors.popleft()
        return loss

    def pop_records(self) -> List[Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]]:
        """The records of the micro batches since the last call (empty off the last stage)."""
        records, self._records = self._records, []
        return records

    def pop_token_losses(self) -> List[torch.Tensor]:
        """The per-token losses kept since the last call (``keep_token_losses``), one ``[b, s]``
        tensor per micro batch; empty off the last stage or when none were kept."""
        kept, self._token_losses = self._token_losses, []
        return kept


class GPTModelPipe(PipelineModule):
    """GPT as a DeepSpeed pipeline of megatron-core pieces (see the module docstring).

    ``partition_method`` is DeepSpeed's (``parameters``: balanced parameter counts; ``type:REGEX``:
    balanced numbers of the layers whose class name matches, e.g. ``type:transformer`` for
    transformer layers, ``type:transformer|embedding`` as BigScience's BLOOM, which counts the
    embedding on the first and the tied output layer on the last stage as one layer each; see
    :func:`partition_method` for ``uniform``).
    ``activation_checkpoint_interval`` N > 0 keeps only the input of every chunk of N pipe layers of
    a stage and recomputes the chunk in the backward pass (:func:`recompute_function`); chunks that
    hold anything but transformer layers (the embedding, norm and output layer) are not recomputed.
    """

    def __init__(self, config: TransformerConfig, layer_spec: LayerSpecs, vocab_size: int,
                 max_sequence_length: int, topology, *,
                 position_embedding_type: str = "learned_absolute", rotary_percent: float = 1.0,
                 rotary_base: int = 10000, rope_scaling: RopeScaling = NO_SCALING,
                 share_embeddings_and_output_weights: bool = True,
                 partition_method: str = "type:transformer",
                 activation_checkpoint_interval: int = 0, embed_layernorm: bool = False,
                 real_vocab_size: Optional[int] = None):
        self.config = stage_config(config)
        self.share_embeddings_and_output_weights = share_embeddings_and_output_weights
        self.num_transformer_layers = config.num_layers
        specs = self.layer_specs(config, layer_spec, vocab_size, max_sequence_length,
                                 position_embedding_type=position_embedding_type,
                                 rotary_percent=rotary_percent, rotary_base=rotary_base,
                                 rope_scaling=rope_scaling,
                                 share_embeddings_and_output_weights=(
                                     share_embeddings_and_output_weights),
                                 embed_layernorm=embed_layernorm,
                                 real_vocab_size=real_vocab_size)
        self.loss_function = PipeLMLoss()
        recompute = recompute_function(config.distribute_saved_activations)
        super().__init__(layers=specs, topology=topology, loss_fn=self.loss_function,
                         partition_method=partition_method,
                         activation_checkpoint_interval=activation_checkpoint_interval,
                         activation_checkpoint_func=recompute,
                         checkpointable_layers=[TransformerLayerPipe.__name__])

    @staticmethod
    def layer_specs(config: TransformerConfig, layer_spec: LayerSpecs, vocab_size: int,
                    max_sequence_length: int, *, position_embedding_type: str = "learned_absolute",
                    rotary_percent: float = 1.0, rotary_base: int = 10000,
                    rope_scaling: RopeScaling = NO_SCALING,
                    share_embeddings_and_output_weights: bool = True,
                    embed_layernorm: bool = False,
                    real_vocab_size: Optional[int] = None) -> list:
        """The pipe's layers (DeepSpeed layer specs, nothing built): embedding (with BLOOM's
        LayerNorm if ``embed_layernorm``), ``num_layers`` transformer layers, final norm, output
        layer (tied to the embedding unless untied), whose logits of rows at or beyond
        ``real_vocab_size`` (vocabulary padding) are ``-inf``.
        ``layer_spec`` is what ``GPTModel`` takes: one layer's spec, or the block's submodules
        (per-layer specs and the final norm)."""
        cfg = stage_config(config)
        block = _get_block_submodules(cfg, layer_spec)
        if len(block.layer_specs) != config.num_layers:
            raise ValueError(f"{len(block.layer_specs)} layer specs for {config.num_layers} layers")
        embedding_args = (cfg, vocab_size, max_sequence_length)
        specs = []
        stage_attention = StageAttentionStructure()  # only this rank's stage's layers are built
        if share_embeddings_and_output_weights:
            specs.append(TiedLayerSpec(TIED_EMBEDDING_KEY, EmbeddingPipe, *embedding_args,
                                       position_embedding_type=position_embedding_type,
                                       embed_layernorm=embed_layernorm,
                                       real_vocab_size=real_vocab_size,
                                       tied_weight_attr=["word_embeddings.weight"]))
        else:
            specs.append(LayerSpec(EmbeddingPipe, *embedding_args,
                                   position_embedding_type=position_embedding_type,
                                   embed_layernorm=embed_layernorm))
        for i in range(config.num_layers):
            specs.append(LayerSpec(TransformerLayerPipe, cfg, block.layer_specs[i], i + 1,
                                   position_embedding_type, rotary_percent, rotary_base,
                                   stage_attention=stage_attention, rope_scaling=rope_scaling))
        specs.append(LayerSpec(FinalNormPipe, cfg, block.layer_norm))
        if share_embeddings_and_output_weights:
            # On a last stage that holds no embedding, this builds the tied module without
            # position embeddings or embedding LayerNorm (only the tied weight is used there); on
            # a one-stage pipe it reuses the first spec's module.
            specs.append(TiedLayerSpec(TIED_EMBEDDING_KEY, EmbeddingPipe, *embedding_args,
                                       position_embedding_type="none",
                                       real_vocab_size=real_vocab_size,
                                       forward_fn=tied_output_forward,
                                       tied_weight_attr=["word_embeddings.weight"]))
        else:
            specs.append(LayerSpec(OutputLayerPipe, cfg, vocab_size, real_vocab_size))
        return specs

    # ------------------------------------------------------------------ canonical names
    def canonical_name(self, name: str) -> str:
        """The ``GPTModel`` name of this module's parameter ``name``: ``tied_modules.embed.embedding.X``
        and ``0.embedding.X`` -> ``embedding.X``; ``{k}.layer.X`` (transformer layer k-1) ->
        ``decoder.layers.{k-1}.X``; the final norm -> ``decoder.final_layernorm.X``; the untied
        output layer -> ``output_layer.X`` (``param_names.pipe_key_to_gpt_name``, which the
        checkpoint reader applies to the pipe's layer files)."""
        head, _, rest = name.partition(".")
        if head == "tied_modules":
            _, _, rest = rest.partition(".")  # the tie key
            return rest
        module = self.forward_funcs[self.fwd_map[head]]
        if not isinstance(module, PIPE_LAYER_CLASSES):
            raise KeyError(f"pipe layer {head} ({type(module).__name__}) has no canonical name")
        # the pipe layer index is the one its checkpoint file carries (megatron/model/param_names.py)
        gpt_name = pipe_key_to_gpt_name(int(head), rest)
        assert not isinstance(module, TransformerLayerPipe) or \
            gpt_name.startswith(f"decoder.layers.{module.layer_number - 1}."), name
        return gpt_name

    def canonical_named_parameters(self) -> Iterator[Tuple[str, torch.nn.Parameter]]:
        """``(GPTModel name, parameter)`` for every parameter this stage holds."""
        for name, param in self.named_parameters():
            yield self.canonical_name(name), param

    def canonical_state_dict(self) -> Dict[str, torch.Tensor]:
        """This stage's parameters under their ``GPTModel`` names (detached)."""
        return {name: p.detach() for name, p in self.canonical_named_parameters()}

    def load_canonical_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        """Copy ``GPTModel``-named tensors into this stage's parameters (each must be present)."""
        with torch.no_grad():
            for name, param in self.canonical_named_parameters():
                if name not in state:
                    raise KeyError(f"{name} missing from the GPTModel state")
                param.copy_(state[name])

    def transformer_layers_per_stage(self) -> List[int]:
        """How many transformer layers each stage holds under this partition."""
        counts = []
        for stage in range(self.num_stages):
            start, stop = self.parts[stage], self.parts[stage + 1]
            counts.append(sum(1 for spec in self._layer_specs[start:stop]
                              if isinstance(spec, LayerSpec) and spec.typename is TransformerLayerPipe))
        return counts


PIPE_LAYER_CLASSES = (EmbeddingPipe, TransformerLayerPipe, FinalNormPipe, OutputLayerPipe)


def partition_method(method: str) -> str:
    """DeepSpeed's partition method for ``--pp-partition-method`` ``method``, and the one check of
    the flag (validation calls it). ``uniform`` keeps Megatron-LM's meaning, the same number of
    transformer layers on every stage (``validate_args`` checks that ``--num-layers`` divides),
    which is DeepSpeed's ``type:TransformerLayerPipe``; DeepSpeed's own ``uniform`` would also
    count the embedding, final norm and output layer as layers. ``parameters`` and ``type:REGEX``
    are passed through; ArgumentError for any other value, an empty or bad pattern, or one that
    matches no layer class (DeepSpeed would fail on every rank at start-up). Patterns are
    compiled with the ``regex`` package, as DeepSpeed's partitioner does."""
    if method == "uniform":
        return f"type:{TransformerLayerPipe.__name__}"
    if method == "parameters":
        return method
    if not method.startswith("type:"):
        raise ArgumentError(f"--pp-partition-method {method}: expected uniform, parameters or "
                            "type:REGEX (e.g. type:transformer)")
    import regex  # DeepSpeed's partitioner matches with the regex package

    if not method[len("type:"):]:
        raise ArgumentError(f"--pp-partition-method {method}: empty layer-type pattern")
    try:
        pattern = regex.compile(method[len("type:"):], regex.IGNORECASE)
    except regex.error as e:
        raise ArgumentError(f"--pp-partition-method {method}: bad regular expression ({e})") from None
    names = [cls.__name__ for cls in PIPE_LAYER_CLASSES]
    if not any(pattern.search(name) for name in names):
        raise ArgumentError(f"--pp-partition-method {method} matches none of the pipe's layer "
                            f"classes ({', '.join(names)}); e.g. type:transformer")
    return method


def activation_checkpoint_interval(recompute_granularity: Optional[str],
                                   recompute_num_layers: Optional[int]) -> int:
    """Transformer layers per recomputed chunk in the pipe: ``--recompute-num-layers`` with
    ``--recompute-granularity full --recompute-method uniform`` (or ``--checkpoint-activations``),
    else 0 (selective recompute stays inside each layer through the ``TransformerConfig``)."""
    if recompute_granularity == "full":
        return int(recompute_num_layers)
    return 0


def build_gpt_model_pipe(transformer: TransformerConfig, model: ModelConfig, padded_vocab_size: int,
                         vocab_size: Optional[int] = None) -> GPTModelPipe:
    """The ``GPTModelPipe`` of ``transformer`` and ``model`` on this rank's stage (the parallel
    state initialised) with ``padded_vocab_size`` embedding rows (``vocab_size``: the rows that
    take probability, from the tokenizer set-up): same config and layer spec as
    ``build_gpt_model``, DeepSpeed's topology equal to megatron-core's, weights from the
    layout-independent initializer."""
    from megatron.model.gpt_model import gpt_layer_spec  # lazy: TE/apex probes (megatron-core's GPT specs); not --help

    config = copy.copy(transformer)  # the model's own object, as build_gpt_model
    layer_spec = gpt_layer_spec(model, config)
    if model.sequence_parallel:  # as build_gpt_model: norms that tag their parameters for SP
        layer_spec = sequence_parallel_capable(layer_spec, config.num_layers)
    pipe = GPTModelPipe(
        config, layer_spec, padded_vocab_size, model.max_position_embeddings,
        deepspeed_topology(model.layout),
        position_embedding_type=model_position_embedding_type(model.position_embedding_type),
        rotary_percent=model.rotary_percent,
        rotary_base=model.rotary_base,
        rope_scaling=model.rope_scaling,
        share_embeddings_and_output_weights=not model.untie_embeddings_and_output_weights,
        partition_method=model.partition_method,
        activation_checkpoint_interval=model.activation_checkpoint_interval,
        embed_layernorm=model.embed_layernorm,
        real_vocab_size=vocab_size)
    # experts by their global ids, as build_gpt_model: every expert-parallel layout draws the same
    # experts (the checkpoint's namer reads the attribute too, megatron/checkpoint/engine_index.py)
    pipe.first_local_expert = first_local_expert(model.num_experts)
    initialize_parameters(pipe.named_parameters(), config, model.seed, canonical_name=lambda n:
                          global_expert_name(pipe.canonical_name(n), pipe.first_local_expert))
    return pipe


def gpt_model_for_layout(transformer: TransformerConfig, model: ModelConfig,
                         padded_vocab_size: int, vocab_size: Optional[int] = None) -> torch.nn.Module:
    """``GPTModel`` of ``transformer`` and ``model`` with ``padded_vocab_size`` embedding rows (of
    which ``vocab_size`` take probability) when the layout has one pipeline stage
    (``--pipeline-model-parallel-size 1``, with or without ``--no-pipeline-parallel``), else this
    rank's ``GPTModelPipe`` stage."""
    if model.pipeline_model_parallel_size > 1:
        return build_gpt_model_pipe(transformer, model, padded_vocab_size, vocab_size)
    from megatron.model.gpt_model import build_gpt_model  # lazy: TE/apex probes (megatron-core's GPT specs); not --help

    return build_gpt_model(transformer, model, padded_vocab_size, vocab_size)
