"""``--embed-layernorm`` (BLOOM's LayerNorm on the word embeddings) in GPTModel and GPTModelPipe:
the model's output equals the same model fed the hand-computed normalised embeddings, the norm
equals Hugging Face's BloomModel ``word_embeddings_layernorm``, the pipe equals GPTModel and both
start from the layout-independent initial weights (ones and zeros)."""
import pytest
import torch

from helpers.flags import tiny_run_flags
from megatron.config.parser import parse_args

FLAGS = tiny_run_flags(seq_length=16, train_iters=1, data_path=None) + [
    "--hidden-dropout", "0", "--attention-dropout", "0", "--transformer-impl", "local",
    "--norm-epsilon", "1e-5", "--embed-layernorm"]
VOCAB = 256


def model_args(*extra):
    args = parse_args(FLAGS + list(extra), world_size=1, require_data=False)
    args.padded_vocab_size = VOCAB
    return args


@pytest.fixture(scope="module")
def one_rank(one_rank_model_parallel):
    """The 1-rank DeepSpeed and model-parallel state (tests/conftest.py)."""
    yield


def _randomise_norm(norm, seed=5):
    """Norm weights away from their ones/zeros init, so the norm is not the identity map."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.5 * torch.randn(norm.weight.shape, generator=g))
        norm.bias.copy_(0.5 * torch.randn(norm.bias.shape, generator=g))


def _inputs(args, seed=0):
    g = torch.Generator().manual_seed(seed)
    b, s = args.micro_batch_size, args.seq_length
    tokens = torch.randint(0, VOCAB, (b, s), generator=g)
    return tokens, torch.arange(s).expand(b, s).contiguous()


@pytest.mark.parametrize("position", ["learned_absolute", "alibi"])
def test_gpt_model_output_equals_hand_normalised_embeddings(one_rank, position):
    """logits(tokens) == logits(decoder_input = LayerNorm(W[tokens]) (+ P[positions])): the norm
    acts on the word embeddings only, before position embeddings are added (BigScience)."""
    from helpers.models import gpt_model
    from megatron.model.embedding_norm import embedding_layernorm

    args = model_args("--position-embedding-type", position)
    model = gpt_model(args).eval()
    norm = embedding_layernorm(model.embedding)
    _randomise_norm(norm)
    tokens, positions = _inputs(args)
    words = model.embedding.word_embeddings.weight[tokens]
    hand = torch.nn.functional.layer_norm(words, (args.hidden_size,), norm.weight, norm.bias,
                                          eps=1e-5)
    if position == "learned_absolute":
        hand = hand + model.embedding.position_embeddings.weight[positions]
    with torch.no_grad():
        got = model(tokens, positions, None)
        want = model(tokens, positions, None, decoder_input=hand.transpose(0, 1).contiguous())
        plain = model(tokens, positions, None,
                      decoder_input=(words + (model.embedding.position_embeddings.weight[positions]
                                              if position == "learned_absolute" else 0)
                                     ).transpose(0, 1).contiguous())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (got - plain).abs().max() > 1e-2  # the norm changes the output


def test_norm_equals_huggingface_bloom_word_embeddings_layernorm(one_rank):
    from transformers import BloomConfig, BloomModel

    from helpers.models import gpt_model
    from megatron.model.embedding_norm import embedding_layernorm

    args = model_args("--position-embedding-type", "alibi")
    model = gpt_model(args).eval()
    norm = embedding_layernorm(model.embedding)
    _randomise_norm(norm)
    bloom = BloomModel(BloomConfig(vocab_size=VOCAB, hidden_size=64, n_layer=1, n_head=4,
                                   layer_norm_epsilon=1e-5)).eval()
    with torch.no_grad():
        bloom.word_embeddings.weight.copy_(model.embedding.word_embeddings.weight)
        bloom.word_embeddings_layernorm.weight.copy_(norm.weight)
        bloom.word_embeddings_layernorm.bias.copy_(norm.bias)
        tokens, _ = _inputs(args, seed=1)
        ours = model.embedding.word_embeddings(tokens)
        theirs = bloom.word_embeddings_layernorm(bloom.word_embeddings(tokens))
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)


def _pipe(args):
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    from helpers.models import layer_spec
    from megatron.config.model_config import transformer_config_from_args
    from megatron.model.alibi import model_position_embedding_type
    from megatron.model.gpt_model_pipe import GPTModelPipe

    return GPTModelPipe(transformer_config_from_args(args), layer_spec(args), VOCAB,
                        args.max_position_embeddings,
                        PipeModelDataParallelTopology(num_pp=1, num_mp=1, num_dp=1),
                        position_embedding_type=model_position_embedding_type(
                            args.position_embedding_type),
                        embed_layernorm=args.embed_layernorm)


@pytest.mark.parametrize("position", ["learned_absolute", "alibi"])
def test_pipe_equals_gpt_model_and_starts_from_the_same_weights(one_rank, position):
    from helpers.models import gpt_model
    from megatron.config.model_config import transformer_config_from_args
    from megatron.model.embedding_norm import embedding_layernorm
    from megatron.model.init import initialize_parameters
    from megatron.model.lm_loss import masked_lm_loss
    from megatron.model.pipe_io import pipe_batch

    args = model_args("--position-embedding-type", position, "--seed", "11")
    reference = gpt_model(args)
    pipe = _pipe(args)
    initialize_parameters(pipe.canonical_named_parameters(), transformer_config_from_args(args),
                          args.seed)
    state = pipe.canonical_state_dict()
    want = dict(reference.named_parameters())
    assert sorted(state) == sorted(want)
    for name, value in state.items():  # the layout-independent init, norm included
        assert torch.equal(value, want[name].detach()), name
    assert torch.equal(state["embedding.word_embeddings.norm.weight"], torch.ones(64))
    assert torch.equal(state["embedding.word_embeddings.norm.bias"], torch.zeros(64))

    _randomise_norm(embedding_layernorm(reference.embedding))
    pipe.load_canonical_state_dict(dict(reference.named_parameters()))
    tokens, positions = _inputs(args, seed=2)
    data = {"tokens": tokens, "position_ids": positions, "labels": torch.roll(tokens, -1, 1),
            "loss_mask": torch.ones(tokens.shape)}
    with torch.no_grad():
        expected, _ = masked_lm_loss(reference(tokens, positions, None, labels=data["labels"]),
                                     data["loss_mask"])
        inputs, labels = pipe_batch(data)
        got = pipe.loss_fn(pipe(inputs), labels)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def test_tied_output_copy_has_no_embedding_norm(one_rank):
    """On a last stage the tied embedding module only lends its weight to the output layer: it is
    built without the norm (no unused parameters there)."""
    from helpers.models import layer_spec
    from megatron.config.model_config import transformer_config_from_args
    from megatron.model.gpt_model_pipe import GPTModelPipe

    args = model_args()
    specs = GPTModelPipe.layer_specs(transformer_config_from_args(args), layer_spec(args),
                                     VOCAB, args.max_position_embeddings, embed_layernorm=True)
    first, last = specs[0].build(), specs[-1].build()
    assert [n for n, _ in first.named_parameters() if ".norm." in n] == [
        "embedding.word_embeddings.norm.weight", "embedding.word_embeddings.norm.bias"]
    assert [n for n, _ in last.named_parameters() if ".norm." in n] == []


def test_without_the_flag_there_is_no_norm(one_rank):
    from helpers.models import gpt_model

    args = parse_args([f for f in FLAGS if f != "--embed-layernorm"], world_size=1,
                      require_data=False)
    args.padded_vocab_size = VOCAB
    assert not any("word_embeddings.norm" in n for n, _ in gpt_model(args).named_parameters())


@pytest.mark.parametrize("sequence_parallel, reduce_scatter, tagged", [
    (False, False, False), (True, False, False), (True, True, True)])
def test_norm_parameters_tagged_sequence_parallel_only_when_fed_a_sequence_slice(
        sequence_parallel, reduce_scatter, tagged):
    """Under --sequence-parallel without position embeddings megatron-core reduce-scatters the
    word embeddings along the sequence, so the norm's gradients are partial sums over the
    tensor-parallel group (tagged, summed by megatron/parallel/grads.py); with learned position
    embeddings it sees the whole sequence (untagged: summing would count it TP times)."""
    import types

    from megatron.model.embedding_norm import add_embedding_layernorm

    embedding = types.SimpleNamespace(word_embeddings=torch.nn.Embedding(8, 16),
                                      reduce_scatter_embeddings=reduce_scatter)
    config = types.SimpleNamespace(hidden_size=16, layernorm_epsilon=1e-5,
                                   params_dtype=torch.float32, sequence_parallel=sequence_parallel)
    norm = add_embedding_layernorm(embedding, config)
    assert [p.sequence_parallel for p in norm.parameters()] == [tagged, tagged]
    out = embedding.word_embeddings(torch.tensor([[1, 2]]))
    torch.testing.assert_close(out.mean(-1), norm.bias.detach().mean().expand(1, 2))
