"""parallel-lab: one ResNet-18 on Fashion-MNIST under every PyTorch parallel strategy.

Commands (one module each, thin: arguments in, the work done by the subpackages):
    fetch.py, train.py, compare.py     the DVC stages (dvc.yaml)
    publish.py                         push locally kept runs to MLflow after an outage
    experiments.py                     one table across DVC experiments

    config/      params.yaml's schema         results.py   results/<strategy>/: EpochRow, RunSummary
    cli.py       the shared command line      files.py     atomic writes
    errors.py    UserError: one line, exit 2

    data/        fetching, the IDX format, device-resident data and batches
    training/    launcher (the elastic agent), worker, run_spec (the Config resolved once),
                 session (resume, epochs, results), loop, model, precision, optimizer,
                 checkpoints, memory, faults (hooks), devices, topology
    strategies/  one module per strategy (single, dp, balanced_dp, ddp, fsdp,
                 pipeline_parallel) and the helpers only strategies use
    tracking/    the MLflow run (MlflowTracker), the runs kept locally (kept_runs), system metrics,
                 provenance tags, the comparison run (comparison_run)
    reporting/   the compare stage's report (report.py: the answer, which strategy per
                 objective; the table, plots, pages) and the experiments table
"""
