"""Dropout's random numbers without a GPU: the Philox generator the kernels compile
(common/philox.h) and its torch twin in flashgen/reference.py, which the GPU tests build their
reference masks with."""

from __future__ import annotations

import shutil
import subprocess

import pytest

torch = pytest.importorskip("torch")

from codegen.paths import TEMPLATES_DIR  # noqa: E402
from flashgen.reference import dropout_keep, philox4x32_10  # noqa: E402

# Random123's known answers for Philox-4x32-10: (counter, key) -> output.
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter, key, expected", KNOWN_ANSWERS)
def test_reference_philox_gives_the_published_answers(counter, key, expected):
    as_tensors = tuple(torch.tensor([c], dtype=torch.int64) for c in counter)
    assert tuple(int(w) for w in philox4x32_10(as_tensors, *key)) == expected


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a host C++ compiler (g++)")
def test_the_kernels_philox_matches_the_reference(tmp_path):
    generator = torch.Generator().manual_seed(7)
    draws = torch.randint(0, 2**32, (64, 6), generator=generator, dtype=torch.int64).tolist()
    draws += [[*counter, *key] for counter, key, _ in KNOWN_ANSWERS]
    source = tmp_path / "philox.cpp"
    source.write_text(
        '#include <cstdio>\n#include "flashgen/common/philox.h"\n'
        "int main() {\n  unsigned c0, c1, c2, c3, k0, k1;\n"
        '  while (std::scanf("%u %u %u %u %u %u", &c0, &c1, &c2, &c3, &k0, &k1) == 6) {\n'
        "    const auto w = flashgen::philox4x32_10({c0, c1, c2, c3}, k0, k1);\n"
        '    std::printf("%u %u %u %u\\n", w.x, w.y, w.z, w.w);\n  }\n}\n')
    binary = tmp_path / "philox"
    subprocess.run(["g++", "-std=c++17", "-O1", "-I", str(TEMPLATES_DIR / "include"),
                    str(source), "-o", str(binary)], check=True)
    run = subprocess.run([str(binary)], input="\n".join(" ".join(map(str, d)) for d in draws),
                         capture_output=True, text=True, check=True)
    kernel = [tuple(map(int, line.split())) for line in run.stdout.splitlines()]
    reference = [tuple(int(w) for w in philox4x32_10(tuple(torch.tensor([c]) for c in d[:4]),
                                                     d[4], d[5])) for d in draws]
    assert kernel == reference
    assert kernel[-3:] == [expected for _, _, expected in KNOWN_ANSWERS]


def test_the_mask_is_a_function_of_the_seed_and_keeps_one_minus_p():
    keep = dropout_keep(2024, 0.25, batch=2, heads=3, seqlen_q=129, seqlen_k=97)
    assert keep.shape == (2, 3, 129, 97) and keep.dtype == torch.bool
    assert torch.equal(keep, dropout_keep(2024, 0.25, 2, 3, 129, 97))
    assert not torch.equal(keep, dropout_keep(2025, 0.25, 2, 3, 129, 97))
    # 75,078 Bernoulli(0.75) draws: the rate's standard deviation is 0.0016
    assert abs(keep.float().mean().item() - 0.75) < 0.008
    # every (sequence, head) draws its own mask
    assert not torch.equal(keep[0, 0], keep[0, 1]) and not torch.equal(keep[0, 0], keep[1, 0])
    # a mask of more rows and columns extends this one: positions, not tiles, decide
    assert torch.equal(dropout_keep(2024, 0.25, 2, 3, 200, 150)[..., :129, :97], keep)
    assert dropout_keep(2024, 0.0, 1, 1, 16, 16).all()
