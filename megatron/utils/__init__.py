"""Leaves any layer may use: rank-0 printing, small all-reduces, atomic file writes."""
