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

Note [Lanes of a device link]
A GPU has a copy engine per direction: the H200 moves 55 GB/s
host-to-device and 55 GB/s device-to-host at once, 92-94 GB/s together
(DESIGN.md). So a device link has two lanes (``run.link_lanes`` 2 by
default: swap-outs and swap-ins overlap), each at the link's bytes per
second above (its each-way rate), and a combined cap of ``both_ways`` times
that (92/55: the low end measured). The planner books each lane at
min(each way, combined / 2) (Note [A lane per direction] in
tensile_tf/scheduler/swap_scheduling.py), and the runtime's channel
throttles each lane the same way (tf_plugin/swap/swap_channel.h).
``run.link_lanes: 1`` keeps the seed's one lane for both directions; a
link given in bytes per second has one lane unless ``link_lanes: 2`` says
otherwise, and no combined cap.

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
    both_ways: float | None = None   # combined cap / each-way rate (Note [Lanes of a device link])

    def describe(self, bytes_per_s: float | None = None) -> str:
        """"h200-pcie5 (NVIDIA H200 ..., 33% of a step's peak per step): 190.9 MiB/s here"."""
        text = f"{self.name} ({self.device}, {self.share_of_peak_per_step:.0%} of a step's peak bytes per step)"
        return text if bytes_per_s is None else f"{text}: {bytes_per_s / 2**20:.1f} MiB/s here"


DEVICE_LINKS: dict[str, DeviceLink] = {link.name: link for link in (
    DeviceLink("h200-pcie5", "NVIDIA H200 over PCIe 5 x16, fp32 training", 0.33,
               "ResNet50 224x224 batch 64 fp32 (PyTorch): 35.4 ms steps, 5.6 GiB peak, 55 GB/s each way",
               92 / 55),
    DeviceLink("h200-pcie5-bf16", "NVIDIA H200 over PCIe 5 x16, bf16 training", 0.45,
               "BERT-base sequence 512 batch 16 bf16 (PyTorch): 41.3 ms steps, 4.7 GiB peak "
               "(ResNet50 bf16 batch 256: 50%)", 92 / 55),
)}


def device_link_bandwidth(link: DeviceLink, peaks_bytes: list[int], step_seconds: list[float]) -> int:
    """Bytes per second of ``link`` for jobs with these unplanned step peaks and times
    (Note [Links named for a device])."""
    if not peaks_bytes or len(peaks_bytes) != len(step_seconds) or sum(step_seconds) <= 0:
        raise ValueError(f"device link {link.name}: needs each job's step peak and a positive step time")
    return max(1, int(link.share_of_peak_per_step * sum(peaks_bytes) / sum(step_seconds)))


def link_lanes(device_link: str | None, lanes: int | None = None) -> int:
    """The swap link's lanes: ``lanes`` if given, else 2 for a device link and 1
    otherwise (Note [Lanes of a device link])."""
    if lanes is not None:
        if lanes not in (1, 2):
            raise ValueError(f"link_lanes must be 1 or 2, got {lanes!r}")
        return lanes
    return 2 if device_link is not None else 1


def combined_bandwidth(device_link: str | None, bandwidth_bytes_per_s: float | None, lanes: int) -> float | None:
    """The cap on both directions together, bytes per second: a device link's
    ``both_ways`` times its each-way rate, on two lanes; else None (no cap)."""
    if device_link is None or lanes != 2 or not bandwidth_bytes_per_s:
        return None
    ratio = DEVICE_LINKS[device_link].both_ways
    return None if ratio is None else ratio * float(bandwidth_bytes_per_s)


def describe_swap_link(bandwidth_bytes_per_s: float | None, device_link: str | None = None, lanes: int = 1) -> str:
    """What a run's or a benchmark row's link stands for, in words."""
    if device_link is not None:
        text = DEVICE_LINKS[device_link].describe(bandwidth_bytes_per_s)
    elif not bandwidth_bytes_per_s:
        return "unlimited (a memcpy: no device link)"
    else:
        text = f"{bandwidth_bytes_per_s / 2**20:.1f} MiB/s (given in bytes per second: no device named)"
    return text + ("; a lane per direction" if lanes == 2 else "")


def parse_swap_link(value: Any, what: str) -> int | str | None:
    """A swap link: None (unset: a run's link is 12 GiB/s), bytes per second ("2GiB", 2147483648) or a
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
