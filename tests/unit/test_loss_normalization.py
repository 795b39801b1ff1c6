"""The objective as a property of the data (megatron/optim/loss_normalization.py): per-sample masks and
loss weights against hand computations; on a real model and DeepSpeed engine (one rank, packed
T0 batches with uneven target lengths), one iteration at micro-batch sizes 1, 2 and 8 gives the
same loss, gradient and evaluation loss under --calculate-per-token-loss and
--calculate-per-sample-loss, and a different one under the default; dataset loss weights give the
hand-computed weighted mean while the per-dataset losses stay unweighted; DeepSpeed's pipe
accumulation bug is refused. (Layouts: tests/e2e/test_pipeline_parallel.py runs the T0 model under
PP 2 x DP 2 x EP 2, Ulysses SP 2 and DP 2 with these normalisations against one rank at another
micro-batch size.)"""
import math

import pytest
import torch

from megatron.model.lm_loss import masked_lm_loss
from megatron.optim.loss_normalization import IterationLoss, LossNormalizer, LossWeights, per_sample_mask


def test_per_sample_mask_gives_each_sample_or_segment_weight_one():
    mask = torch.tensor([[1., 1., 1., 0.], [0., 1., 0., 0.], [0., 0., 0., 0.]])
    out = per_sample_mask(mask, None)
    assert out.sum(dim=1).tolist() == [1.0, 1.0, 0.0]
    assert out[0].tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0])
    segments = torch.tensor([[1, 1, 2, 2], [1, 1, 1, 0], [0, 0, 0, 0]])
    mask = torch.tensor([[0., 1., 1., 1.], [1., 1., 0., 0.], [0., 0., 0., 0.]])
    out = per_sample_mask(mask, segments)
    assert out.tolist() == [[0, 1, 0.5, 0.5], [0.5, 0.5, 0, 0], [0, 0, 0, 0]]


def test_loss_weights_give_the_hand_computed_weighted_mean():
    """Two micro batches, three samples of datasets 0, 1, 0 with weights 1 and 3: the iteration's
    per-token loss (the micro batches' backward losses over dp x GAS) is
    sum(W x token loss) / sum(W) over the loss tokens, whatever the split."""
    torch.manual_seed(0)
    per_token = torch.rand(3, 5) * 4
    mask = torch.tensor([[1., 1., 0., 0., 0.], [1., 1., 1., 1., 0.], [0., 1., 1., 1., 1.]])
    ids = torch.tensor([0, 1, 0])
    w = torch.tensor([1.0, 3.0, 1.0])
    want = float((per_token * mask * w[:, None]).sum() / (mask * w[:, None]).sum())
    normalizer = LossNormalizer("token", loss_weights=LossWeights([1.0, 3.0]))
    for split in ([0, 1, 2], [0, 1], [0]):  # one micro batch of 3, or 2 + 1, or 1 + 2
        rows = [list(range(0, len(split))), list(range(len(split), 3))]
        batches = [normalizer.prepare({"loss_mask": mask[r], "dataset_id": ids[r]}) for r in rows]
        weights = normalizer.weigh(batches, "cpu")
        total = sum(float(weights.backward_loss(m, masked_lm_loss(per_token[r], b["loss_mask"])[0]))
                    for m, (r, b) in enumerate(zip(rows, batches, strict=True)))
        assert total / len(batches) == pytest.approx(want, rel=1e-6)  # / (dp x GAS), dp 1
    # the micro-batch mean weighs its own tokens only
    batch = LossWeights([1.0, 3.0]).apply({"loss_mask": mask, "dataset_id": ids})
    loss, per_sample = masked_lm_loss(per_token, batch["loss_mask"])
    assert float(loss) == pytest.approx(want, rel=1e-6)
    # per-sample losses stay unweighted token means
    assert per_sample.tolist() == pytest.approx(((per_token * mask).sum(1) / mask.sum(1)).tolist())


def test_a_loss_weight_below_one_on_few_tokens_keeps_the_means():
    """A weighted mask summing to less than 1 (loss weight 0.05 on one or two tokens) is divided
    by its own sum: the micro batch's loss is its weighted mean and each sample's loss its
    unweighted mean (the per-dataset losses the log and the adaptive mixer read); only an empty
    mask counts as one token."""
    per_token = torch.tensor([[1.0, 2.0, 4.0], [3.0, 5.0, 7.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[0.0, 0.0, 0.05], [0.0, 0.05, 0.05], [0.0, 0.0, 0.0]])
    loss, per_sample = masked_lm_loss(per_token, mask)
    assert float(loss) == pytest.approx((4.0 + 5.0 + 7.0) / 3)
    assert per_sample.tolist() == pytest.approx([4.0, 6.0, 0.0])
    weights = LossNormalizer("sample", loss_weights=LossWeights([0.05])).weigh(
        [{"loss_mask": mask[:1]}], "cpu")
    assert float(weights.factors[0]) == pytest.approx(1.0)  # 0.05 / 0.05, not 0.05 / 1


def test_the_micro_batch_mode_backpropagates_the_mean():
    weights = LossNormalizer("micro-batch").weigh([{"loss_mask": torch.ones(2, 3)}] * 2, "cpu")
    assert isinstance(weights, IterationLoss) and weights.counts == [1.0, 1.0]
    loss = torch.tensor(2.5)
    assert weights.backward_loss(1, loss) is loss


# ------------------------------------------------------------------ on a real engine
@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    from tools.make_toy_multitask import make_toy_multitask
    return make_toy_multitask(str(tmp_path_factory.mktemp("toy_objective")), examples_per_task=60,
                              preprocess=True, rank_eval_per_task=2, pretrain_docs=5)


def _flags(toy, cache, micro_batch_size, extra=()):
    train = ", ".join(f"1 0:1 {toy['train_' + t]}" for t in ("sentiment", "copy", "addition"))
    return ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
            "--seq-length", "96", "--transformer-impl", "local", "--hidden-dropout", "0",
            "--attention-dropout", "0", "--seed", "5", "--micro-batch-size", str(micro_batch_size),
            "--global-batch-size", "8", "--train-iters", "2", "--optimizer", "sgd",
            "--sgd-momentum", "0", "--lr", "1.0", "--lr-decay-style", "constant",
            "--weight-decay", "0", "--clip-grad", "0", "--train-weighted-split-paths",
            f"TRAIN: {train}", "--data-cache-path", str(cache), "--eval-iters", "1", *extra]


def _one_iteration(toy, cache, micro_batch_size, extra=()):
    """(logged loss, per-dataset losses, token shares, evaluation loss of the same batch, the
    parameters' change = -gradient) of one iteration at ``micro_batch_size``."""
    import finetune_t0
    from helpers.models import model_for_layout
    from megatron.config.tokenizer_flags import apply_tokenizer_setup
    from megatron.data.train_data import EvalGroup
    from megatron.train.engine_setup import loss_normalizer, setup_model_and_optimizer
    from megatron.train.evaluation import evaluate
    from megatron.train.loader import _loader
    from megatron.train.stats import _IntervalStats
    from megatron.train.steps import gpt_forward_step, step_functions

    args = finetune_t0.parse_t0_args(_flags(toy, cache, micro_batch_size, extra))
    apply_tokenizer_setup(args)
    data = finetune_t0.datasets_provider(args)
    engine, _, _ = setup_model_and_optimizer(args.run_config, model_for_layout(args),
                                             args.global_batch_size)
    normalizer = loss_normalizer(args.run_config.loss, data, args.data_parallel_size)
    steps = step_functions(engine, gpt_forward_step, normalizer)
    before = [p.detach().clone() for p in engine.module.parameters()]
    evaluation = evaluate(engine, args.run_config.loop, EvalGroup("train", data.train), steps, 0).loss
    stats = _IntervalStats(len(data.dataset_names))
    steps.train_step(engine, _loader(data.train, 0, args.run_config.loop), 8 // micro_batch_size, stats, False)
    loss, dataset_loss, dataset_count, dataset_tokens = stats.reduced()
    names = data.dataset_names
    per_dataset = {n: float(dataset_loss[i] / dataset_count[i]) for i, n in enumerate(names)
                   if dataset_count[i] > 0}
    share = {n: float(dataset_tokens[i] / dataset_tokens.sum()) for i, n in enumerate(names)}
    delta = torch.cat([(p.detach() - b).view(-1) for p, b in zip(engine.module.parameters(), before, strict=True)])
    return loss, per_dataset, share, evaluation, delta


@pytest.mark.parametrize("flag", ["--calculate-per-token-loss", "--calculate-per-sample-loss"])
def test_normalised_loss_and_gradient_do_not_depend_on_the_micro_batch_size(
        flag, toy, tmp_path, one_rank_model_parallel):
    runs = {m: _one_iteration(toy, tmp_path / "cache", m, [flag]) for m in (1, 2, 8)}
    loss, per_dataset, _, evaluation, delta = runs[8]
    assert torch.linalg.vector_norm(delta) > 0
    for m in (1, 2):
        got = runs[m]
        assert got[0] == pytest.approx(loss, rel=1e-5)
        assert got[1] == pytest.approx(per_dataset, rel=1e-5)
        assert got[3] == pytest.approx(evaluation, rel=1e-5)
        torch.testing.assert_close(got[4], delta, rtol=1e-4, atol=1e-6)


def test_the_default_depends_on_the_micro_batch_size_and_equals_per_token_in_one_micro_batch(
        toy, tmp_path, one_rank_model_parallel):
    one, eight = (_one_iteration(toy, tmp_path / "cache", m) for m in (1, 8))
    per_token = _one_iteration(toy, tmp_path / "cache", 1, ["--calculate-per-token-loss"])
    assert abs(one[0] - eight[0]) > 1e-4  # the mean of 8 micro-batch means vs the token mean
    assert torch.linalg.vector_norm(one[4] - eight[4]) > 1e-3 * torch.linalg.vector_norm(eight[4])
    assert per_token[0] == pytest.approx(eight[0], rel=1e-5)  # one micro batch: its token mean
    torch.testing.assert_close(per_token[4], eight[4], rtol=1e-4, atol=1e-6)


def test_dataset_loss_weights_weigh_the_loss_not_the_per_dataset_losses(
        toy, tmp_path, one_rank_model_parallel):
    """--dataset-loss-weights: the loss is sum(W_d x tokens_d x loss_d) / sum(W_d x tokens_d)
    from the unweighted run's per-dataset token means and token shares (the same model, the same
    batch), the per-dataset losses are unweighted, and the token shares are the weighted ones."""
    flags = ["--calculate-per-token-loss"]
    plain = _one_iteration(toy, tmp_path / "cache", 2, flags)
    weights = {"train_sentiment": 1.0, "train_copy": 4.0, "train_addition": 0.5}
    weighted = _one_iteration(toy, tmp_path / "cache", 2, flags + ["--dataset-loss-weights"] + [
        f"{name}={w:g}" for name, w in weights.items()])
    _, losses, shares, _, _ = plain
    want = (sum(weights[n] * shares[n] * losses[n] for n in losses)
            / sum(weights[n] * shares[n] for n in losses))
    assert weighted[0] == pytest.approx(want, rel=1e-5)
    assert not math.isclose(weighted[0], plain[0], rel_tol=1e-3)
    assert weighted[1] == pytest.approx(losses, rel=1e-6)  # unweighted per-dataset losses
    total = sum(weights[n] * shares[n] for n in shares)
    assert weighted[2] == pytest.approx({n: weights[n] * shares[n] / total for n in shares})


def test_dataset_loss_weights_are_checked(toy, tmp_path, one_rank_model_parallel):
    from megatron.errors import ConfigError

    with pytest.raises(SystemExit):
        _one_iteration(toy, tmp_path / "cache", 2, ["--dataset-loss-weights", "copy"])
    with pytest.raises(ConfigError, match="--dataset-loss-weights: nope is not a training dataset; "
                                          "the training datasets are train_sentiment, train_copy, "
                                          "train_addition"):
        _one_iteration(toy, tmp_path / "cache", 2, ["--dataset-loss-weights", "nope=2"])


def test_deepspeeds_pipe_accumulation_bug_is_refused():
    from megatron.parallel.pipe import pipe_accumulation_problem

    for version in ("0.18.3", "0.19.0", "0.19.2"):
        problem = pipe_accumulation_problem(version, 2, 4)
        assert "issue #8152" in problem and f"DeepSpeed {version}" in problem
        assert "deepspeed>=0.19.4" in problem
    for version, pp, micro in (("0.19.4", 2, 4), ("0.18.2", 2, 4), ("0.19.1", 1, 4),
                               ("0.19.1", 2, 1), ("0.19.8+cpu", 4, 8)):
        assert pipe_accumulation_problem(version, pp, micro) is None
