"""Make the repository root importable (``import megatron.tokenizer``, ``tools``) in tests."""

import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.path.pardir))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
