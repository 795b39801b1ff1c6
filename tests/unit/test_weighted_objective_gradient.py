"""The gradient of the loss-weighted objective is the weighted sum of the datasets' gradients
(issue 46 item 2): with per-dataset loss weights ``lambda`` (``loss_weight:``, or an adaptive
mixer's ``target: loss_weight``), one iteration's gradient as the loop computes it (the project's
loss path: megatron/optim/loss_normalization.py ``LossNormalizer`` prepares and weighs the micro
batches, megatron/model/lm_loss.py ``masked_lm_loss`` reduces the per-token losses, each micro
batch's backward loss taken over the accumulation steps as DeepSpeed's engine does) equals

    grad = sum_i lambda_i grad L_i,   L_i = S_i / Z

``S_i`` dataset ``i``'s masked loss sum over the global batch (its tokens' losses, each segment's
normalised to its mean under --calculate-per-sample-loss) and ``Z = sum_j lambda_j n_j`` the
global weighted loss-token count, computed here dataset by dataset, by hand. Equivalently
``grad = sum_i alpha_i grad mean_i`` with ``alpha_i = lambda_i n_i / Z`` on the simplex (DoReMi's
form). It holds under --calculate-per-token-loss and --calculate-per-sample-loss (packed T0
segments too) at micro-batch splits of 1, 2 and 4 and in any sample order. Megatron-LM's default
(each micro batch's own mean) holds it in one micro batch only: by design it depends on the
split. The model is a small real one (embedding, linear head, cross entropy per token)."""
import pytest
import torch

from megatron.model.lm_loss import masked_lm_loss
from megatron.optim.loss_normalization import LossNormalizer, LossWeights

VOCAB, HIDDEN, B, S = 11, 6, 8, 10
LAMBDA = [2.0, 0.3, 0.05]  # weights below 1 on short samples too (a few loss tokens each)
DATASET = torch.tensor([0, 1, 2, 0, 1, 0, 2, 1])


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(VOCAB, HIDDEN), torch.nn.Linear(HIDDEN, VOCAB))


def _per_token(model, tokens, labels):
    logits = model(tokens)
    return torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), labels.reshape(-1),
                                             reduction="none").view(labels.shape)


def _global_batch(packed: bool):
    """8 samples of 10 tokens; loss masks of 0 to 9 tokens (sample 7 has none); packed: each
    sample two or three T0 segments, the loss on each segment's target tokens."""
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (B, S), generator=g)
    labels = torch.randint(0, VOCAB, (B, S), generator=g)
    lengths = [9, 1, 2, 5, 3, 7, 1, 0]
    mask = torch.zeros(B, S)
    for b, n in enumerate(lengths):
        mask[b, S - n:] = 1.0
    batch = {"tokens": tokens, "labels": labels, "loss_mask": mask, "dataset_id": DATASET}
    if packed:
        cuts = [(3, 7), (4,), (2, 6), (5,), (3, 8), (6,), (2, 5), (4,)]
        seg = torch.zeros(B, S, dtype=torch.long)
        mask = torch.zeros(B, S)
        for b, cut in enumerate(cuts):
            edges = [0, *cut, S]
            for k in range(len(edges) - 1):
                seg[b, edges[k]:edges[k + 1]] = k + 1
                target = max(edges[k + 1] - 1 - (b + k) % 3, edges[k] + 1)  # 1 to 3 target tokens
                mask[b, target:edges[k + 1]] = 1.0 if b != 7 else 0.0
        batch.update(loss_mask=mask, segment_ids=seg)
    return batch


def _rows(batch, rows):
    return {k: v[rows] for k, v in batch.items()}


def _iteration_gradient(mode: str, packed: bool, batch, micro_batches: int, order):
    """The loop's gradient of one iteration: the global batch in sample ``order`` cut into
    ``micro_batches`` micro batches, prepared and weighed by the project's normaliser, each
    micro batch's backward loss (``masked_lm_loss`` of its prepared mask times its factor) over
    the accumulation steps (DeepSpeed's engine: dp 1, GAS ``micro_batches``)."""
    model = _model()
    normalizer = LossNormalizer(mode, packed=packed, loss_weights=LossWeights(LAMBDA))
    size = B // micro_batches
    raw = [_rows(batch, order[m * size:(m + 1) * size]) for m in range(micro_batches)]
    prepared = [normalizer.prepare(b) for b in raw]
    weights = normalizer.weigh(prepared, "cpu")
    for m, b in enumerate(prepared):
        loss, _ = masked_lm_loss(_per_token(model, b["tokens"], b["labels"]), b["loss_mask"])
        (weights.backward_loss(m, loss) / micro_batches).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def _objective_mask(batch, mode: str, packed: bool):
    """Each token's weight in its dataset's loss sum ``S_i``, by hand: the loss mask, each
    sample's (packed: each segment's) normalised to sum 1 under --calculate-per-sample-loss."""
    mask = batch["loss_mask"].clone()
    if mode != "sample":
        return mask
    for b in range(B):
        groups = batch["segment_ids"][b].unique().tolist() if packed else [None]
        for k in groups:
            where = (batch["segment_ids"][b] == k) if packed else torch.ones(S, dtype=torch.bool)
            n = float(mask[b][where].sum())
            if n > 0:
                mask[b][where] = mask[b][where] / n
    return mask


def _weighted_sum_of_dataset_gradients(mode: str, packed: bool, batch):
    """``(sum_i lambda_i grad L_i, sum_i alpha_i grad mean_i)``: dataset by dataset, each its own
    forward and backward of ``L_i = S_i / Z`` (and of its mean ``S_i / n_i``)."""
    mask = _objective_mask(batch, mode, packed)
    n = [float(mask[DATASET == i].sum()) for i in range(len(LAMBDA))]
    z = sum(w * c for w, c in zip(LAMBDA, n, strict=True))
    alpha = [w * c / z for w, c in zip(LAMBDA, n, strict=True)]
    assert sum(alpha) == pytest.approx(1.0)
    by_lambda, by_alpha = 0.0, 0.0
    for i in range(len(LAMBDA)):
        rows = (DATASET == i).nonzero().view(-1)
        model = _model()
        s_i = (_per_token(model, batch["tokens"][rows], batch["labels"][rows]) * mask[rows]).sum()
        s_i.backward()
        grad_s = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        by_lambda = by_lambda + LAMBDA[i] * grad_s / z  # lambda_i grad (S_i / Z)
        by_alpha = by_alpha + alpha[i] * grad_s / n[i]  # alpha_i grad (S_i / n_i)
    return by_lambda, by_alpha


ORDERS = {"in order": list(range(B)), "shuffled": [5, 2, 7, 0, 3, 6, 1, 4]}


@pytest.mark.parametrize("mode,packed", [("token", False), ("token", True), ("sample", False),
                                         ("sample", True)])
@pytest.mark.parametrize("micro_batches", [1, 2, 4])
@pytest.mark.parametrize("order", sorted(ORDERS))
def test_the_gradient_is_the_weighted_sum_of_the_datasets_gradients(mode, packed, micro_batches,
                                                                     order):
    batch = _global_batch(packed)
    want, doremi_form = _weighted_sum_of_dataset_gradients(mode, packed, batch)
    assert torch.allclose(want, doremi_form, rtol=1e-5, atol=1e-7)
    got = _iteration_gradient(mode, packed, batch, micro_batches, ORDERS[order])
    assert float(want.abs().max()) > 1e-3  # not a vacuous comparison
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-7), float((got - want).abs().max())


@pytest.mark.parametrize("packed", [False, True])
def test_the_default_normalisation_holds_it_in_one_micro_batch_only(packed):
    """Megatron-LM's default: each micro batch's own weighted mean, averaged over the micro
    batches; in one micro batch that is the per-token objective, split it is not."""
    batch = _global_batch(packed)
    want, _ = _weighted_sum_of_dataset_gradients("token", packed, batch)
    one = _iteration_gradient("micro-batch", packed, batch, 1, ORDERS["in order"])
    assert torch.allclose(one, want, rtol=1e-5, atol=1e-7)
    for micro_batches in (2, 4):
        split = _iteration_gradient("micro-batch", packed, batch, micro_batches, ORDERS["in order"])
        assert float((split - want).abs().max()) > 1e-3 * float(want.abs().max())
