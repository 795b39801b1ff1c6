"""A run's configuration: flags and their checks, other projects' flags, the DeepSpeed config."""
