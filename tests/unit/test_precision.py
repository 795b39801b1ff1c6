"""Mixed precision (megatron/optim/precision.py, docs/precision.md), in process on one CPU rank: the
accumulation and reduction dtypes the flags give (Megatron-LM's defaults and flag names), the
optimizer wrapper DeepSpeed runs with them, the gradient norm it clips by and logs (each
tensor-parallel shard once, replicated parameters on tensor-parallel rank 0 only) and the fp32
master weights it steps; torch's fused AdamW on a CUDA accelerator. The launches comparing bf16
and fp16 layouts with the fp32 single rank are in tests/e2e/test_parallel_layouts_e2e.py."""
import math

import pytest
import torch

from helpers.flags import parse as parse_tiny
from helpers.flags import tiny_run_flags
from megatron.config.deepspeed_config import deepspeed_config
from megatron.errors import ArgumentError

BASE = tiny_run_flags(micro_batch_size=1, global_batch_size=2, lr="0.1")


def parse(extra, world_size=1):
    return parse_tiny(extra, world_size, base=BASE)


@pytest.fixture
def fp16_device(monkeypatch):
    """An accelerator with float16 (a GPU, or this CPU where oneDNN has it), so the fp16 logic
    runs on every machine; torch computes float16 on any CPU."""
    from deepspeed.accelerator import get_accelerator

    monkeypatch.setattr(type(get_accelerator()), "is_fp16_supported", lambda self: True)


# ------------------------------------------------------------------ flags -> DeepSpeed config
@pytest.mark.parametrize("flags, accumulation", [
    (["--bf16"], "fp32"),
    (["--bf16", "--accumulate-allreduce-grads-in-fp32"], "fp32"),
    (["--bf16", "--grad-reduce-in-bf16"], "bf16"),
    (["--fp16"], "fp16"),
    (["--fp16", "--accumulate-allreduce-grads-in-fp32"], "fp32"),
], ids=["bf16", "bf16-fp32-flag", "bf16-reduce-in-bf16", "fp16", "fp16-fp32"])
def test_accumulation_and_reduction_dtypes_follow_megatron_lm(flags, accumulation, fp16_device):
    """Under --bf16 gradients accumulate and are all-reduced in fp32 unless --grad-reduce-in-bf16;
    under --fp16 in fp16 unless --accumulate-allreduce-grads-in-fp32 (Megatron-LM's
    validate_args); mixed precision runs at ZeRO stage 1 even on one data-parallel rank."""
    args = parse(flags)
    config = deepspeed_config(args.run_config.deepspeed, args.global_batch_size)
    assert config["data_types"]["grad_accum_dtype"] == accumulation
    assert config["communication_data_type"] == accumulation
    assert config["zero_optimization"]["stage"] == 1
    assert args.accumulate_allreduce_grads_in_fp32 == (accumulation == "fp32")


def test_fp32_training_keeps_deepspeed_defaults():
    args = parse([])
    config = deepspeed_config(args.run_config.deepspeed, args.global_batch_size)
    assert "data_types" not in config and "communication_data_type" not in config
    assert config["zero_optimization"]["stage"] == 0
    assert parse([], world_size=2).zero_stage is None  # the default stage: 1 on DP 2


@pytest.mark.parametrize("source", ["flag", "json"])
def test_zero_stage_0_under_bf16_runs_stage_1_and_says_so(source, tmp_path):
    """BigScience's BLOOM scripts give bf16 with ZeRO stage 0 (DeepSpeed's BF16_Optimizer was
    their stage); here that is stage 1 in DeepSpeed 0.19's terms, and a start-up note says so."""
    if source == "flag":
        args = parse(["--bf16", "--zero-stage", "0"], world_size=2)
        where = "--zero-stage 0"
    else:
        path = tmp_path / "ds.json"
        path.write_text('{"zero_optimization": {"stage": 0}, "bf16": {"enabled": true}}')
        args = parse(["--deepspeed_config", str(path)], world_size=2)
        where = f"--deepspeed_config {path} zero_optimization.stage=0"
    assert args.zero_stage == 1
    config = deepspeed_config(args.run_config.deepspeed, args.global_batch_size)
    assert config["zero_optimization"]["stage"] == 1
    note, = [n for n in args.run_config.notes if n.startswith(where)]
    assert "with --bf16: runs at ZeRO stage 1 (DeepSpeed's BF16_Optimizer" in note


def test_json_accumulation_dtype_is_taken_or_must_agree(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"data_types": {"grad_accum_dtype": "bf16"}}')
    args = parse(["--bf16", "--deepspeed_config", str(path)])
    assert args.grad_reduce_in_bf16 and not args.accumulate_allreduce_grads_in_fp32
    assert any("--grad-reduce-in-bf16 (gradients accumulated and reduced in bf16)" in n
               for n in args.run_config.notes)
    with pytest.raises(ArgumentError, match=r"data_types.grad_accum_dtype=bf16 disagrees with "
                                            r"--accumulate-allreduce-grads-in-fp32"):
        parse(["--bf16", "--accumulate-allreduce-grads-in-fp32", "--deepspeed_config", str(path)])
    # the JSON's all-reduce dtype is kept, unless a flag says another
    path.write_text('{"communication_data_type": "bf16"}')
    args = parse(["--bf16", "--deepspeed_config", str(path)])
    config = deepspeed_config(args.run_config.deepspeed, args.global_batch_size)
    assert (config["data_types"]["grad_accum_dtype"], config["communication_data_type"]) == (
        "fp32", "bf16")
    with pytest.raises(ArgumentError, match=r"communication_data_type=bf16 disagrees with "
                                            r"--accumulate-allreduce-grads-in-fp32 \(gradients "
                                            r"all-reduced in fp32\)"):
        parse(["--bf16", "--accumulate-allreduce-grads-in-fp32", "--deepspeed_config", str(path)])


def test_fp16_fp32_accumulation_under_a_pipeline_is_refused(fp16_device):
    """DeepSpeed's pipe engine sums the tied embedding's gradient from ``param.grad``, which
    ZeRO's fp32 accumulation empties (measured: 1.7e-2 loss drift at PP 2 before the refusal)."""
    pp2 = ["--fp16", "--accumulate-allreduce-grads-in-fp32", "--pipeline-model-parallel-size", "2"]
    with pytest.raises(ArgumentError, match=r"--accumulate-allreduce-grads-in-fp32 with --fp16 and "
                                            r"--pipeline-model-parallel-size 2: DeepSpeed's pipe "
                                            r"engine would not sum the tied embedding"):
        parse(pp2, world_size=2)
    assert parse(pp2[:1] + pp2[2:], world_size=2).zero_stage == 1  # fp16 accumulation


def test_contradicting_accumulation_flags_are_refused():
    with pytest.raises(ArgumentError, match="--grad-reduce-in-bf16 contradicts "
                                            "--accumulate-allreduce-grads-in-fp32"):
        parse(["--bf16", "--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32"])


# ------------------------------------------------------------------ the engine DeepSpeed builds
N = 64  # elements per parameter
SMALL = 2.0 ** -13  # the second micro batch's input: lost when added to 0.5 in bf16 or fp16


class Scales(torch.nn.Module):
    """``loss = sum(shard * x) + 2 * sum(replicated * x)``: the gradients are ``x`` and ``2x``,
    so the test knows them exactly. ``shard`` is marked as megatron-core marks a tensor-parallel
    shard; ``replicated`` stands for a norm or bias every tensor-parallel rank holds whole."""

    def __init__(self):
        super().__init__()
        self.shard = torch.nn.Parameter(torch.ones(N))
        self.shard.tensor_model_parallel, self.shard.partition_dim = True, 0
        self.shard.partition_stride = 1
        self.replicated = torch.nn.Parameter(torch.ones(N))

    def forward(self, x):
        return (self.shard * x).sum().float() + 2 * (self.replicated * x).sum().float()


def _mpu(tensor_parallel_rank: int):
    """The project's mpu over megatron-core's one-rank groups, answering as tensor-parallel rank
    ``tensor_parallel_rank`` of a layout without pipeline stages (1: a rank whose replicated
    parameters rank 0 counts; DeepSpeed's ZeRO 3 asks for the model-parallel rank instead)."""
    from megatron.parallel.topology import MegatronCoreMPU

    class Mpu(MegatronCoreMPU):
        def get_tensor_model_parallel_rank(self):
            return tensor_parallel_rank

        get_slice_parallel_rank = get_model_parallel_rank = get_tensor_model_parallel_rank

    return Mpu()


def _engine(flags, tensor_parallel_rank=0):
    import deepspeed

    from megatron.optim.optimizer import build_optimizer

    args = parse(flags + ["--optimizer", "sgd", "--sgd-momentum", "0", "--weight-decay", "0",
                          "--clip-grad", "0.01"])
    model = Scales()
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=build_optimizer(args.run_config.optimizer, model),
        config=deepspeed_config(args.run_config.deepspeed, args.global_batch_size),
        mpu=_mpu(tensor_parallel_rank), dist_init_required=False)
    return engine, model


def args_zero_stage(flags) -> int:
    """The ZeRO stage ``flags`` ask for: the one after --zero-stage, else 1 (mixed precision)."""
    return int(flags[flags.index("--zero-stage") + 1]) if "--zero-stage" in flags else 1


def _one_iteration(engine, model):
    """Two micro batches (inputs 1 and SMALL), one optimizer step; the logged gradient norm."""
    for value in (1.0, SMALL):
        x = torch.full((N,), value, dtype=model.shard.dtype)
        engine.backward(engine(x))
        engine.step()
    return float(engine.get_global_grad_norm())


@pytest.mark.parametrize("flags, wrapper, accumulated", [
    (["--bf16"], "BF16_Optimizer", 0.5 + SMALL / 2),
    (["--bf16", "--grad-reduce-in-bf16"], "DeepSpeedZeroOptimizer", 0.5),
    (["--bf16", "--zero-stage", "2"], "DeepSpeedZeroOptimizer", 0.5 + SMALL / 2),
    (["--bf16", "--zero-stage", "3"], "DeepSpeedZeroOptimizer_Stage3", 0.5 + SMALL / 2),
    (["--fp16", "--loss-scale", "1024"], "DeepSpeedZeroOptimizer", 0.5),
    (["--fp16", "--loss-scale", "1024", "--accumulate-allreduce-grads-in-fp32"],
     "DeepSpeedZeroOptimizer", 0.5 + SMALL / 2),
], ids=["bf16", "bf16-reduce-in-bf16", "bf16-zero2", "bf16-zero3", "fp16", "fp16-fp32"])
@pytest.mark.parametrize("tensor_parallel_rank", [0, 1])
def test_wrapper_accumulates_clips_by_the_whole_norm_and_steps_fp32_masters(
        flags, wrapper, accumulated, tensor_parallel_rank, one_rank_model_parallel, fp16_device,
        monkeypatch):
    """Each micro batch's gradient of ``shard`` is 0.5 then SMALL / 2 (the loss is averaged over
    2 micro batches): accumulated in fp32 that is 0.5 + SMALL / 2, in bf16 or fp16 it rounds to
    0.5. The norm DeepSpeed logs and clips by is the model's (on tensor-parallel rank 1 without
    the replicated parameter, which rank 0 counts), and the SGD step lands in fp32 master weights
    (an update of ~1e-4 that the bf16 weights cannot hold)."""
    from deepspeed.utils import safe_get_full_fp32_param

    from megatron.optim.precision import optimizer_wrapper, precision_line

    if args_zero_stage(flags) == 3 and tensor_parallel_rank == 1:
        pytest.skip("ZeRO 3 counts every rank's gradients when its partition group holds the "
                    "model-parallel group, as one rank's world always does")
    monkeypatch.setenv("LOCAL_RANK", "0")
    engine, model = _engine(flags, tensor_parallel_rank)
    assert optimizer_wrapper(engine) == wrapper
    norm = _one_iteration(engine, model)
    replicated = N * (2 * accumulated) ** 2 if tensor_parallel_rank == 0 else 0  # rank 0 counts it
    squares = N * accumulated ** 2 + replicated
    assert norm == pytest.approx(math.sqrt(squares), rel=1e-6)
    coefficient = 0.01 / (norm + 1e-6)
    for param, grad in ((model.shard, accumulated), (model.replicated, 2 * accumulated)):
        master = safe_get_full_fp32_param(param)
        assert master.dtype == torch.float32
        torch.testing.assert_close(master, torch.full((N,), 1 - 0.1 * grad * coefficient),
                                   rtol=0, atol=1e-7)
    line = precision_line(engine)
    low = "bf16" if "--bf16" in flags else "fp16"
    reduced = "fp32" if accumulated != 0.5 else low
    assert (f"precision: {low} parameters and activations, fp32 master weights and optimizer "
            f"states, gradients accumulated in {reduced} and reduced in {reduced} (DeepSpeed "
            f"{wrapper}, ZeRO stage {engine.zero_optimization_stage()})") in line, line
    assert engine.zero_optimization_stage() == args_zero_stage(flags)


# ------------------------------------------------------------------ the optimizer
def test_adamw_is_torch_fused_on_a_cuda_accelerator_and_foreach_elsewhere(monkeypatch):
    """No apex: torch's fused AdamW kernel where DeepSpeed's accelerator is CUDA."""
    from deepspeed.accelerator import get_accelerator

    from megatron.optim.optimizer import build_optimizer

    args = parse([])
    model = torch.nn.Linear(4, 4)
    assert not build_optimizer(args.run_config.optimizer, model).defaults.get("fused")
    monkeypatch.setattr(type(get_accelerator()), "device_name", lambda self, index=None: "cuda")
    optimizer = build_optimizer(args.run_config.optimizer, model)
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults["fused"] is True


class ManyParameters(torch.nn.Module):
    """``loss = sum_i sum(w_i * x)`` over PARAMETERS small weights (half of them marked as
    tensor-parallel shards)."""

    PARAMETERS = 48

    def __init__(self):
        super().__init__()
        self.weights = torch.nn.ParameterList(torch.nn.Parameter(torch.ones(4))
                                              for _ in range(self.PARAMETERS))
        for w in self.weights[::2]:
            w.tensor_model_parallel, w.partition_dim, w.partition_stride = True, 0, 1

    def forward(self, x):
        return sum((w * x).sum().float() for w in self.weights)


@pytest.mark.parametrize("flags", [["--bf16"], ["--fp16"]], ids=["bf16", "fp16"])
def test_optimizer_step_reads_the_device_a_fixed_number_of_times(flags, one_rank_model_parallel,
                                                                 fp16_device, monkeypatch):
    """The step's overflow test and clipping read device values into Python (``bool``,
    ``float``, ``item``: a host synchronisation each on a GPU) a few times per step (3 under
    bf16, 1 under fp16 here), not per parameter as DeepSpeed's stage-0 wrapper did
    (FP16_UnfusedOptimizer: 99 for these 48 parameters)."""
    import deepspeed

    from megatron.optim.optimizer import build_optimizer

    monkeypatch.setenv("LOCAL_RANK", "0")
    args = parse(flags + ["--clip-grad", "0.01"])
    model = ManyParameters()
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=build_optimizer(args.run_config.optimizer, model),
        config=deepspeed_config(args.run_config.deepspeed, args.global_batch_size), mpu=_mpu(0),
        dist_init_required=False)
    x = torch.ones(4, dtype=model.weights[0].dtype)
    engine.backward(engine(x))
    engine.step()  # the first of 2 micro batches: no optimizer step
    engine.backward(engine(x))
    reads = []
    with pytest.MonkeyPatch.context() as counting:
        for name in ("__bool__", "__float__", "item"):
            original = getattr(torch.Tensor, name)

            def counted(self, *a, _original=original, _name=name, **k):
                reads.append(_name)
                return _original(self, *a, **k)

            counting.setattr(torch.Tensor, name, counted)
        engine.step()
    assert engine.global_steps == 1
    assert 0 < len(reads) <= 8, reads
