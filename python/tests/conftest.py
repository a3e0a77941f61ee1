import os
import subprocess
import sys

import pytest

ROOT = os.environ.get("DEMI_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))


def run_python(code_or_args, timeout=120, env=None, **kwargs):
    """Runs a Python subprocess with this interpreter and demi importable; a hang fails by timeout."""
    args = [sys.executable] + (["-c", code_or_args] if isinstance(code_or_args, str) else list(code_or_args))
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=full_env, **kwargs)


@pytest.fixture
def fashion_mnist_dir(tmp_path):
    """Debian's dataset-fashion-mnist laid out as MindSpore's tutorial expects: train/ and test/."""
    src = "/usr/share/datasets/fashion-mnist"
    if not os.path.isdir(src):
        pytest.skip("dataset-fashion-mnist is not installed (scripts/setup installs it)")
    for split, prefix in (("train", "train-"), ("test", "t10k-")):
        os.makedirs(tmp_path / split)
        for name in os.listdir(src):
            if name.startswith(prefix):
                os.symlink(os.path.join(src, name), tmp_path / split / name)
    return tmp_path
