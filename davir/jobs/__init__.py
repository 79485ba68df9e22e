"""Offline jobs over whole splits: change masks, change entities, grid features and their scores (`python -m
preprocess …`, `davir-preprocess`). Each module is one command: its parser, its run, its `main(argv)`."""
