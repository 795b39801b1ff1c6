"""The training run: loop, steps, evaluation, statistics, engine set-up, resume, run control."""
