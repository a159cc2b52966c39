"""A problem in KernelBench's form: a reference module, and functions that make its inputs."""

import torch
import torch.nn as nn

batch_size, in_features, out_features = 16, 96, 40


class Model(nn.Module):
    """A linear layer followed by the exact GeLU."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x))


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
