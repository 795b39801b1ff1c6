"""Leaves any layer may use: rank-0 printing, small all-reduces, atomic file writes, typed configs
from parsed flags. They import megatron/errors.py and nothing else of the project."""
