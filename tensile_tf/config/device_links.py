"""Swap links named for the device they stand for (``run.swap_bandwidth: h200-pcie5``).

Note [Links named for a device]
The emulated device is a CPU, so a swap link given in bytes per second means
nothing by itself: what decides what a plan can swap is how much the link
moves within one training step, against the step's peak bytes. Measured on
an NVIDIA H200 machine (DESIGN.md, "Measured on a real GPU"; pinned copies
55 GB/s each way over PCIe 5), PyTorch training steps move per step, each
way: 33% of the step's peak bytes for ResNet50 fp32 (224x224, batch 64,
35.4 ms, 5.6 GiB), 50% for ResNet50 bf16 (batch 256), 45% for BERT-base
bf16 (sequence 512, batch 16), 100% for BERT-base fp32. A device link keeps
that share on the emulated device: for the jobs being planned, their
bandwidth is

    share x (sum of the jobs' unplanned step peaks) / (sum of their unplanned step times)

with peaks and step times as captured on this machine (for one job: share x
peak / step time; for several, the weighted mean of each job's own value).
The run resolves it once, at its first plan, and records both the name and
the bytes per second (results.json ``planner.swap_link``). The capped link
of benchmarks/ (110 MiB/s, a V100's PCIe 3 scaled by this CPU's FLOP rate)
moves about 19% for ResNet50 64x64 batch 16 here: 1.7-5x more pessimistic
than the H200; "unlimited" (a memcpy) is far more generous than any GPU.

Pure: no TensorFlow.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tensile_tf.units import parse_bytes


@dataclass(frozen=True)
class DeviceLink:
    name: str
    device: str
    share_of_peak_per_step: float
    measured: str

    def describe(self, bytes_per_s: float | None = None) -> str:
        """"h200-pcie5 (NVIDIA H200 ..., 33% of a step's peak per step): 190.9 MiB/s here"."""
        text = f"{self.name} ({self.device}, {self.share_of_peak_per_step:.0%} of a step's peak bytes per step)"
        return text if bytes_per_s is None else f"{text}: {bytes_per_s / 2**20:.1f} MiB/s here"


DEVICE_LINKS: dict[str, DeviceLink] = {link.name: link for link in (
    DeviceLink("h200-pcie5", "NVIDIA H200 over PCIe 5 x16, fp32 training", 0.33,
               "ResNet50 224x224 batch 64 fp32 (PyTorch): 35.4 ms steps, 5.6 GiB peak, 55 GB/s each way"),
    DeviceLink("h200-pcie5-bf16", "NVIDIA H200 over PCIe 5 x16, bf16 training", 0.45,
               "BERT-base sequence 512 batch 16 bf16 (PyTorch): 41.3 ms steps, 4.7 GiB peak "
               "(ResNet50 bf16 batch 256: 50%)"),
)}


def device_link_bandwidth(link: DeviceLink, peaks_bytes: list[int], step_seconds: list[float]) -> int:
    """Bytes per second of ``link`` for jobs with these unplanned step peaks and times
    (Note [Links named for a device])."""
    if not peaks_bytes or len(peaks_bytes) != len(step_seconds) or sum(step_seconds) <= 0:
        raise ValueError(f"device link {link.name}: needs each job's step peak and a positive step time")
    return max(1, int(link.share_of_peak_per_step * sum(peaks_bytes) / sum(step_seconds)))


def describe_swap_link(bandwidth_bytes_per_s: float | None, device_link: str | None = None) -> str:
    """What a run's or a benchmark row's link stands for, in words."""
    if device_link is not None:
        return DEVICE_LINKS[device_link].describe(bandwidth_bytes_per_s)
    if not bandwidth_bytes_per_s:
        return "unlimited (a memcpy: no device link)"
    return f"{bandwidth_bytes_per_s / 2**20:.1f} MiB/s (given in bytes per second: no device named)"


def parse_swap_link(value: Any, what: str) -> int | str | None:
    """A swap link: None (unlimited), bytes per second ("2GiB", 2147483648) or a
    device link's name (tensile_tf/config/device_links.py)."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() in DEVICE_LINKS:
        return value.strip().lower()
    try:
        return parse_bytes(value, what=what)
    except ValueError:
        raise ValueError(f"{what}: {value!r} is neither bytes per second (e.g. 2GiB) nor a device link "
                         f"({', '.join(DEVICE_LINKS)})") from None
