"""Stand-in for vllm/platforms: `current_platform` is the device vLLM detected.

Reports a CUDA device unless VLLM_STANDIN_NO_GPU=1, when it reports what vLLM reports on a
machine without an accelerator (UnspecifiedPlatform, whose device_type is empty).
"""

import enum
import os


class PlatformEnum(enum.Enum):
    CUDA = enum.auto()
    CPU = enum.auto()
    UNSPECIFIED = enum.auto()


class Platform:
    _enum: PlatformEnum
    device_name: str
    device_type: str
    device_control_env_var: str = "VLLM_DEVICE_CONTROL_ENV_VAR_PLACEHOLDER"

    def is_cuda(self) -> bool:
        return self._enum == PlatformEnum.CUDA

    def is_cpu(self) -> bool:
        return self._enum == PlatformEnum.CPU

    def is_unspecified(self) -> bool:
        return self._enum == PlatformEnum.UNSPECIFIED


class CudaPlatform(Platform):
    _enum = PlatformEnum.CUDA
    device_name = "cuda"
    device_type = "cuda"
    device_control_env_var = "CUDA_VISIBLE_DEVICES"


class UnspecifiedPlatform(Platform):
    _enum = PlatformEnum.UNSPECIFIED
    device_type = ""


current_platform = (
    UnspecifiedPlatform() if os.environ.get("VLLM_STANDIN_NO_GPU") else CudaPlatform()
)
