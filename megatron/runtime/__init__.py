"""The process of a run: distributed start-up, seeds, native ops, CPU all-reduce, exit, warnings."""
