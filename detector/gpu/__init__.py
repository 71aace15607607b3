"""GPU readings through NVML: the adapter (``nvml``) and the nvidia-smi-shaped sampler."""
