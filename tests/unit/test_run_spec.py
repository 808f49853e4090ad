"""The Config resolved once into a run's spec (pipeline/run_spec.py): the strategy's
own section, and a record of only what the run ran with."""

import yaml

from pipeline.config import Config
from pipeline.run_spec import resolve_run
from pipeline.strategies import NAMES


def test_a_run_records_no_other_strategys_section():
    cfg = Config()
    cfg.fsdp.mixed_precision = "bf16"
    for name in NAMES:
        spec = resolve_run(cfg, name)
        others = {n for n in NAMES if n != name}
        assert spec.options is getattr(cfg, name) and spec.name == name
        assert not {key.split(".")[0] for key in spec.params} & others
        kept = yaml.safe_load(spec.config_yaml)
        assert not set(kept) & others and name in kept
        assert kept["train"]["batch_size"] == spec.params["train.batch_size"] == 256
    assert resolve_run(cfg, "fsdp").params["fsdp.mixed_precision"] == "bf16"


def test_the_job_plan_shares_the_batch_only_for_a_data_parallel_strategy():
    cfg = Config()
    cfg.train.batch_size, cfg.train.grad_accum = 64, 2
    assert resolve_run(cfg, "ddp").job_plan(4, 640).per_rank == 8
    assert resolve_run(cfg, "pipeline_parallel").job_plan(2, 640).per_rank == 32
    assert resolve_run(cfg, "single").job_plan(1, 640).steps == 10
