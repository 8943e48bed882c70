"""The two jobs of torch_training.py, in plain ``torch.nn`` (torchvision may be absent on the
GPU machines): ResNet50 at 224x224 and a Transformer encoder, each with its optimizer and a few
fixed batches, made on one CUDA stream.

Every part has a deterministic CUDA implementation, so a job's losses are a function of its
seed alone (the bit-for-bit comparison of torch_training.py rests on it): global average
pooling is a mean (AdaptiveAvgPool2d's backward is nondeterministic on CUDA), the loss is
log-softmax against one-hot labels (NLLLoss reduces with atomics on CUDA), attention runs on the
math kernels (torch_training.py turns the fused ones off), and there is no dropout (the two jobs
share the device's random generator, so dropout would tie one job's losses to the other's).
Imported only where PyTorch is: the pure parts of torch_training.py never import this file."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

JOBS = ("resnet50", "transformer")


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        out = planes * self.expansion
        self.body = nn.Sequential(
            nn.Conv2d(inplanes, planes, 1, bias=False), nn.BatchNorm2d(planes), nn.ReLU(inplace=True),
            nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(planes),
            nn.ReLU(inplace=True),
            nn.Conv2d(planes, out, 1, bias=False), nn.BatchNorm2d(out))
        self.down = None
        if stride != 1 or inplanes != out:
            self.down = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False),
                                      nn.BatchNorm2d(out))
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        identity = x if self.down is None else self.down(x)
        return self.relu(self.body(x) + identity)


class ResNet50(nn.Module):
    """He et al. 2016, the [3, 4, 6, 3] bottleneck stacks of torchvision's resnet50."""

    def __init__(self, classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2, padding=1))
        layers, inplanes = [], 64
        for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(blocks):
                layers.append(Bottleneck(inplanes, planes, stride if i == 0 else 1))
                inplanes = planes * Bottleneck.expansion
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(inplanes, classes)

    def forward(self, x):
        return self.fc(self.layers(self.stem(x)).mean(dim=(2, 3)))


class Encoder(nn.Module):
    """A Transformer encoder classifier over a sequence of feature vectors."""

    def __init__(self, features: int = 64, d_model: int = 256, heads: int = 8, layers: int = 4,
                 seq: int = 128, classes: int = 100):
        super().__init__()
        self.proj = nn.Linear(features, d_model)
        self.pos = nn.Parameter(torch.zeros(1, seq, d_model))
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=4 * d_model, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, x):
        return self.head(self.encoder(self.proj(x) + self.pos).mean(dim=1))


def one_hot_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross entropy without NLLLoss's atomics: mean of -log p(label)."""
    target = nn.functional.one_hot(labels, logits.shape[1]).to(logits.dtype)
    return -(nn.functional.log_softmax(logits, dim=1) * target).sum(dim=1).mean()


@dataclass
class Job:
    """One training job on its stream: model, optimizer, fixed batches, and its losses so far
    (device tensors until the phase ends)."""
    name: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    batches: list[tuple[torch.Tensor, torch.Tensor]]
    losses: list[torch.Tensor] = field(default_factory=list)

    def step(self, i: int) -> None:
        x, y = self.batches[i % len(self.batches)]
        self.optimizer.zero_grad(set_to_none=True)
        loss = one_hot_loss(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        self.losses.append(loss.detach())


def make_job(name: str, device: torch.device, batch: int, image: int, seed: int, n_batches: int = 2) -> Job:
    """The job, its weights and batches from `seed` alone (made on the CPU, then copied: the same
    bytes in every process), on the current stream."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    if name == "resnet50":
        model, classes = ResNet50(classes=100), 100
        shape = (batch, 3, image, image)
        optimizer = lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9, foreach=True)  # noqa: E731
    elif name == "transformer":
        model, classes = Encoder(), 100
        shape = (batch, 128, 64)
        optimizer = lambda params: torch.optim.AdamW(params, lr=1e-4, foreach=True)  # noqa: E731
    else:
        raise ValueError(f"unknown job {name!r}; the jobs are {', '.join(JOBS)}")
    model = model.to(device)
    batches = [(torch.randn(shape, generator=gen).to(device), torch.randint(0, classes, (batch,), generator=gen).to(device))
               for _ in range(n_batches)]
    return Job(name, model, optimizer(model.parameters()), batches)
