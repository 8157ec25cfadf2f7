"""What every phase stands on: paths, parameter profiles, validation, timing, result tables,
the device we run on, the kernel build cache, the seed study's quotations and the phase packages'
lazy exports (``lazy``). Imports no phase."""
