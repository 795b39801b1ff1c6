"""CUDA_DEVICE_MAX_CONNECTIONS (megatron/parallel/cuda_connections.py): Megatron-LM's rule as a
function of the layout and the GPU, and what the entry points do with the environment."""
import pytest

from megatron.errors import ConfigError
from megatron.parallel.cuda_connections import VARIABLE, apply_max_connections, required_max_connections

HOPPER, BLACKWELL = (9, 0), (10, 0)


@pytest.mark.parametrize("tp,device,capability,required", [
    (2, "cuda", None, "1"), (2, "cuda", HOPPER, "1"), (8, "cuda", (8, 0), "1"),
    (2, "cuda", BLACKWELL, None), (1, "cuda", HOPPER, None), (2, "cpu", None, None)])
def test_required_with_tensor_parallelism_on_gpus_before_blackwell(tp, device, capability, required):
    assert required_max_connections(tp, device, capability) == required


def _never():
    pytest.fail("asked the GPU's compute capability although the variable is unset or 1")


def test_unset_is_set_to_1_before_cuda_starts_with_a_note():
    environ = {}
    note = apply_max_connections(2, "cuda", environ, _never)
    assert environ == {VARIABLE: "1"}
    assert note.startswith("CUDA_DEVICE_MAX_CONNECTIONS=1 set: Megatron-LM requires it with "
                           "--tensor-model-parallel-size 2")
    assert apply_max_connections(2, "cuda", environ, _never) is None  # 1 already: nothing to say
    for tp, device in ((1, "cuda"), (2, "cpu")):  # nothing asked: environment left alone
        environ = {}
        assert apply_max_connections(tp, device, environ, _never) is None and environ == {}


def test_another_value_is_refused_before_blackwell_and_kept_on_blackwell():
    with pytest.raises(ConfigError) as e:
        apply_max_connections(4, "cuda", {VARIABLE: "8"}, lambda: HOPPER)
    assert str(e.value).startswith(
        "CUDA_DEVICE_MAX_CONNECTIONS=8 with --tensor-model-parallel-size 4 on a GPU of compute "
        "capability 9.0: Megatron-LM requires CUDA_DEVICE_MAX_CONNECTIONS=1 before Blackwell")
    assert str(e.value).endswith("unset it (it is then set to 1) or set it to 1")
    environ = {VARIABLE: "32"}
    assert apply_max_connections(4, "cuda", environ, lambda: BLACKWELL) is None
    assert environ == {VARIABLE: "32"}
