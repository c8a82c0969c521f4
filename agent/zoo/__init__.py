"""Example models built by code: no downloads, byte-identical on every build.

The models and data of ``digits`` and the ``bert_mini`` variants are computed in
integer arithmetic, so they are byte-identical on every machine too: the example
policies pin their sha256.

``build_examples(out_dir)`` writes ``<out_dir>/<name>/model.onnx`` and
``<out_dir>/<name>/data.npz`` (arrays named after the model inputs, samples on
the first axis, plus ``labels`` where there are labels) and describes each in an
``ExampleModel``. By default it builds the two bundled examples, ``digits`` and
``bert_mini``, in a couple of seconds; the others are built only when named:

- ``digits``: MLP trained in fixed point on sklearn's digits, labelled validation data.
- ``bert_mini``: 4-layer BERT-like encoder, random weights, opset 12 export pattern
  that ONNX Runtime's built-in optimizer fuses (Attention, SkipLayerNormalization).
- ``bert_mini_opset17``: the same weights in the opset-17 pattern of a current
  torch export; only the transformers optimizer fuses its attention.
- ``light_*``: the onnx package's weightless conv nets (see ``light``).
"""

from __future__ import annotations

from metainfer.agent.zoo.build import DEFAULT_EXAMPLES, EXTRA_EXAMPLES, ExampleModel, build_examples
from metainfer.agent.zoo.light import list_light_models

__all__ = ["DEFAULT_EXAMPLES", "EXTRA_EXAMPLES", "ExampleModel", "build_examples", "list_light_models"]
