"""Padding rows of the vocabulary take no probability (megatron/model/vocab_padding.py): the
logits of rows at or beyond the tokenizer's vocabulary are -inf in GPTModel and GPTModelPipe, the
loss and log-probabilities equal a model with exactly the real rows, and padding rows get no
gradient. The TP/PP layouts under default flags are compared end to end in
tests/e2e/test_parallel_layouts_e2e.py (no --make-vocab-size-divisible-by there)."""
import pytest
import torch

from megatron.config.parser import parse_args

FLAGS = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
         "--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "1", "--lr", "1e-3",
         "--hidden-dropout", "0", "--attention-dropout", "0", "--transformer-impl", "local"]
REAL, PADDED = 258, 384  # the byte-level vocabulary and its TP 1 padding


@pytest.fixture(scope="module")
def one_rank(one_rank_model_parallel):
    yield


def model_args(vocab_size, padded, *extra):
    args = parse_args(FLAGS + list(extra), world_size=1, require_data=False)
    args.padded_vocab_size, args.vocab_size = padded, vocab_size
    return args


@pytest.mark.parametrize("vocab,padded,tp,expected", [
    (258, 384, 1, [258]),                     # one rank: padding from column 258
    (258, 512, 2, [None, 2]),                 # rank 0 all real; rank 1 from local column 2
    (258, 512, 4, [None, None, 2, 0]),        # rank 3 holds only padding
    (512, 512, 2, [None, None]),              # no padding
    (None, 512, 2, [None, None]),             # unknown vocabulary: nothing masked
])
def test_local_padding_start(vocab, padded, tp, expected):
    from megatron.model.vocab_padding import local_padding_start

    assert [local_padding_start(vocab, padded, r, tp) for r in range(tp)] == expected


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, REAL, (2, 16), generator=g)
    labels = torch.randint(0, REAL, (2, 16), generator=g)
    return tokens, torch.arange(16).expand(2, 16).contiguous(), labels


def test_gpt_model_padding_rows_take_no_probability_and_no_gradient(one_rank):
    """GPTModel with 384 rows of which 258 are real: padding logits are -inf; the per-token loss
    equals log-softmax over the first 258 logits of the unmasked model (a model of exactly the
    real rows); the tied embedding's padding rows get a zero gradient, the real rows do not."""
    from helpers.models import gpt_model

    masked = gpt_model(model_args(REAL, PADDED))
    plain = gpt_model(model_args(None, PADDED))  # same seed: same weights, no mask
    assert torch.equal(masked.embedding.word_embeddings.weight,
                       plain.embedding.word_embeddings.weight)
    tokens, positions, labels = _batch()
    logits = masked(tokens, positions, None).float()  # [b, s, v]
    assert logits.shape[-1] == PADDED
    assert torch.isneginf(logits[..., REAL:]).all() and torch.isfinite(logits[..., :REAL]).all()
    reference = plain(tokens, positions, None).float()[..., :REAL]
    expected = -torch.log_softmax(reference, dim=-1).gather(-1, labels[..., None])[..., 0]
    loss = masked(tokens, positions, None, labels=labels)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    loss.sum().backward()
    grad = masked.embedding.word_embeddings.weight.grad
    assert torch.count_nonzero(grad[REAL:]) == 0
    assert torch.count_nonzero(grad[:REAL]) > 0


def test_two_paddings_are_one_model(one_rank):
    """Rows padded to 384 and to 512 (TP 1 and TP 2 under the default divisor): the same initial
    real rows and the same loss."""
    from helpers.models import gpt_model

    small = gpt_model(model_args(REAL, 384))
    large = gpt_model(model_args(REAL, 512))
    torch.testing.assert_close(small.embedding.word_embeddings.weight[:REAL],
                               large.embedding.word_embeddings.weight[:REAL], rtol=0, atol=0)
    tokens, positions, labels = _batch(1)
    torch.testing.assert_close(small(tokens, positions, None, labels=labels),
                               large(tokens, positions, None, labels=labels), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("untie", [False, True])
def test_pipe_logits_mask_the_padding_rows(one_rank, untie):
    """GPTModelPipe's tied (EmbeddingPipe.logits) and untied (OutputLayerPipe) output layers give
    -inf for the padding rows, so the last stage's loss is the real-rows softmax."""
    from megatron.config.model_config import transformer_config_from_args
    from megatron.model.gpt_model_pipe import EmbeddingPipe, OutputLayerPipe

    config = transformer_config_from_args(model_args(REAL, PADDED))
    layer = (OutputLayerPipe(config, PADDED, REAL) if untie else
             EmbeddingPipe(config, PADDED, 16, "none", real_vocab_size=REAL))
    hidden = torch.randn(16, 2, 32)
    logits = layer(hidden) if untie else layer.logits(hidden)
    assert torch.isneginf(logits[..., REAL:]).all() and torch.isfinite(logits[..., :REAL]).all()
