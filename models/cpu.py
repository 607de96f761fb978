"""What a layout choice needs to know about the CPU: how many fp32 values one vector register holds.

torch's CPU kernels for softmax and for reductions along the last axis vectorise along that axis; an axis shorter
than one register (GPA's m = log₂ 2048 = 11 landmarks against 16 fp32 lanes of AVX-512) runs in scalar tails.
Such tensors are laid out with the short axis second to last instead, where the kernels vectorise across the long
axis (measured where each caller makes the choice).
"""

from __future__ import annotations

import torch

#: fp32 lanes of one vector register, per CPU capability torch reports (`torch.backends.cpu.get_cpu_capability`),
#: for the capabilities the layouts were measured on (AVX2's 8 lanes would follow the same reasoning, unmeasured)
CPU_FP32_LANES = {"AVX512": 16}


def below_vector_width(size: int, device: torch.device) -> bool:
    """True on a CPU whose fp32 vector register holds more than `size` values (False off the CPU and on a CPU
    whose capability is not in `CPU_FP32_LANES`: keep the usual layout where nothing was measured)."""
    if device.type != "cpu":
        return False
    return size < CPU_FP32_LANES.get(torch.backends.cpu.get_cpu_capability(), 0)
