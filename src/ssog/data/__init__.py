"""Data sources, augmentation levels and restart-safe loaders for training and evaluation."""
from ssog.data.builtin import ArrayDataset
from ssog.data.factory import build_datasets
from ssog.data.folder import evaluation_folder
from ssog.data.info import DATASETS, DatasetInfo, dataset_targets, stratified_split, training_subset
from ssog.data.loader import (
    EpochSampler, ShardSampler, StopSafeDataLoader, TransformedDataset, build_loader, sample_seed,
)
from ssog.data.transforms import AUGMENTATIONS, Augmentation, build_transform, get_augmentation

__all__ = [
    "DATASETS", "ArrayDataset", "DatasetInfo", "build_datasets", "dataset_targets", "stratified_split",
    "training_subset", "evaluation_folder",
    "EpochSampler", "ShardSampler", "StopSafeDataLoader", "TransformedDataset", "build_loader", "sample_seed",
    "AUGMENTATIONS", "Augmentation", "build_transform", "get_augmentation",
]
