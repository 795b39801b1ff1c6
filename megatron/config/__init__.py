"""A run's configuration: the parser, one module per flag group (its flags and their checks),
validate_args, other projects' flags, the DeepSpeed config."""
