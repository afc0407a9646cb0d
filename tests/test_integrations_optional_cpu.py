"""transformers is optional: without it, its integration's tests skip (the CPU and the GPU ones,
run here in a fresh pytest where importing transformers fails)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ["tests/test_integrations_transformers_cpu.py", "tests/gpu/test_transformers.py"]


def test_the_transformers_tests_skip_without_transformers(tmp_path):
    (tmp_path / "transformers").mkdir()
    (tmp_path / "transformers" / "__init__.py").write_text(
        'raise ModuleNotFoundError("No module named transformers", name="transformers")\n')
    environment = {**os.environ,
                   "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT),
                                                  os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "-rs", *FILES], cwd=ROOT, env=environment, capture_output=True,
                            text=True, timeout=300)
    # 5: pytest collected no test, the modules skipping whole
    assert result.returncode == 5, result.stdout + result.stderr
    assert "2 skipped" in result.stdout and "could not import 'transformers'" in result.stdout, \
        result.stdout
