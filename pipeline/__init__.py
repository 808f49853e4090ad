"""parallel-lab: one ResNet-18 on Fashion-MNIST under every PyTorch parallel strategy.

Commands (one module each, thin: arguments in, the work done by the subpackages):
    fetch.py, train.py, compare.py     the DVC stages (dvc.yaml)
    publish.py                         push locally kept runs to MLflow after an outage
    experiments.py                     one table across DVC experiments

    config/      params.yaml's schema         results.py   results/<strategy>/: EpochRow, RunSummary
    cli.py       the shared command line      files.py     atomic writes
    errors.py    UserError: one line, exit 2

    data/        fetching, the IDX format, device-resident data and batches
    launch/      the stage's processes: launcher (validate, the elastic agent, an exit
                 code), worker (one rank's life), topology, rendezvous, devices
    training/    a rank's run: session (assembled, resumed), trainer (fit, epoch, step,
                 evaluation), meter (seconds, load, memory per epoch)
    numerics/    what a step computes: build, precision, torch_compile, optimizer, graphs,
                 the measured speed defaults
    checkpoints/ a run's state on disk, when it is saved, what a resume must match
    recording/   what a run shows and keeps as it trains (live progress, results/, events)
    interrupts/  a stop voted across ranks; test-only fault hooks
    scaling/     the predict stage: a strategy at N devices, from one rank's real step
    strategies/  one module per strategy (single, dp, balanced_dp, ddp, fsdp,
                 pipeline_parallel) and the helpers only strategies use
    tracking/    the MLflow run: its record (mlflow_run), the stage's stream and publisher,
                 the push from disk (kept_runs), system metrics, provenance tags, the
                 comparison run (comparison_run)
    reporting/   the compare stage's report (report.py: the answer, which strategy per
                 objective; the table, plots, pages) and the experiments table
"""
