"""Defects found in session 44, each with the test that failed before its fix."""

import pytest
import torch

from asd.backends import traced


def test_a_recording_refuses_the_cuda_array_interface():
    """cupy and Numba read a CUDA tensor's memory through ``__cuda_array_interface__``, outside
    dispatch like ``.numpy()``: a recorded graph would keep the values read. (On the CPU the
    property raises anyway; the recording's refusal comes first, naming the cause.)"""
    with traced._NoHostReads():
        with pytest.raises(RuntimeError, match="outside PyTorch's operations"):
            torch.ones(3).__cuda_array_interface__
        torch.ones(3).add(1.0)  # other calls pass
