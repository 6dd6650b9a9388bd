"""Every model name the ssog families register with timm: ``name: (family, op, preset)``.

Registration (:func:`ssog.models._registry.register_family`) reads this table, so searching
the source for a model name finds it here. Generated from ``OPS x families x PRESETS`` by
``python -m ssog.models._registry``; tests/test_models.py checks that the two agree.
"""

MODEL_NAMES: dict[str, tuple[str, str, str]] = {
    "mha_vit_small_patch16_224": ("vit", "mha", "small_patch16_224"),
    "mha_vit_medium_patch16_224": ("vit", "mha", "medium_patch16_224"),
    "mha_vit_base_patch16_224": ("vit", "mha", "base_patch16_224"),
    "mha_vit_tiny_patch4_32": ("vit", "mha", "tiny_patch4_32"),
    "mha_vit_micro_patch1_8": ("vit", "mha", "micro_patch1_8"),
    "mha_vit_digits_patch2_8": ("vit", "mha", "digits_patch2_8"),
    "ssog_vit_small_patch16_224": ("vit", "ssog", "small_patch16_224"),
    "ssog_vit_medium_patch16_224": ("vit", "ssog", "medium_patch16_224"),
    "ssog_vit_base_patch16_224": ("vit", "ssog", "base_patch16_224"),
    "ssog_vit_tiny_patch4_32": ("vit", "ssog", "tiny_patch4_32"),
    "ssog_vit_micro_patch1_8": ("vit", "ssog", "micro_patch1_8"),
    "ssog_vit_digits_patch2_8": ("vit", "ssog", "digits_patch2_8"),
    "mha_loopvit_small_patch16_224": ("loopvit", "mha", "small_patch16_224"),
    "mha_loopvit_medium_patch16_224": ("loopvit", "mha", "medium_patch16_224"),
    "mha_loopvit_base_patch16_224": ("loopvit", "mha", "base_patch16_224"),
    "mha_loopvit_tiny_patch4_32": ("loopvit", "mha", "tiny_patch4_32"),
    "mha_loopvit_micro_patch1_8": ("loopvit", "mha", "micro_patch1_8"),
    "mha_loopvit_digits_patch2_8": ("loopvit", "mha", "digits_patch2_8"),
    "ssog_loopvit_small_patch16_224": ("loopvit", "ssog", "small_patch16_224"),
    "ssog_loopvit_medium_patch16_224": ("loopvit", "ssog", "medium_patch16_224"),
    "ssog_loopvit_base_patch16_224": ("loopvit", "ssog", "base_patch16_224"),
    "ssog_loopvit_tiny_patch4_32": ("loopvit", "ssog", "tiny_patch4_32"),
    "ssog_loopvit_micro_patch1_8": ("loopvit", "ssog", "micro_patch1_8"),
    "ssog_loopvit_digits_patch2_8": ("loopvit", "ssog", "digits_patch2_8"),
    "mha_odevit_small_patch16_224": ("odevit", "mha", "small_patch16_224"),
    "mha_odevit_medium_patch16_224": ("odevit", "mha", "medium_patch16_224"),
    "mha_odevit_base_patch16_224": ("odevit", "mha", "base_patch16_224"),
    "mha_odevit_tiny_patch4_32": ("odevit", "mha", "tiny_patch4_32"),
    "mha_odevit_micro_patch1_8": ("odevit", "mha", "micro_patch1_8"),
    "mha_odevit_digits_patch2_8": ("odevit", "mha", "digits_patch2_8"),
    "ssog_odevit_small_patch16_224": ("odevit", "ssog", "small_patch16_224"),
    "ssog_odevit_medium_patch16_224": ("odevit", "ssog", "medium_patch16_224"),
    "ssog_odevit_base_patch16_224": ("odevit", "ssog", "base_patch16_224"),
    "ssog_odevit_tiny_patch4_32": ("odevit", "ssog", "tiny_patch4_32"),
    "ssog_odevit_micro_patch1_8": ("odevit", "ssog", "micro_patch1_8"),
    "ssog_odevit_digits_patch2_8": ("odevit", "ssog", "digits_patch2_8"),
}
