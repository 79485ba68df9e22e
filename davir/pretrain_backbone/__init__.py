"""Pretrain the tiny ResNet backbone of the lightweight demo (`python -m davir.pretrain_backbone`)."""
