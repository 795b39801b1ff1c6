"""GPTModelPipe on one process: canonical names and initial weights, equality with GPTModel,
recompute, stage partitioning, the pipe batch (megatron/model/pipe_io.py) and the tied-copy glue
(megatron/parallel/pipe.py)."""
import types

import pytest
import torch

from helpers.flags import parse, parsed
from megatron.config.parser import parse_args

MODEL_FLAGS = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
               "--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "1", "--lr", "1e-3",
               "--hidden-dropout", "0", "--attention-dropout", "0", "--transformer-impl", "local"]


def model_args(*extra, vocab=260):
    args = parse_args(MODEL_FLAGS + list(extra), world_size=1, require_data=False)
    args.padded_vocab_size = vocab
    return args


@pytest.fixture(scope="module")
def one_stage(one_rank_model_parallel):
    """The 1-rank DeepSpeed and model-parallel state (tests/conftest.py)."""
    yield


def one_stage_topology():
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
    return PipeModelDataParallelTopology(num_pp=1, num_mp=1, num_dp=1)


def build_pair(args, seed=3):
    """(GPTModel, GPTModelPipe on one stage holding GPTModel's weights)."""
    from helpers.models import gpt_model, layer_spec
    from megatron.config.model_config import transformer_config_from_args
    from megatron.model.gpt_model_pipe import GPTModelPipe

    torch.manual_seed(seed)
    reference = gpt_model(args)
    pipe = GPTModelPipe(transformer_config_from_args(args), layer_spec(args),
                        args.padded_vocab_size, args.max_position_embeddings, one_stage_topology(),
                        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights)
    pipe.load_canonical_state_dict(dict(reference.named_parameters()))
    return reference, pipe


def batch(args, with_mask=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    b, s = args.micro_batch_size, args.seq_length
    tokens = torch.randint(0, 258, (b, s), generator=g)
    out = {"tokens": tokens, "labels": torch.roll(tokens, -1, 1),
           "position_ids": torch.arange(s).expand(b, s).contiguous(),
           "loss_mask": (torch.rand(b, s, generator=g) > 0.2).float(),
           "dataset_id": torch.tensor([0, 1])}
    if with_mask:  # two packed segments, the first 3 tokens of each a (bidirectional) prefix
        out["segment_ids"] = (1 + (torch.arange(s) >= s // 2)).to(torch.int32).expand(b, s).contiguous()
        out["is_prefix"] = ((torch.arange(s) % (s // 2)) < 3).expand(b, s).contiguous()
    return out


def pipe_forward(pipe, data):
    from megatron.model.pipe_io import pipe_batch
    inputs, labels = pipe_batch(data)
    return pipe.loss_fn(pipe(inputs), labels)


@pytest.mark.parametrize("untie", [False, True])
def test_canonical_names_are_gpt_model_names(one_stage, untie):
    args = model_args(*(["--untie-embeddings-and-output-weights"] if untie else []))
    reference, pipe = build_pair(args)
    names = sorted(n for n, _ in pipe.canonical_named_parameters())
    assert names == sorted(n for n, _ in reference.named_parameters())
    assert ("output_layer.weight" in names) == untie
    assert "decoder.layers.3.mlp.linear_fc2.weight" in names
    layers = [f for f in pipe.forward_funcs if type(f).__name__ == "TransformerLayerPipe"]
    assert [f.layer.layer_number for f in layers] == [1, 2, 3, 4]


def test_pipe_starts_from_the_gpt_model_initial_weights(one_stage):
    """The layout-independent initializer, given the pipe's canonical names, draws exactly the
    weights build_gpt_model draws for the same --seed."""
    from helpers.models import gpt_model, layer_spec
    from megatron.config.model_config import transformer_config_from_args
    from megatron.model.gpt_model_pipe import GPTModelPipe
    from megatron.model.init import initialize_parameters

    args = model_args("--seed", "17")
    reference = dict(gpt_model(args).named_parameters())
    config = transformer_config_from_args(args)
    pipe = GPTModelPipe(config, layer_spec(args), args.padded_vocab_size,
                        args.max_position_embeddings, one_stage_topology())
    initialize_parameters(pipe.canonical_named_parameters(), config, args.seed)
    state = pipe.canonical_state_dict()
    assert sorted(state) == sorted(reference)
    for name, value in state.items():
        assert torch.equal(value, reference[name].detach()), name


@pytest.mark.parametrize("with_mask,untie", [(False, False), (True, False), (False, True)])
def test_one_stage_pipe_equals_gpt_model(one_stage, with_mask, untie):
    from megatron.model.lm_loss import masked_lm_loss

    args = model_args(*(["--untie-embeddings-and-output-weights"] if untie else []))
    reference, pipe = build_pair(args)
    data = batch(args, with_mask)
    from megatron.model.masks import attention_structure_from_batch
    per_token = reference(data["tokens"], data["position_ids"], None, labels=data["labels"],
                          packed_seq_params=attention_structure_from_batch(data))
    expected, expected_per_sample = masked_lm_loss(per_token, data["loss_mask"])
    pipe.loss_function.keep_token_losses = True  # as an evaluation with position buckets does
    got = pipe_forward(pipe, data)
    pipe.loss_function.keep_token_losses = False
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    (loss, per_sample, dataset_id), = pipe.loss_function.pop_records()
    torch.testing.assert_close(per_sample, expected_per_sample, rtol=1e-6, atol=1e-6)
    assert dataset_id.tolist() == [0, 1]
    assert pipe.loss_function.pop_records() == []
    (token_losses,) = pipe.loss_function.pop_token_losses()  # the per-token losses, unmasked
    torch.testing.assert_close(token_losses, per_token.detach(), rtol=1e-6, atol=1e-6)
    assert pipe.loss_function.pop_token_losses() == []


def test_stage_layers_share_one_attention_structure_per_micro_batch(one_stage, monkeypatch):
    """The transformer layers of a stage get the same AttentionStructure object for one micro batch
    (so a backend's mask is built once per micro batch, as in GPTModel), a new one for the next
    micro batch, and a new one when the tensors were changed in place."""
    import megatron.model.gpt_model_pipe as gmp

    args = model_args()
    _, pipe = build_pair(args)
    built, seen = [], []
    real_build = gmp.attention_structure_from_pipe
    monkeypatch.setattr(gmp, "attention_structure_from_pipe",
                        lambda attention: built.append(1) or real_build(attention))
    layers = [f for f in pipe.forward_funcs if isinstance(f, gmp.TransformerLayerPipe)]
    for layer in layers:
        layer.register_forward_hook(lambda m, i, o: seen.append(m.stage_attention._structure))
    assert len({id(layer.stage_attention) for layer in layers}) == 1
    first = batch(args, with_mask=True, seed=0)
    pipe_forward(pipe, first)
    assert len(built) == 1 and len(seen) == 4 and all(s is seen[0] for s in seen)
    pipe_forward(pipe, batch(args, with_mask=True, seed=1))
    assert len(built) == 2 and seen[4] is not seen[0]
    # Same tensors, changed in place: not the stale structure.
    segment_ids = torch.ones(2, 16, dtype=torch.int32)
    stage_attention = layers[0].stage_attention
    structure = stage_attention.get((segment_ids,))
    assert stage_attention.get((segment_ids,)) is structure
    segment_ids[:, 8:] = 2
    rebuilt = stage_attention.get((segment_ids,))
    assert rebuilt is not structure and rebuilt.segment_ids[0, 8] == 2
    assert stage_attention.get(()) is None


def test_tied_embedding_gradient_is_the_sum_of_both_uses(one_stage):
    """On one stage the embedding module serves the input and the output layer; its weight's gradient
    is what GPTModel's shared weight gets, and the sum of the input-only and output-only parts."""
    args = model_args()
    reference, pipe = build_pair(args)
    data = batch(args)
    pipe_forward(pipe, data).backward()
    per_token = reference(data["tokens"], data["position_ids"], None, labels=data["labels"])
    from megatron.model.lm_loss import masked_lm_loss
    masked_lm_loss(per_token, data["loss_mask"])[0].backward()
    tied = pipe.tied_modules["embed"].word_embeddings.weight
    torch.testing.assert_close(tied.grad, reference.embedding.word_embeddings.weight.grad,
                               rtol=1e-5, atol=1e-7)
    full = tied.grad.clone()
    # The two uses separately: output-only (input embedding detached) and input-only.
    from megatron.model.gpt_model_pipe import tied_output_forward
    embedding = pipe.tied_modules["embed"]
    parts = []
    for use in ("input", "output"):
        embedding.zero_grad()
        for f in pipe.forward_funcs:
            f.zero_grad() if isinstance(f, torch.nn.Module) else None
        weight = embedding.word_embeddings.weight
        from megatron.model.pipe_io import pipe_batch
        inputs, labels = pipe_batch(data)
        hidden = embedding(inputs)
        for f in pipe.forward_funcs[1:-1]:
            hidden = f(hidden)
        if use == "input":
            logits, _ = embedding.output_projection(hidden, weight=weight.detach())
        else:
            hidden = hidden.detach()
            logits = tied_output_forward(embedding, hidden)
        pipe.loss_fn(logits, labels).backward()
        parts.append(weight.grad.clone())
    pipe.loss_function.pop_records()
    assert parts[0].abs().sum() > 0 and parts[1].abs().sum() > 0
    torch.testing.assert_close(parts[0] + parts[1], full, rtol=1e-5, atol=1e-6)


def partition_counts(args, method, stages):
    """Transformer layers per stage that DeepSpeed's own partitioner gives GPTModelPipe's layers
    under ``method`` for ``stages`` stages (run on DeepSpeed's code without building a pipe)."""
    from deepspeed.runtime.pipe.module import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    from helpers.models import layer_spec
    from megatron.config.model_config import transformer_config_from_args
    from megatron.model.gpt_model_pipe import GPTModelPipe, TransformerLayerPipe, partition_method

    args.pp_partition_method = method
    specs = GPTModelPipe.layer_specs(transformer_config_from_args(args), layer_spec(args),
                                     args.padded_vocab_size, args.max_position_embeddings,
                                     share_embeddings_and_output_weights=True)
    probe = types.SimpleNamespace(_layer_specs=specs, num_stages=stages, global_rank=1,
                                  _topo=PipeModelDataParallelTopology(num_pp=stages, num_mp=1, num_dp=1),
                                  loss_fn=None)
    for name in ("_count_layer_params", "_find_layer_type", "_set_bounds"):
        setattr(probe, name, types.MethodType(getattr(PipelineModule, name), probe))
    PipelineModule._partition_layers(probe, method=partition_method(method))
    return [sum(1 for spec in specs[probe.parts[s]:probe.parts[s + 1]]
                if getattr(spec, "typename", None) is TransformerLayerPipe) for s in range(stages)]


def test_partition_methods_give_the_documented_layer_counts(one_stage):
    """docs/pipeline_parallel.md, "Partitioning": the counts of its table."""
    small = model_args("--num-layers", "4")
    assert partition_counts(small, "uniform", 2) == [2, 2]
    assert partition_counts(small, "type:transformer", 2) == [2, 2]
    assert partition_counts(small, "type:transformer|embedding", 2) == [2, 2]
    assert partition_counts(small, "parameters", 2) == [2, 2]
    six = model_args("--num-layers", "6")
    assert partition_counts(six, "type:transformer|embedding", 4) == [1, 2, 2, 1]
    assert partition_counts(six, "uniform", 3) == [2, 2, 2]
    # The docs' example: 6 layers of hidden size 64 with a 2048-token vocabulary on 3 stages. The
    # embedding (and the tied output layer) weigh about 2.6 layers: 'parameters' gives the first
    # and last stage fewer layers; BigScience's method counts each as one layer.
    docs = model_args("--num-layers", "6", vocab=2048)
    assert partition_counts(docs, "uniform", 3) == [2, 2, 2]
    assert partition_counts(docs, "type:transformer", 3) == [2, 2, 2]
    assert partition_counts(docs, "parameters", 3) == [1, 4, 1]
    assert partition_counts(docs, "type:transformer|embedding", 3) == [2, 3, 1]


def test_pipe_batch_carries_what_the_stages_need():
    from megatron.model.pipe_io import pipe_batch
    args = parse(["--seq-length", "8"])  # micro batches of 2
    data = batch(args, with_mask=True)
    inputs, labels = pipe_batch(data)
    # segment_ids, the fixed-length cu_seqlens (starts 0 and 4 of both samples, then 16), is_prefix
    assert [t.shape for t in inputs] == [(2, 8), (2, 8), (2, 8), (17,), (2, 8)]
    assert [t.dtype for t in inputs[2:]] == [torch.int32, torch.int32, torch.uint8]
    assert inputs[3].tolist() == [0, 4, 8, 12] + [16] * 13
    assert [t.shape for t in labels] == [(2, 8), (2, 8), (2,)]
    from megatron.model.gpt_model_pipe import attention_structure_from_pipe
    structure = attention_structure_from_pipe(inputs[2:])
    assert torch.equal(structure.segment_ids, data["segment_ids"])
    assert torch.equal(structure.is_prefix, data["is_prefix"])
    assert torch.equal(structure.cu_seqlens, inputs[3]) and structure.layout is None
    del data["segment_ids"], data["is_prefix"], data["dataset_id"]
    inputs, labels = pipe_batch(data)
    assert len(inputs) == 2 and len(labels) == 2
    assert attention_structure_from_pipe(inputs[2:]) is None


def test_unique_parameters_skip_the_tied_copy():
    """The tied embedding's copy on the later stage (DeepSpeed marks it ds_pipe_replicated) is left
    out of the gradient norm, so the shared weight counts once."""
    from megatron.parallel.pipe import unique_parameters
    own, tied_copy = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    tied_copy.ds_pipe_replicated = True
    assert unique_parameters([own, tied_copy]) == [own]


def test_recompute_in_the_pipe_recomputes_each_layer_with_the_same_dropout(one_stage, monkeypatch):
    """activation_checkpoint_interval 1: every transformer layer (not the embedding, norm or head)
    runs through megatron-core's checkpoint, and with dropout on the gradients equal those of the
    pipe without recompute (the recomputed forward draws the same masks)."""
    from megatron.core import tensor_parallel

    from helpers.models import layer_spec
    from megatron.config.model_config import transformer_config_from_args
    from megatron.model.gpt_model_pipe import GPTModelPipe
    from megatron.parallel.cpu_rng import model_parallel_manual_seed

    args = model_args("--hidden-dropout", "0.2", "--attention-dropout", "0.2")
    calls = []
    real = tensor_parallel.checkpoint
    monkeypatch.setattr(tensor_parallel, "checkpoint", lambda *a: calls.append(1) or real(*a))
    grads, reference_state = [], None
    for interval in (0, 1):
        torch.manual_seed(3)
        pipe = GPTModelPipe(transformer_config_from_args(args), layer_spec(args), 260,
                            args.max_position_embeddings, one_stage_topology(),
                            activation_checkpoint_interval=interval)
        pipe._precompute_checkpointable_values()  # what DeepSpeed's engine does at start-up
        if reference_state is None:  # the first pipe's weights, loaded into the second
            reference_state = {k: v.clone() for k, v in pipe.canonical_state_dict().items()}
        else:
            pipe.load_canonical_state_dict(reference_state)
        torch.manual_seed(11)
        model_parallel_manual_seed(5)  # attention dropout draws from the tracker's stream
        pipe_forward(pipe, batch(args)).backward()
        grads.append({n: p.grad.clone() for n, p in pipe.canonical_named_parameters()})
    assert len(calls) == 4  # one per transformer layer, only with interval 1
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_partition_method_matching_no_layer_is_refused():
    """--pp-partition-method type:REGEX must name a pipe layer class (good and bad input)."""
    from megatron.errors import ArgumentError
    from megatron.model.gpt_model_pipe import partition_method

    def method(value):
        return partition_method(parsed(["--pp-partition-method", value]).pp_partition_method)

    assert method("uniform") == "type:TransformerLayerPipe"
    assert method("type:transformer|embedding") == "type:transformer|embedding"
    assert method("parameters") == "parameters"
    with pytest.raises(ArgumentError, match=r"--pp-partition-method type:attention matches none of "
                                            r"the pipe's layer classes \(EmbeddingPipe, "
                                            r"TransformerLayerPipe, FinalNormPipe, OutputLayerPipe\)"):
        method("type:attention")


def test_pipe_keeps_activations_whole_under_sequence_parallelism():
    """DeepSpeed's pipe partitions the sent activation over the tensor-parallel group unless told
    not to; under --sequence-parallel each TP rank holds another slice, so the config says not to."""
    from dataclasses import replace

    from megatron.config.deepspeed_config import deepspeed_config

    def config(pp, sp):
        args = model_args()
        flags = replace(args.run_config.deepspeed, pipeline_model_parallel_size=pp,
                        sequence_parallel=sp)
        return deepspeed_config(flags, args.global_batch_size)

    assert config(2, True)["pipeline"] == {"pipe_partitioned": False, "grad_partitioned": False}
    assert "pipeline" not in config(2, False) and "pipeline" not in config(1, True)
