"""megatron/model/rotary.py: ``--position-embedding-type rope`` and ``yarn`` on CPU, the same
angles as megatron-core's RotaryEmbedding and YarnRotaryEmbedding (their scalings against
transformers: tests/unit/test_rope_scaling.py), and under DeepSpeed-Ulysses the angles of each
rank's global positions. End to end through the deepspeed launcher, a YaRN model (the layout
comparison's extended model, tests/helpers/parallel.py) trains and equals its one-rank run under
every layout (TP, PP, Megatron SP, Ulysses, recompute, MoE), and the Ulysses model equals the whole
sequence's for RoPE and YaRN in tests/e2e/test_ulysses_e2e.py."""
import math

import pytest
import torch
from megatron.core.models.common.embeddings import rotary_pos_embedding as mcore_rotary
from megatron.core.models.common.embeddings import yarn_rotary_pos_embedding as mcore_yarn

from megatron.model.rotary import RotaryEmbedding, YarnRotaryEmbedding, use_device_rotary_embedding

YARN = dict(kv_channels=16, rotary_base=500, scaling_factor=4.0, original_max_position_embeddings=32,
            beta_fast=16.0, beta_slow=2.0, mscale=0.7, mscale_all_dim=0.3,
            use_cpu_initialization=True)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("percent,offset", [(1.0, 0), (0.5, 3)])
def test_cpu_embedding_equals_megatron_cores(monkeypatch, interleaved, percent, offset):
    ours = RotaryEmbedding(kv_channels=16, rotary_percent=percent, rotary_interleaved=interleaved,
                           rotary_base=500, use_cpu_initialization=True)
    emb = ours.get_emb(12, offset)
    assert emb.device.type == "cpu" and emb.shape == (12, 1, 1, int(16 * percent))
    # megatron-core's own get_emb, its GPU move pointed at the CPU
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    ref = mcore_rotary.RotaryEmbedding(kv_channels=16, rotary_percent=percent,
                                       rotary_interleaved=interleaved, rotary_base=500,
                                       use_cpu_initialization=True).get_emb(12, offset)
    torch.testing.assert_close(emb, ref, rtol=0, atol=0)
    # the formula: position p, frequency k of d/2: (p + offset) * base^(-2k/d)
    d = int(16 * percent)
    k = 1
    expected = (5 + offset) * 500 ** (-2 * k / d)
    column = 2 * k if interleaved else k
    assert math.isclose(float(emb[5, 0, 0, column]), expected, rel_tol=1e-6)


def test_gpt_model_with_rope_runs_forward_and_backward_on_cpu(dist_group):
    from megatron.core import parallel_state

    from helpers.models import gpt_model
    from megatron.config.arguments import validate_args
    from megatron.config.parser import get_parser

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    args = validate_args(get_parser().parse_args(
        ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
         "--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "1", "--lr", "1e-3",
         "--position-embedding-type", "rope", "--rotary-percent", "0.5"]), 1, require_data=False)
    args.padded_vocab_size = 128
    model = gpt_model(args)
    from megatron.parallel.cpu_rng import model_parallel_manual_seed

    model_parallel_manual_seed(args.seed)  # attention dropout runs on the model-parallel stream
    assert type(model.rotary_pos_emb) is RotaryEmbedding
    tokens = torch.randint(0, 100, (2, 16))
    positions = torch.arange(16).expand(2, 16)
    logits = model(tokens, positions, None)
    assert logits.shape == (2, 16, 128) and torch.isfinite(logits).all()
    logits.float().mean().backward()
    # rope moves information by position: shifting the input changes the logits' pattern
    with torch.no_grad():
        a = model(tokens, positions, None)
        b = model(torch.roll(tokens, 1, dims=1), positions, None)
    assert not torch.allclose(a[:, 1:], b[:, 1:])
    assert use_device_rotary_embedding(torch.nn.Linear(2, 2)).__class__ is torch.nn.Linear


@pytest.mark.parametrize("round_to_int", [True, False])
@pytest.mark.parametrize("offset", [0, 5])
def test_cpu_yarn_embedding_equals_megatron_cores(monkeypatch, round_to_int, offset):
    ours = YarnRotaryEmbedding(**YARN, correction_range_round_to_int=round_to_int)
    emb, factor = ours.get_emb(64, offset)
    assert emb.device.type == "cpu" and emb.shape == (64, 1, 1, 16)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    ref = mcore_yarn.YarnRotaryEmbedding(**YARN, correction_range_round_to_int=round_to_int)
    ref_emb, ref_factor = ref.get_emb(64, offset)
    torch.testing.assert_close(emb, ref_emb, rtol=0, atol=0)
    assert factor == ref_factor == (0.1 * 0.7 * math.log(4) + 1) / (0.1 * 0.3 * math.log(4) + 1)


@pytest.mark.parametrize("yarn", [False, True])
def test_ulysses_rank_gets_its_slice_of_the_angles(monkeypatch, yarn):
    """Under Ulysses (a 2-rank group, this rank 1) the embedding of 16 positions is the angles of
    positions 8..15 (with YaRN's attention factor alongside)."""
    import megatron.model.rotary as rotary

    class Group:
        def size(self):
            return 2

        def rank(self):
            return 1

    monkeypatch.setattr(rotary, "sequence_parallel_group", Group)
    if yarn:
        module = YarnRotaryEmbedding(**YARN)
    else:
        module = RotaryEmbedding(kv_channels=16, rotary_percent=1.0, rotary_base=500,
                                 use_cpu_initialization=True)
    module.cp_group = Group()  # megatron-core's context-parallel group is the Ulysses group
    whole = module(16)  # before sequence_sharded (YaRN's constructor): all positions
    module.sequence_sharded = True
    mine = module(16)
    if yarn:
        (whole, factor), (mine, my_factor) = whole, mine
        assert my_factor == factor != 1.0
    torch.testing.assert_close(mine, whole[8:], rtol=0, atol=0)


@pytest.mark.parametrize("tp, sequence_parallel", [(1, False), (2, True)])
@pytest.mark.parametrize("yarn", [False, True])
def test_ulysses_rank_rotates_its_slice_at_the_global_positions(monkeypatch, yarn, tp,
                                                                sequence_parallel):
    """The length GPTModel asks the embedding for, and the angles each rank gets, under Ulysses
    SP 2 (with TP 2 and Megatron's --sequence-parallel inside it: each rank's hidden states are
    a quarter of the sequence): megatron-core's length times the Ulysses size, the whole
    sequence's 16 positions, and the ranks' slices of the angles are the whole sequence's in
    order (rank 0 positions 0-7, rank 1 8-15), not positions 0-7 on both: YaRN's correction and
    attention factor the same on each. The config's context_parallel_size stays 1 (megatron-core
    would multiply by it too: megatron/parallel/topology.py). A packed batch's length is its
    whole-sequence maximum, not multiplied."""
    from types import SimpleNamespace

    from megatron.core.packed_seq_params import PackedSeqParams

    import megatron.model.rotary as rotary

    ranks = []

    class Group:
        def __init__(self, rank):
            self._rank = rank

        def size(self):
            return 2

        def rank(self):
            return self._rank

    config = SimpleNamespace(sequence_parallel=sequence_parallel, tensor_model_parallel_size=tp,
                             context_parallel_size=1)
    for rank in range(2):
        monkeypatch.setattr(rotary, "sequence_parallel_group", lambda r=rank: Group(r))
        if yarn:
            module = YarnRotaryEmbedding(**YARN)
        else:
            module = RotaryEmbedding(kv_channels=16, rotary_percent=1.0, rotary_base=500,
                                     use_cpu_initialization=True)
        module.cp_group = Group(rank)
        whole = module(16)  # not yet sharded: every position's angles
        module.sequence_sharded = True
        local_hidden = torch.zeros(16 // (2 * (tp if sequence_parallel else 1)), 1, 8)
        length = module.get_rotary_seq_len(None, None, local_hidden, config)
        assert length == 16
        packed = PackedSeqParams(qkv_format="sbhd", max_seqlen_q=16, max_seqlen_kv=16)
        assert module.get_rotary_seq_len(None, None, local_hidden, config, packed) == 16
        ranks.append((whole, module(length)))
    if yarn:
        (whole, factor), _ = ranks[0]
        assert all(f == factor != 1.0 for got in ranks for _, f in got)
        ranks = [(w[0], m[0]) for w, m in ranks]
    whole = ranks[0][0]
    assert whole.shape[0] == 16
    torch.testing.assert_close(torch.cat([mine for _, mine in ranks]), whole, rtol=0, atol=0)
    assert not torch.equal(ranks[0][1], ranks[1][1])
