"""The sequence-parallel gradient sum (megatron/parallel/grads.py) on real DeepSpeed engines, in one
process: it runs once per optimizer step on the accumulated gradients (one flattened all-reduce)
for ZeRO 0 and 1, plain and pipe engines, fp32 and bf16; under ZeRO 2 once per step on the
rank's gradient partition (both of DeepSpeed's partition layouts); ZeRO-Offload keeps the
per-parameter fallback.

The tensor-parallel group is a 1-rank group whose all-reduce is replaced by "times 2", what the sum
over two tensor-parallel ranks holding the same gradients gives. Each run is compared with plain
torch: the sequence-parallel parameters' accumulated gradients doubled once per step, the others
untouched (SGD, so the update shows the gradient itself)."""
import copy

import pytest
import torch

from megatron.parallel.grads import PER_MICRO_BATCH, PER_PARTITION, PER_STEP, install_sequence_parallel_grad_allreduce

MICRO_BATCHES, STEPS, LR = 3, 2, 0.1


@pytest.fixture(scope="module")
def tp_group(one_rank_model_parallel):
    return torch.distributed.new_group([0])


@pytest.fixture
def tp_all_reduces(monkeypatch, tp_group):
    """Every all-reduce over ``tp_group`` doubles its tensor and is recorded (a copy of what was
    summed); other all-reduces run."""
    real = torch.distributed.all_reduce
    seen = []

    def all_reduce(tensor, op=torch.distributed.ReduceOp.SUM, group=None, async_op=False):
        if group is tp_group:
            seen.append(tensor.detach().clone().float())
            tensor.mul_(2)
            return None
        return real(tensor, op=op, group=group, async_op=async_op)

    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    return seen


def _layers():
    torch.manual_seed(0)
    layers = [torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 1)]
    for p in layers[1].parameters():  # as megatron-core tags the norms under sequence parallelism
        p.sequence_parallel = True
    return layers


def _inputs():
    g = torch.Generator().manual_seed(1)
    return [torch.randn(2, 8, generator=g) for _ in range(MICRO_BATCHES * STEPS)]


def _loss(out, _labels=None):
    return out.float().pow(2).mean()


def _reference():
    """(accumulated sequence-parallel gradients per step, final parameters) of plain torch."""
    model = torch.nn.Sequential(*_layers())
    sp = [p for p in model.parameters() if getattr(p, "sequence_parallel", False)]
    xs, summed = _inputs(), []
    for step in range(STEPS):
        model.zero_grad()
        for x in xs[step * MICRO_BATCHES:(step + 1) * MICRO_BATCHES]:
            (_loss(model(x)) / MICRO_BATCHES).backward()
        summed.append(torch.cat([p.grad.flatten() for p in sp]))
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad * (2 if getattr(p, "sequence_parallel", False) else 1)
    return summed, [p.detach().clone() for p in model.parameters()]


def _train(stage, dtype, pipe, tp_group, zero_extra=None, data_types=None, config_extra=None):
    import deepspeed
    from deepspeed.pipe import PipelineModule

    layers = _layers()
    model = (PipelineModule(layers=layers, num_stages=1, loss_fn=_loss) if pipe
             else torch.nn.Sequential(*layers))
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": MICRO_BATCHES,
              "zero_optimization": {"stage": stage, **(zero_extra or {})},
              "zero_allow_untested_optimizer": True, "data_types": data_types or {},
              **(config_extra or {}),
              "gradient_clipping": 0.0, "bf16": {"enabled": dtype == torch.bfloat16}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR),
                                      config=config, dist_init_required=False)
    when = install_sequence_parallel_grad_allreduce(engine, tp_group)
    xs = [x.to(dtype) for x in _inputs()]
    for step in range(STEPS):
        batch = xs[step * MICRO_BATCHES:(step + 1) * MICRO_BATCHES]
        if pipe:
            engine.train_batch(data_iter=iter([(x, x) for x in batch]))
        else:
            for x in batch:
                engine.backward(_loss(engine(x)))
                engine.step()
    return when, [copy.deepcopy(p.detach()).float() for p in engine.module.parameters()]


@pytest.mark.parametrize("stage,dtype,pipe", [
    (0, torch.float32, False), (1, torch.float32, False), (0, torch.bfloat16, False),
    (1, torch.bfloat16, False), (0, torch.float32, True), (1, torch.float32, True),
    (0, torch.bfloat16, True)])
def test_one_reduction_per_step_of_the_accumulated_gradients(tp_all_reduces, tp_group, stage, dtype,
                                                             pipe):
    when, params = _train(stage, dtype, pipe, tp_group)
    summed, want = _reference()
    assert when == PER_STEP
    assert len(tp_all_reduces) == STEPS  # one flattened all-reduce per step, not per micro batch
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=5e-2, atol=5e-3)
    for got, expected in zip(tp_all_reduces, summed, strict=False):  # the whole step's sum, not one micro batch's
        torch.testing.assert_close(got, expected, **tol)
    for got, expected in zip(params, want, strict=True):  # and it reached the update exactly once
        torch.testing.assert_close(got, expected, **tol)


@pytest.mark.parametrize("dtype,data_types", [
    (torch.float32, None),  # the partition as a list of parameter slices and pads
    (torch.bfloat16, {"grad_accum_dtype": "fp32"}),  # the compact fp32 partition buffer
], ids=["fp32-slice-list", "bf16-fp32-accumulation-compact-buffer"])
def test_zero2_sums_the_partition_of_the_accumulated_gradients_once_per_step(
        tp_all_reduces, tp_group, dtype, data_types):
    """ZeRO 2 reduces each gradient over data-parallel ranks inside the backward; the sum over
    tensor-parallel ranks runs after it, once per step, on the partition the step then uses."""
    when, params = _train(2, dtype, False, tp_group, data_types=data_types)
    summed, want = _reference()
    assert when == PER_PARTITION
    assert len(tp_all_reduces) == STEPS  # one flattened all-reduce per step, not per micro batch
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=5e-2, atol=5e-3)
    for got, expected in zip(tp_all_reduces, summed, strict=False):  # LayerNorm weight and bias, whole step
        torch.testing.assert_close(got, expected, **tol)
    for got, expected in zip(params, want, strict=True):
        torch.testing.assert_close(got, expected, **tol)


def test_zero_offload_reduces_each_micro_batch_gradient_as_it_is_produced(tp_all_reduces, tp_group):
    """ZeRO-Offload fills its partition by asynchronous copies: the per-parameter fallback sums
    each micro batch's gradient first, which gives the same update."""
    when, params = _train(2, torch.float32, False, tp_group,
                          zero_extra={"offload_optimizer": {"device": "cpu"}},
                          config_extra={"zero_force_ds_cpu_optimizer": False})
    _, want = _reference()
    assert when == PER_MICRO_BATCH
    assert len(tp_all_reduces) == STEPS * MICRO_BATCHES * 2  # LayerNorm weight and bias
    for got, expected in zip(params, want, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
