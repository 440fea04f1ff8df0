#!/usr/bin/env python3
"""Build a Kolibri-1 engine: `python build.py --target gb10|h100|h200|cpu [options]`.

Thin entry point; the logic is `kolibri_trt.builder` and the recipes are data in `build/`.
`python build.py --help` lists the options; the engine path is printed last.
"""

import sys

from kolibri_trt.builder.cli import main

if __name__ == "__main__":
    sys.exit(main())
