"""What every phase stands on: paths, parameter profiles, validation, timing, result tables,
the device we run on, the kernel build cache and the seed study's quotations. Imports no phase."""
