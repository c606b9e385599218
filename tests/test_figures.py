"""The guide's figures and the demo run end to end (into a temporary folder)."""

import subprocess
import sys


def test_make_figures(tmp_path):
    from asd.viz.guide import make_figures

    paths = make_figures(str(tmp_path))
    names = {p.rsplit("/", 1)[-1] for p in paths}
    assert {"brusselator_coloring.png", "conv_jacobian.png", "rosenbrock_hessian.png"} <= names
    for p in paths:
        with open(p, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


def test_demo_small(tmp_path):
    out = subprocess.run([sys.executable, "-m", "asd", "demo", "--sizes", "4", "8", "--figures", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "vs dense (prepared)" in out.stdout and "max |J - J_dense|" in out.stdout
    assert (tmp_path / "brusselator_coloring.png").exists()
