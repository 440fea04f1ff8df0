"""`python build.py`: Kolibri-1 engines (ModelOpt quantization, the KV plan, target + drafter).

Public API:
- `build_engine(BuildOptions(target="gb10", ...)) -> (engine_dir, stats)`;
- `hadamard_rotation(seed, dim=128)` and `fold_qk_gains` (the rotated-INT4 KV fold);
- `dequant` (plain-torch FP8 / block-FP8 / NVFP4 -> float, the runtime's CPU path) and
  `quantize` (our NVFP4 and block-FP8 quantizers);
- `validate_manifest`, `BuildError`.
Recipes are data in the repository's `build/` folder (`recipes.py`).
"""

from .engine import BuildOptions, build_engine
from .errors import BuildError
from .hadamard import fold_qk_gains, hadamard_rotation
from .manifest import validate_manifest

__all__ = ["BuildError", "BuildOptions", "build_engine", "fold_qk_gains", "hadamard_rotation",
           "validate_manifest"]
