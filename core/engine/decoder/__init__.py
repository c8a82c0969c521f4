"""Decoder language models: a graph that takes past key values and gives logits and the present ones.

A decoder is judged and served differently from a single forward: a prompt is prefilled, then tokens are decoded
one step at a time, each step feeding the cache the last one gave. ``signature`` finds the decoder in a graph
(both export shapes users bring: optimum/torch.onnx's attention ops and ONNX Runtime GenAI's
GroupQueryAttention), ``stepper`` runs prefill and decode steps over any ``Session`` with sequences of different
lengths batched into one step, ``sampling`` picks tokens (greedy, or seeded temperature/top-p), ``workload``
measures time to first token and time per output token, ``quality`` scores a variant's next-token agreement and
perplexity against FP32 on real text, and ``tokenizer`` reads the tokenizer and chat template a model carries.
"""
