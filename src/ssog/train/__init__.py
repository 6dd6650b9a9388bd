"""Training and evaluation: config and recipes, the DDP training engine, checkpoints, transfer."""
from ssog.train.api import train
from ssog.models.weights import check_state_dict
from ssog.train.checkpoint import checkpoint_path, load_checkpoint, save_checkpoint
from ssog.train.config import TrainConfig, resolve_config
from ssog.train.engine import Trainer
from ssog.train.evaluation import compare_checkpoints, evaluate_checkpoint
from ssog.train.metrics import evaluate
from ssog.train.recipes import load_recipe, parse_override, recipe_variants
from ssog.train.run_folder import RUN_FILES
from ssog.train.state import RESUME_CHANGES, RESUME_SETTINGS
from ssog.train.stopping import TrainingDiverged, TrainingInterrupted, TrainingOutOfMemory
from ssog.train.transfer import freeze_backbone, init_from_checkpoint, load_weights, set_input_size

__all__ = [
    "TrainConfig", "load_recipe", "parse_override", "recipe_variants", "resolve_config",
    "Trainer", "train", "evaluate", "evaluate_checkpoint", "compare_checkpoints",
    "TrainingDiverged", "TrainingInterrupted", "TrainingOutOfMemory", "RESUME_SETTINGS", "RESUME_CHANGES", "RUN_FILES",
    "check_state_dict", "checkpoint_path", "load_checkpoint", "save_checkpoint",
    "freeze_backbone", "init_from_checkpoint", "load_weights", "set_input_size",
]
