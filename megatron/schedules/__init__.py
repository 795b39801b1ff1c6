"""One schedule language for learning rate, weight decay and dataset weights."""
