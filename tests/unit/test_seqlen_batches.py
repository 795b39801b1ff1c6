"""Micro batches at the sequence-length curriculum's length (megatron/train/seqlen_batches.py):
a truncated or split training step equals the step on the same tokens cut by hand (loss and
every gradient, with learned, rotary and ALiBi positions), and a packed T0 batch keeps its
attention structure: the cut batch's mask is the original's block."""
import pytest
import torch
import torch.nn.functional as F

from helpers.hf import FAMILIES, our_args, our_model
from megatron.model.masks import attention_structure_from_batch, collate_with_segment_layout, dense_allowed_mask
from megatron.schedules.seqlen_plan import SeqLengthPlan
from megatron.train.seqlen_batches import SeqLengthBatches, cut_batch
from megatron.train.steps import gpt_forward_step

SEQ = 16


class _Engine:
    """What gpt_forward_step asks of an engine: the device and the model's forward."""

    device = torch.device("cpu")

    def __init__(self, model):
        self.model = model

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)


def _batch(seed=3, batch=2):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 256, (batch, SEQ + 1), generator=g)
    loss_mask = (torch.rand(batch, SEQ, generator=g) > 0.2).float()
    return {"tokens": tokens[:, :-1], "labels": tokens[:, 1:], "loss_mask": loss_mask,
            "position_ids": torch.arange(SEQ).expand(batch, SEQ).clone(),
            "dataset_id": torch.tensor([0, 1])}


def _hand_loss(model, tokens, labels, loss_mask):
    """The masked mean cross entropy of ``model`` on hand-made rows, positions 0..k-1."""
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    logits = model(tokens, positions, None).float()  # [b, k, vocab]
    per_token = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                reduction="none").view_as(labels)
    return (per_token * loss_mask).sum() / loss_mask.sum()


def _grads(model, loss):
    model.zero_grad()
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("family", ["gpt2", "llama", "bloom"])
@pytest.mark.parametrize("mode, length", [("truncate", 8), ("truncate", 4), ("split", 8), ("split", 4)])
def test_a_cut_step_equals_the_step_on_the_same_tokens_cut_by_hand(family, mode, length, tp1):
    """The loop's path (the training iterator at the plan's length, then the GPT forward step)
    against the model on the tokens cut by hand with an independent loss: truncate keeps the
    first k tokens of every sample, split cuts each into SEQ / k rows that start at position 0."""
    model = our_model(our_args(FAMILIES[family] + ["--seq-length", str(SEQ)])).train()
    plan = SeqLengthPlan(SEQ, mode, [length, SEQ])
    batches = SeqLengthBatches(iter([_batch()]), plan)
    assert batches.start_iteration(0) == length
    cut = next(batches)
    loss, _ = gpt_forward_step(_Engine(model), cut)
    ours = _grads(model, loss)

    raw = _batch()
    if mode == "truncate":
        hand = [raw[key][:, :length] for key in ("tokens", "labels", "loss_mask")]
    else:
        hand = [raw[key].reshape(-1, length) for key in ("tokens", "labels", "loss_mask")]
    hand_loss = _hand_loss(model, *hand)
    theirs = _grads(model, hand_loss)
    torch.testing.assert_close(loss, hand_loss, rtol=1e-6, atol=1e-6)
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-5, atol=1e-7, msg=name)
    if mode == "split":  # per-sample fields follow their rows
        assert cut["dataset_id"].tolist() == [0] * (SEQ // length) + [1] * (SEQ // length)


def test_full_length_iterations_pass_the_batch_unchanged():
    plan = SeqLengthPlan(SEQ, "truncate", [8, SEQ])
    batch = _batch()
    batches = SeqLengthBatches(iter([batch, batch]), plan)
    batches.start_iteration(0)
    assert next(batches)["tokens"].shape == (2, 8)
    batches.start_iteration(5)  # past the table: its last length, the full one
    assert next(batches) is batch


def _packed_batch(prefix: bool):
    """Two packed T0 samples of SEQ tokens: segments 1, 2, 3 and padding 0 (and prefixes)."""
    segments = torch.tensor([[1] * 5 + [2] * 6 + [3] * 3 + [0] * 2,
                             [1] * 9 + [2] * 7], dtype=torch.int32)
    samples = []
    for row in segments:
        sample = {"tokens": torch.arange(SEQ), "labels": torch.arange(1, SEQ + 1),
                  "loss_mask": (row > 0).float(), "segment_ids": row,
                  "position_ids": torch.cat([torch.arange(int((row == s).sum())) for s in
                                             torch.unique_consecutive(row)])}
        if prefix:  # the first half of each segment is its input
            first = torch.cat([torch.arange(int((row == s).sum())) < int((row == s).sum()) // 2
                               for s in torch.unique_consecutive(row)])
            sample["is_prefix"] = first & (row > 0)
        samples.append(sample)
    return collate_with_segment_layout(samples)


@pytest.mark.parametrize("prefix", [False, True], ids=["causal", "prefix-lm"])
@pytest.mark.parametrize("mode, length", [("truncate", 8), ("truncate", 12), ("split", 8), ("split", 4)])
def test_packed_batches_keep_their_attention_structure(prefix, mode, length):
    """A packed T0 batch cut to k tokens: its segments and prefixes are cut with the tokens, its
    segment layout is recomputed, and every row's attention mask is the original mask's block
    (split rows do not attend across the cut)."""
    batch = _packed_batch(prefix)
    cut = cut_batch(batch, length, mode)
    full = dense_allowed_mask(attention_structure_from_batch(batch), SEQ)
    ours = dense_allowed_mask(attention_structure_from_batch(cut), length)
    if mode == "truncate":
        assert torch.equal(ours, full[:, :, :length, :length])
        assert torch.equal(cut["position_ids"], batch["position_ids"][:, :length])
    else:
        parts = SEQ // length
        blocks = torch.stack([full[b, 0, j * length:(j + 1) * length, j * length:(j + 1) * length]
                              for b in range(2) for j in range(parts)])
        assert torch.equal(ours[:, 0], blocks)
        # positions: a segment continuing from the row before restarts at 0, the others keep theirs
        # (sample 0's positions: 0-4 | 0-5 | 0-2 | 0-1; its second row starts inside segment 2)
        assert cut["position_ids"][1].tolist() == {8: [0, 1, 2, 0, 1, 2, 0, 1],
                                                  4: [0, 0, 1, 2]}[length]
    assert cut["segment_ids"].shape == (2 * (SEQ // length if mode == "split" else 1), length)
