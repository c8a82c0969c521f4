"""Olive's side of the peer comparison as Olive reads it: the workflow (run config) of its search.

One job: turn an example model, its batch, the candidate budget K and
metainfer's search choices into the JSON config Olive's workflow runner takes
(bench/olive_search.py runs it). The config is Olive's ONNX quantization pass
and its session-parameter tuning pass, searched jointly for K samples, with a
latency objective and the same quality budget metainfer gets (its quality
metric is bench/olive_peer_user_script.py, scoring against the reference that
bench/olive_measure.py writes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from metainfer.agent.zoo.build import ExampleModel
from metainfer.core.engine.profile.fingerprint import detect_machine

USER_SCRIPT = Path(__file__).resolve().parent / "olive_peer_user_script.py"

MAX_DROP = 0.01

SEED = 0

CALIBRATION_SAMPLES = 64  # what metainfer's pipeline calibrates with (PipelineSettings.calibration_samples)

# Olive's latency metric: runs per evaluation, about what one metainfer trial takes at minimum (min_runs 20).
OLIVE_WARMUP, OLIVE_REPEAT = 3, 20


def thread_choices() -> list[int]:
    """The intra-op thread counts metainfer's space offers on this machine (core.engine.candidates.thread_choices)."""
    info = detect_machine()
    return sorted({1, max(1, info.physical_cores // 2), info.physical_cores, info.logical_cores})


def olive_workflow(
    example: ExampleModel, batch: int, budget: int, reference: Path, work: Path, threads: list[int]
) -> dict[str, Any]:
    """An Olive run config: its ONNX quantization and session-tuning passes, searched jointly for K samples.

    The quantization pass searches Olive's own default space (quant_mode,
    precision, per_channel, reduce_range, quant_preprocess, and for static:
    calibrate_method, quant_format, activation_type). The session tuning pass,
    whose default space is empty, gets metainfer's choices for optimisation
    level, intra-op threads and execution mode. One search sample is one
    candidate: a quantized model with one session setting, measured by the
    evaluator for p50 latency (objective) and quality (goal: drop <= 0.01).
    """

    def data_config(name: str, samples: int) -> dict[str, Any]:
        return {
            "name": name,
            "user_script": str(USER_SCRIPT),
            "load_dataset_config": {
                "type": "metainfer_npz_dataset",
                "params": {"data_path": str(example.data_path), "max_samples": samples},
            },
            "dataloader_config": {"batch_size": batch},
        }

    return {
        "input_model": {"type": "ONNXModel", "model_path": str(example.model_path)},
        "systems": {
            "local_system": {
                "type": "LocalSystem",
                "accelerators": [{"device": "cpu", "execution_providers": ["CPUExecutionProvider"]}],
            }
        },
        "data_configs": [
            data_config("calibration_data", CALIBRATION_SAMPLES),
            data_config("latency_data", batch),
            data_config("quality_data", example.samples),
        ],
        "evaluators": {
            "peer_evaluator": {
                "metrics": [
                    {
                        "name": "latency",
                        "type": "latency",
                        "data_config": "latency_data",
                        "sub_types": [
                            {
                                "name": "p50",
                                "priority": 1,
                                "metric_config": {"warmup_num": OLIVE_WARMUP, "repeat_test_num": OLIVE_REPEAT},
                            }
                        ],
                    },
                    {
                        "name": "quality",
                        "type": "custom",
                        "data_config": "quality_data",
                        "sub_types": [
                            {
                                "name": "quality",
                                "priority": 2,
                                "higher_is_better": True,
                                "goal": {"type": "max-degradation", "value": MAX_DROP},
                            }
                        ],
                        "user_config": {
                            "user_script": str(USER_SCRIPT),
                            "metric_func": "quality_metric",
                            "metric_func_kwargs": {"reference_path": str(reference)},
                        },
                    },
                ]
            }
        },
        "passes": {
            "quantization": {
                "type": "OnnxQuantization",
                "data_config": "calibration_data",
            },
            "session_params_tuning": {
                "type": "OrtSessionParamsTuning",
                "data_config": "latency_data",
                "opt_level_list": [99, 2, 1],
                "intra_thread_num_list": threads,
                "execution_mode_list": [0, 1],
            },
        },
        "search_strategy": {
            "execution_order": "joint",
            "sampler": "tpe",
            "sampler_config": {"max_samples": budget, "seed": SEED},
        },
        "evaluator": "peer_evaluator",
        "host": "local_system",
        "target": "local_system",
        "evaluate_input_model": True,
        "cache_dir": str(work / "cache"),
        "output_dir": str(work / "output"),
        "log_severity_level": 1,
    }
