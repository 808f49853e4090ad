"""A finished run, run again: one line says it is already trained and where its results are;
nothing trains, nothing it kept changes, exit 0."""

from support import kept_files, run

TRAIN = ("python", "-m", "pipeline.train", "ddp", "ddp.nproc=1", "train.epochs=1")


def test_a_finished_run_run_again_says_it_is_trained_and_trains_nothing(fetched_project):
    project = fetched_project()
    first = run(project, *TRAIN)
    assert "epoch 1/1" in first.stdout + first.stderr
    before = kept_files(project)
    again = run(project, *TRAIN)
    out = again.stdout + again.stderr
    assert "resuming" not in out and "epoch 1/1" not in out, out
    (line,) = [line for line in out.splitlines() if "already trained" in line]
    assert "checkpoints/ddp" in line and "results/ddp" in line, line
    assert kept_files(project) == before
