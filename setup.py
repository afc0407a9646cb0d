"""flashgen: FlashAttention kernels generated per arch, head dim, dtype and causality.

`pip install -e .` installs the generator, the runtime and the `flashgen` command; kernels are
compiled by `flashgen generate --arch sm_XX` (or just in time on first use). To compile the
default set during the install instead, set FLASHGEN_BUILD_ARCH (e.g. sm_90, comma-separated for
several) and let the build see the installed dependencies:
    FLASHGEN_BUILD_ARCH=sm_90 pip install --no-build-isolation -e .
"""

import os
import subprocess
import sys

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py


class BuildPyThenKernels(build_py):
    """build_py runs for regular and editable installs alike."""

    def run(self):
        super().run()
        archs = [a for a in os.environ.get("FLASHGEN_BUILD_ARCH", "").split(",") if a]
        if archs:
            args = [a for arch in archs for a in ("--arch", arch)]
            subprocess.run([sys.executable, "-m", "flashgen", "generate", *args], check=True,
                           cwd=os.path.dirname(os.path.abspath(__file__)))


setup(
    name="flashgen",
    version="0.1.0",
    description="A FlashAttention kernel generator for PyTorch",
    long_description=__doc__,
    python_requires=">=3.11",
    # The wheel carries the top-level templates/ folder (kernel templates, the flashgen C++
    # headers, the binding's and the replay's sources) as codegen/templates, so an installed
    # flashgen finds them beside its own code (codegen/paths.py); every file of those kinds, at
    # any depth.
    packages=[*find_packages(include=["flashgen", "flashgen.*", "codegen", "codegen.*"]),
              "codegen.templates"],
    package_dir={"codegen.templates": "templates"},
    package_data={"codegen": ["configs/*.toml"],
                  "codegen.templates": [f"**/*.{ext}" for ext in ("j2", "cpp", "cuh", "h")]},
    install_requires=["torch>=2.4", "jinja2>=3.0", "ninja", "pybind11>=2.10",
                      "nvidia-cutlass>=4.0"],
    # transformers: flashgen.integrations.transformers (attn_implementation="flashgen")
    extras_require={"test": ["pytest>=7", "matplotlib", "einops"], "bench": ["matplotlib"],
                    "transformers": ["transformers>=5.17"]},
    entry_points={"console_scripts": ["flashgen = flashgen.cli:main"]},
    cmdclass={"build_py": BuildPyThenKernels},
)
