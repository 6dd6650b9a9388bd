"""Training and evaluation: config and recipes, the DDP training engine, checkpoints, transfer."""
from ssog.train.checkpoint import check_state_dict, checkpoint_path, load_checkpoint, save_checkpoint
from ssog.train.config import TrainConfig, load_recipe, parse_override, recipe_variants, resolve_config
from ssog.train.engine import Trainer, train
from ssog.train.evaluation import evaluate_checkpoint
from ssog.train.metrics import evaluate
from ssog.train.transfer import freeze_backbone, init_from_checkpoint, load_weights, set_input_size

__all__ = [
    "TrainConfig", "load_recipe", "parse_override", "recipe_variants", "resolve_config",
    "Trainer", "train", "evaluate", "evaluate_checkpoint",
    "check_state_dict", "checkpoint_path", "load_checkpoint", "save_checkpoint",
    "freeze_backbone", "init_from_checkpoint", "load_weights", "set_input_size",
]
