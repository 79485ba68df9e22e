"""Offline preprocessing: change masks, change entities, ResNet-101 grid features (`python -m preprocess …`)."""
