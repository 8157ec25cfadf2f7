"""The toy decode step shared by phases 1-3 (one definition, one seed): :mod:`.step` defines it,
:mod:`.graphs` captures it in CUDA graphs."""
