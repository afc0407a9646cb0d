"""The forward's kernel per call, and the backward's, without a GPU: an H100's properties and
launchers are faked, the default config's candidates and the mma family's choices are real."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from codegen.families.mma import FwdTile

torch = pytest.importorskip("torch")

H100 = SimpleNamespace(major=9, minor=0, multi_processor_count=132, L2_cache_size=50 * 2**20)
A100 = SimpleNamespace(major=8, minor=0, multi_processor_count=108, L2_cache_size=40 * 2**20)
DEVICE = torch.device("cuda", 0)
MAIN = FwdTile(128, 32, 4, 3)  # sm_90 head dim 128 (no alt tile: the hopper family runs there)
A100_MAIN, A100_SMALL = FwdTile(128, 64, 4, 2), FwdTile(64, 64, 4, 2)  # sm_80 head dim 128


@pytest.fixture
def forward(monkeypatch):
    from flashgen import forward, host

    monkeypatch.delenv("FLASHGEN_CONFIG", raising=False)
    # These tests are about the mma family's tile choice; dispatch would run the hopper family.
    monkeypatch.setenv("FLASHGEN_FAMILY", "mma")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: H100)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))
    monkeypatch.setattr(forward.loader, "launcher", lambda spec: SimpleNamespace(spec=spec))
    caches = (forward._plan, forward._candidates, host.device_resources)
    for cache in caches:
        cache.cache_clear()
    yield forward
    for cache in caches:
        cache.cache_clear()


@pytest.fixture
def a100(forward, monkeypatch):
    """The same on a faked A100, whose mma forward has alt tiles."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: A100)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (8, 0))
    forward.clear_plans()
    return forward


def test_a_full_gpu_runs_the_main_tile(forward):
    spec = forward.kernel_for(DEVICE, "bf16", 128, "causal", batch_heads=16 * 16, seqlen_q=4096)
    assert spec.name == "fwd_mma_sm90_bf16_hd128_causal_m128n32w4s3"


def test_few_short_sequences_run_the_alt_tile(a100):
    # 8 x 4 blocks of 128 rows leave 76 of 108 SMs idle
    spec = a100.kernel_for(DEVICE, "bf16", 128, "causal", batch_heads=8, seqlen_q=512)
    assert spec.name == "fwd_mma_sm80_bf16_hd128_causal_m64n64w4s2"
    spec = a100.kernel_for(DEVICE, "bf16", 128, "causal", batch_heads=16 * 16, seqlen_q=4096)
    assert spec.tile == A100_MAIN


def test_causal_calls_run_their_longest_query_blocks_first(forward):
    from flashgen import schedule

    fields = forward._plan(0, "bf16", 128, "causal", 256, 4096)[2]
    assert fields == {"ranks_per_round": schedule.CAUSAL_RANKS_PER_ROUND}
    fields = forward._plan(0, "bf16", 128, "none", 256, 4096)[2]
    assert fields == {"ranks_per_round": 4096 // MAIN.block_m}  # one round


def test_a_head_dim_without_alt_tiles_runs_its_main_tile(forward):
    assert forward.kernel_for(DEVICE, "fp16", 96, "none", 1, 512).tile == FwdTile(128, 64, 4, 2)


def test_a_padded_head_dim_chooses_among_the_larger_head_dims_tiles(a100):
    assert a100._plan(0, "bf16", 120, "none", 8, 512)[1] == 128
    assert a100.kernel_for(DEVICE, "bf16", 120, "none", 8, 512).tile == A100_SMALL


def test_pinned_tiles_override_the_shape(a100):
    from flashgen.families import mma

    with mma.pinned_forward_tile(0):
        a100.clear_plans()
        assert a100.kernel_for(DEVICE, "bf16", 128, "none", 8, 512).tile == A100_MAIN
    with mma.pinned_forward_tile(1):
        a100.clear_plans()
        assert a100.kernel_for(DEVICE, "bf16", 128, "none", 256, 4096).tile == A100_SMALL
    a100.clear_plans()
    assert a100.kernel_for(DEVICE, "bf16", 128, "none", 8, 512).tile == A100_SMALL  # restored


def test_pinning_an_alt_tile_the_head_dim_lacks_is_not_implemented(forward):
    from flashgen.families import mma

    with mma.pinned_forward_tile(1), pytest.raises(NotImplementedError, match="head dim 96 has 1"):
        forward.kernel_for(DEVICE, "bf16", 96, "none", 16, 512)


def test_flashgen_family_restricts_dispatch(forward, monkeypatch):
    monkeypatch.delenv("FLASHGEN_FAMILY")
    assert forward.kernel_for(DEVICE, "bf16", 64, "none", 256, 4096).family == "hopper"
    forward.clear_plans()
    monkeypatch.setenv("FLASHGEN_FAMILY", "mma")
    assert forward.kernel_for(DEVICE, "bf16", 64, "none", 256, 4096).family == "mma"
    forward.clear_plans()
    monkeypatch.setenv("FLASHGEN_FAMILY", "absent")
    with pytest.raises(forward.registry.dispatch.DispatchError,
                       match="FLASHGEN_FAMILY=absent names no kernel family; known: hopper, mma"):
        forward.kernel_for(DEVICE, "bf16", 64, "none", 256, 4096)


def test_a_forced_family_without_a_backward_leaves_the_backward_to_one_with_it(monkeypatch,
                                                                                tmp_path):
    from flashgen import registry

    config = tmp_path / "flashgen.toml"  # a hopper forward at head dim 128, no hopper backward
    config.write_text(
        "[mma.sm_90.head_dim.128]\nblock_m = 128\nblock_n = 32\nwarps = 4\nkv_stages = 3\n"
        "[mma.sm_90.head_dim.128.backward]\nblock_m = 64\nblock_n = 128\nwarps = 8\n"
        "q_stages = 2\n"
        "[hopper.sm_90.head_dim.128]\nblock_m = 128\nblock_n = 128\nkv_stages = 2\n"
        "pingpong = true\noverlap = true\n")
    monkeypatch.setenv("FLASHGEN_CONFIG", str(config))
    monkeypatch.setenv("FLASHGEN_FAMILY", "hopper")
    (first, *_) = registry.candidates("sm_90", "bwd", "bf16", 128, "none")
    assert first.spec.family == "mma"


@pytest.fixture
def backward(forward):
    """backward._choose on the same faked H100 and launchers."""
    from flashgen import backward

    backward._choose.cache_clear()
    yield backward
    backward._choose.cache_clear()


def test_the_backward_runs_its_head_dims_main_tile_unpadded(backward):
    launcher, padded_head_dim = backward._choose(0, "bf16", 128, "causal")
    assert launcher.spec.name == "bwd_mma_sm90_bf16_hd128_causal_m64n128w8s2"
    assert padded_head_dim is None


@pytest.mark.parametrize("mask", ["none", "causal"])
def test_on_an_h100_dense_and_varlen_gradients_run_on_the_hopper_family(
        backward, monkeypatch, mask):
    monkeypatch.delenv("FLASHGEN_FAMILY")
    dense = backward.kernel_for(DEVICE, "bf16", 128, mask)
    # without a mask the tile is 80 query rows (dQ transposed), causal 64 with three Q stages
    tile = {"none": "m80n128s2d1", "causal": "m64n128s3d1"}[mask]
    assert dense.name == f"bwd_hopper_sm90_bf16_hd128_{mask}_{tile}"
    assert backward.kernel_for(DEVICE, "bf16", 128, mask, varlen=True) == dense
    # head dims 192 and 256's consumers split the head dim over 64 keys; at 96 their dQ shares
    # are 64 and 32 columns, and 80 pads to 96, the least padding; 32 has no hopper backward
    for head_dim in (192, 256):
        assert backward.kernel_for(DEVICE, "bf16", head_dim, mask).name == (
            f"bwd_hopper_sm90_bf16_hd{head_dim}_{mask}_m64n64s2d1")
    assert backward.kernel_for(DEVICE, "bf16", 96, mask).name == (
        f"bwd_hopper_sm90_bf16_hd96_{mask}_m64n128s2d1")
    padded = backward._choose(0, "bf16", 80, mask)[0].spec
    assert (padded.family, padded.head_dim) == ("hopper", 96)
    assert backward.kernel_for(DEVICE, "bf16", 32, mask).family == "mma"


def grid(backward, mask, batch, seqlen, heads, head_dim=128, deterministic=False):
    """The mma family's backward grid for the default hd128 kernel on (meta) inputs."""
    from flashgen.families import mma

    spec = backward._choose(0, "bf16", head_dim, mask)[0].spec
    return mma.backward_grid(spec, (batch, seqlen, heads, head_dim), (seqlen, heads), 0,
                             deterministic)


@pytest.mark.parametrize("batch, seqlen", [(8, 2048), (2, 8192)])
def test_causal_backward_grids_end_on_waves_of_their_shortest_blocks(backward, batch, seqlen):
    from flashgen import schedule

    assert grid(backward, "causal", batch, seqlen, 16) == schedule.BwdGrid(
        sorted_tail_blocks=schedule.SORTED_TAIL_WAVES * H100.multi_processor_count)


def test_backward_grids_stay_batch_head_major_where_the_tails_dq_overflows_l2(backward):
    from flashgen import schedule

    # 4 waves of 128 key blocks take 5 (batch, head)s: 5 x 16k x 128 x 4 bytes = 40 MiB
    assert grid(backward, "causal", 1, 16384, 16) == schedule.BwdGrid()


def hopper_grid(backward, monkeypatch, mask, batch, seqlen, deterministic=False):
    """The hopper family's backward grid for the default hd128 kernel, 16 heads."""
    from flashgen.families import hopper

    monkeypatch.delenv("FLASHGEN_FAMILY", raising=False)
    spec = backward._choose(0, "bf16", 128, mask)[0].spec
    assert spec.family == "hopper"
    return hopper.backward_grid(spec, (batch, seqlen, 16, 128), (seqlen, 16), 0, deterministic)


@pytest.mark.parametrize("batch, seqlen", [(8, 2048), (2, 8192)])
def test_hopper_backward_grids_order_and_split_as_the_mma_familys(backward, monkeypatch, batch,
                                                                 seqlen):
    """Causal grids end on waves of their shortest blocks, unmasked ones split their last wave
    (2048 equal key blocks, 15.5 waves), deterministic ones keep their own order (each block
    waits on blocks launched before it) whole."""
    from flashgen import schedule

    assert hopper_grid(backward, monkeypatch, "causal", batch, seqlen) == schedule.BwdGrid(
        sorted_tail_blocks=schedule.SORTED_TAIL_WAVES * H100.multi_processor_count)
    unmasked = hopper_grid(backward, monkeypatch, "none", batch, seqlen)
    assert unmasked.sorted_tail_blocks == 0
    assert unmasked.split_blocks == 2048 % H100.multi_processor_count and unmasked.splits > 1
    for mask in ("causal", "none"):
        assert hopper_grid(backward, monkeypatch, mask, batch, seqlen,
                           deterministic=True) == schedule.BwdGrid()


def test_hopper_backward_grids_stay_batch_head_major_where_the_tails_dq_overflows_l2(
        backward, monkeypatch):
    from flashgen import schedule

    # 4 waves of 128 key blocks take 5 (batch, head)s: 5 x 16k x 128 x 4 bytes = 40 MiB
    assert hopper_grid(backward, monkeypatch, "causal", 1, 16384) == schedule.BwdGrid()


def test_non_causal_backward_grids_split_their_last_wave(backward):
    from flashgen import schedule

    # every block does the same work: 8 x 16 x 16 = 2048 key blocks of 32 steps, 15.5 waves
    bwd_grid = grid(backward, "none", 8, 2048, 16)
    assert bwd_grid.sorted_tail_blocks == 0
    assert bwd_grid.split_blocks == 2048 % H100.multi_processor_count and bwd_grid.splits > 1
    assert grid(backward, "none", 8, 2048, 16, deterministic=True) == schedule.BwdGrid()


def test_the_backward_pads_an_unconfigured_head_dim_to_the_next_configured(backward):
    launcher, padded_head_dim = backward._choose(0, "fp16", 80, "none")
    assert launcher.spec.kind == "bwd" and launcher.spec.head_dim == padded_head_dim == 96


def test_the_backward_names_its_tables_for_a_head_dim_too_large(backward):
    with pytest.raises(backward.registry.dispatch.DispatchError,
                       match="not supported by the backward on sm_90"):
        backward._choose(0, "bf16", 320, "none")


@pytest.fixture
def hopper_forward(forward, monkeypatch):
    monkeypatch.setenv("FLASHGEN_FAMILY", "hopper")
    return forward


@pytest.mark.parametrize("head_dim, seqlen_q, tile", [
    (64, 512, "m128n128s2p1o1"), (64, 1024, "m128n128s2p1o1"), (64, 1025, "m192n128s2p1o1"),
    (64, 16384, "m192n128s2p1o1"), (192, 1024, "m128n64s2p1o1"), (192, 2048, "m128n112s2p1o1")])
def test_short_causal_calls_run_the_hopper_short_sequence_tile(hopper_forward, head_dim,
                                                               seqlen_q, tile):
    spec = hopper_forward.kernel_for(DEVICE, "bf16", head_dim, "causal", 32 * 32, seqlen_q)
    assert spec.family == "hopper" and spec.tile.suffix == tile


@pytest.mark.parametrize("seqlen_q", [512, 16384])
def test_unmasked_calls_keep_the_hopper_main_tile(hopper_forward, seqlen_q):
    spec = hopper_forward.kernel_for(DEVICE, "bf16", 64, "none", 32 * 32, seqlen_q)
    assert spec.family == "hopper" and spec.tile.suffix == "m192n128s2p1o1"


@pytest.fixture
def dispatched_forward(forward, monkeypatch):
    """The forward as dispatch picks it on the faked H100: every family."""
    monkeypatch.delenv("FLASHGEN_FAMILY")
    return forward


@pytest.mark.parametrize("reads", ["dense", "varlen", "cache"])
def test_varlen_batches_and_kv_caches_run_the_hopper_forward_on_an_h100(dispatched_forward,
                                                                       reads):
    spec = dispatched_forward.kernel_for(DEVICE, "bf16", 128, "causal", 32 * 32, 4096, reads)
    assert spec.family == "hopper"


def test_without_a_forward_that_reads_caches_chunked_prefill_keeps_the_decode_kernel(
        dispatched_forward, monkeypatch):
    # a head dim the hopper family pads (80 -> 96): a cache cannot be padded in place
    assert dispatched_forward.plan(0, "bf16", 80, "causal", 32 * 32, 4096, "cache") is None
    assert dispatched_forward.plan(0, "bf16", 96, "causal", 32 * 32, 4096, "cache") is not None
    # an A100: no hopper family, and the mma forward reads varlen batches but not caches
    dispatched_forward.clear_plans()
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: SimpleNamespace(**{**vars(H100), "major": 8}))
    assert dispatched_forward.plan(0, "bf16", 128, "causal", 32 * 32, 4096, "cache") is None
    assert dispatched_forward.kernel_for(DEVICE, "bf16", 128, "causal", 32 * 32, 4096,
                                         "varlen").family == "mma"


def test_seqused_k_runs_where_loads_stop_at_a_runs_last_used_key():
    """Keys past seqused_k may hold anything: a family that loads whole key blocks by TMA (P = 0
    times NaN is NaN) does not run such a call."""
    pytest.importorskip("torch")
    from codegen.families import FAMILIES
    from flashgen import forward

    runs = {name: forward._READERS["varlen_used"](family) for name, family in FAMILIES.items()}
    assert runs == {"hopper": False, "mma": True}
    assert all(forward._READERS["varlen"](family) for family in FAMILIES.values())
