"""The repository's entry to the offline jobs (`python -m preprocess …`), as train.py is to training; the jobs are
davir.jobs and the installed command is `davir-preprocess`. Not part of the wheel."""
