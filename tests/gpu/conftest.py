import pytest


@pytest.fixture
def poisoned_allocations(monkeypatch):
    """Every floating-point tensor that torch.empty, empty_like, empty_strided, empty_permuted,
    Tensor.new_empty or Tensor.new_empty_strided makes (every uninitialised allocation, so every
    output flashgen returns or writes: tests/test_poison_cpu.py) starts as NaN, so an element a
    kernel forgets to write shows. torch.zeros is left alone: zeroed buffers are a legitimate
    choice. Seeds the generator."""
    import torch

    from tests.poison import poison_allocations

    poison_allocations(monkeypatch)
    torch.manual_seed(0)


@pytest.fixture(params=["hopper", "mma"])
def forward_family(request, monkeypatch):
    """The forward runs on each kernel family that reads the call's inputs in turn (the hopper
    family on sm_90 only); gradients run on the family that has a backward."""
    import torch

    from flashgen import forward

    if request.param == "hopper" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the hopper family runs on sm_90")
    monkeypatch.setenv("FLASHGEN_FAMILY", request.param)
    forward.clear_plans()
    yield request.param
    forward.clear_plans()


@pytest.fixture
def mma_forward(monkeypatch):
    """The forward runs on the mma family (its tiles and grid orders are what the test pins)."""
    from flashgen import forward

    monkeypatch.setenv("FLASHGEN_FAMILY", "mma")
    forward.clear_plans()
    yield
    forward.clear_plans()


@pytest.fixture(params=["hopper", "mma"])
def each_family(request, monkeypatch):
    """Forward and backward run on each kernel family in turn (the hopper family on sm_90 only;
    a call it cannot run falls back to the other)."""
    import torch

    from flashgen import backward, forward

    if request.param == "hopper" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the hopper family runs on sm_90")
    monkeypatch.setenv("FLASHGEN_FAMILY", request.param)
    forward.clear_plans()
    backward.clear_plans()
    yield request.param
    forward.clear_plans()
    backward.clear_plans()


@pytest.fixture
def launched_kernels(monkeypatch):
    """The names of the flashgen kernels the test launches (forward and backward passes), in
    launch order."""
    from flashgen import backward, forward

    names = []
    for module in (forward, backward):
        def recording(launcher, *args, run=module.run, **kwargs):
            names.append(launcher.spec.name)
            return run(launcher, *args, **kwargs)

        monkeypatch.setattr(module, "run", recording)
    return names
