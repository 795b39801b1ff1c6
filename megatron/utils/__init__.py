"""Leaves any layer may use: rank-0 printing, small all-reduces, atomic file writes, typed configs
from parsed flags, the entry points' fast process exit."""
