"""When the compiled replay of known calls (flashgen/replay.py) loads, builds or stays off:
calls keep running from Python wherever it is not loaded."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from codegen import build  # noqa: E402
from flashgen import cache, replay  # noqa: E402


class _Synchronous:
    """threading.Thread's stand-in: start() runs the target at once."""

    def __init__(self, target, daemon=None):
        self.target = target

    def start(self):
        self.target()


@pytest.fixture
def fresh_replay(monkeypatch, tmp_path):
    """A replay not loaded yet, its module missing from an empty cache, its build synchronous."""
    monkeypatch.setattr(replay, "_module", None)
    monkeypatch.setattr(replay.threading, "Thread", _Synchronous)
    monkeypatch.setattr(cache, "replay_path", lambda: tmp_path / "_flashgen_replay.so")
    replay.reset()
    yield
    replay.reset()


def _cuda_torch(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.0")


def _failing_build(builds):
    def build_replay(log=print):
        builds.append(1)
        raise build.BuildError("flashgen: the replay of known calls failed to build:\nno c++")
    return build_replay


def test_a_cpu_build_of_torch_replays_nothing_and_builds_nothing(fresh_replay, monkeypatch):
    builds = []
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(build, "build_replay", _failing_build(builds))
    assert replay.decode(False, None) is None
    assert not replay.ready() and builds == []


def test_a_missing_replay_builds_at_the_first_call_and_a_failure_says_so_once(
        fresh_replay, monkeypatch, capsys):
    builds = []
    _cuda_torch(monkeypatch)
    monkeypatch.setattr(build, "build_replay", _failing_build(builds))
    assert replay.decode(False, None) is None
    assert replay.decode(True, None) is None
    assert builds == [1] and not replay.ready()
    err = capsys.readouterr().err
    assert err.count("did not build") == 1 and "repeated calls run from Python" in err


@pytest.mark.parametrize("env", [{"FLASHGEN_JIT": "0"}, {"FLASHGEN_REPLAY": "0"}])
def test_jit_off_or_replay_off_builds_nothing(env, fresh_replay, monkeypatch):
    builds = []
    _cuda_torch(monkeypatch)
    monkeypatch.setattr(build, "build_replay", _failing_build(builds))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    replay.reset()
    assert replay.decode(False, None) is None
    assert builds == [] and not replay.ready()


def test_the_replay_is_built_per_torch_version(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    one = cache.replay_path()
    monkeypatch.setattr(torch, "__version__", "2.13.0+cu130")
    assert cache.replay_path() != one
    assert one.parent.parent == cache.replay_path().parent.parent  # one folder of versions


def test_the_backwards_replay_is_off_unless_flashgen_replay_backward_is_1(fresh_replay,
                                                                        monkeypatch):
    module = SimpleNamespace(decode=lambda *a: None, forward=lambda *a: None,
                             backward=lambda *a: None, keep_backward=lambda *a: True,
                             forget=lambda: None)
    monkeypatch.setattr(replay, "_module", module)
    replay._load(None)  # the module is loaded: this only hands out its functions
    assert replay.ready() and replay.backward is not module.backward
    assert replay.keep_backward((), ((), (), 0), (0, 1, 2, 3, 4, 5), False) is False
    monkeypatch.setenv("FLASHGEN_REPLAY_BACKWARD", "1")
    replay._load(None)
    assert replay.backward is module.backward
    assert replay.keep_backward((), ((), (), 0), (0, 1, 2, 3, 4, 5), False) is True
