"""A run's records and their writers: JSON lines, TensorBoard, Weights & Biases, MoE records."""
