"""The names a policy or the CLI may give its quality metric (core.engine.quality_metrics computes them).

Apart because the API models and the CLI's flag parsing check these names without loading numpy.
"""

from __future__ import annotations

ENTRY_POINT_GROUP = "metainfer.quality_metrics"
PLUGIN_PREFIX = "plugin:"
BUILTIN = ("top1_accuracy", "cosine_similarity", "argmax_agreement", "relative_l2_similarity")
# What a policy or the CLI may ask for; a plugin's name is an entry point's name.
CHOICE_PATTERN = (
    r"^(auto|top1_accuracy|cosine_similarity|argmax_agreement|relative_l2_similarity|plugin:[A-Za-z0-9_.-]{1,64})$"
)
